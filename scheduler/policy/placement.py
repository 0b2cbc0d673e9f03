"""Reactive placement: Gandiva's Algorithm 1 as an ordered list of named candidate filters.

Each filter takes the ledger, the job and the config and returns the GPUs it would
use, or None to pass the job on to the next filter. The order is the paper's:

1. ``affinity``       servers whose affinity equals the job's GPU count and that have
                      enough free GPUs, least loaded first;
2. ``unallocated``    servers with no jobs at all: one that holds the job (the largest
                      first), several only for a job larger than every server;
3. ``relaxed``        any server with enough free GPUs, ignoring affinity (best fit;
                      the paper accepts this fragmentation, migration repairs it). A
                      job that fits one server is never spread over several: spread, it
                      runs at a fraction of its rate (Gavel's V100 table: median 0.42x,
                      0.1-0.4x for LM, Transformer, ResNet-18), so its GPUs would do
                      less than half the work; it time-shares or waits instead, and the
                      ``make_room`` migration pass empties a server for it. Only a job
                      larger than every server spreads, over the fewest servers;
4. ``oversubscribe``  join the smallest time-slice group of the same size on a
                      same-affinity server (time-slicing);
5. otherwise the caller queues the job.

Filters 1-3 also serve the migration and baseline code, which need "free GPUs only".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from scheduler.policy.cluster import Ledger, Placement, host_need
from scheduler.policy.types import JobView, PolicyConfig

Filter = Callable[[Ledger, JobView, PolicyConfig], "Placement | None"]
# (filter list id, GPU count) -> (ledger version, host memory of the job that found no place).
Misses = dict[tuple[int, int], tuple[int, float]]


@dataclass(frozen=True)
class Candidate:
    """A filter's answer: where, which filter chose it, whether it time-shares."""

    gpus: Placement
    filter: str
    oversubscribed: bool = False


def host_ok(ledger: Ledger, job: JobView | None, gpus: Placement, config: PolicyConfig | None,
            planned: Mapping[str, float] | None = None) -> bool:
    """``job``'s host memory fits where ``gpus`` are (``Ledger.host_fits``), beside what
    moves already planned send there (``planned``: bytes per server); True without a job."""
    if job is None or config is None or not ledger.host_limit:
        return True
    return ledger.host_fits(job, gpus, config.host_memory_use, config.job_host_memory_bytes, planned)


def _single_server(ledger: Ledger, size: int, names: Iterable[str], job: JobView | None = None,
                   config: PolicyConfig | None = None) -> Placement | None:
    for name in names:
        free = ledger.free_gpus(name)
        if len(free) >= size and host_ok(ledger, job, tuple(free[:size]), config):
            return tuple(free[:size])
    return None


def _least_loaded(ledger: Ledger, names: list[str]) -> list[str]:
    # Least loaded first; among equals the fuller server, to keep whole servers free.
    return sorted(names, key=lambda n: (ledger.height(n), ledger.num_free(n), n))


def affinity_filter(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    names = [
        n for n in ledger.servers_with_free(job.gpus)
        if job.gpus in ledger.sizes[n] and ledger.affinity(n) == job.gpus
    ]
    return _single_server(ledger, job.gpus, _least_loaded(ledger, names), job, config)


def unallocated_filter(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    idle = sorted(ledger.idle_servers, key=lambda n: (-ledger.servers[n].num_gpus, n))
    chosen: list = []
    for name in idle:
        if len(chosen) >= job.gpus:
            break
        chosen.extend(ledger.free_gpus(name)[: job.gpus - len(chosen)])
    return tuple(chosen) if len(chosen) == job.gpus else None


def idle_server_filter(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Algorithm 1's ``unallocated`` step: an idle server that holds the job, the largest first
    (``unallocated_filter``'s order). A job that fits one server is not spread over several
    small idle ones (a 3-GPU job over idle servers of 2 and 1 GPUs, while a 7-GPU server had 4
    free: it ran at the spread factor, 0.42x), as ``relaxed`` never spreads it: it goes on to
    ``relaxed`` instead. Only a job larger than every server takes several."""
    if job.gpus > ledger.max_server_gpus:
        return unallocated_filter(ledger, job, config)
    fits = [n for n in ledger.idle_servers if ledger.servers[n].num_gpus >= job.gpus]
    if not fits:
        return None
    name = min(fits, key=lambda n: (-ledger.servers[n].num_gpus, n))
    return tuple(ledger.free_gpus(name)[: job.gpus])


def relaxed_filter(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Any free GPUs on one server (best fit); only a job larger than a server spreads."""
    if job.gpus <= ledger.max_server_gpus:
        return best_fit(ledger, job.gpus, job, config)
    return any_free_filter(ledger, job, config)


def best_fit(ledger: Ledger, size: int, job: JobView | None = None,
             config: PolicyConfig | None = None) -> Placement | None:
    """Free GPUs on the one server with the fewest free GPUs that still hold ``size``
    (and, given the job, its host memory)."""
    return _single_server(ledger, size, ledger.servers_with_free(size), job, config)


def any_free_filter(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Any free GPUs: one server if one has room, else spread over the servers with most free.

    What a locality-unaware allocator does; the exclusive baselines use it.
    """
    if ledger.total_free() < job.gpus:
        return None
    one = best_fit(ledger, job.gpus, job, config)
    if one is not None:
        return one
    with_free = [n for n in ledger.servers if ledger.num_free(n) > 0]
    chosen: list = []
    for name in sorted(with_free, key=lambda n: (-ledger.num_free(n), n)):
        chosen.extend(ledger.free_gpus(name)[: job.gpus - len(chosen)])
        if len(chosen) == job.gpus:
            break
    return tuple(chosen) if host_ok(ledger, job, tuple(chosen), config) else None


def takes_turns(ledger: Ledger, gpus: Placement) -> bool:
    """The group on ``gpus`` can take one more job in turns: none of its members is
    uncontrollable (such a job cannot take turns: it keeps its GPUs alone), and no job is
    moving off or onto its GPUs (``Ledger.moving_onto``)."""
    return not (ledger.moving_onto(gpus) or any(not ledger.jobs[m].suspendable for m in ledger.members(gpus)))


def oversubscribe_filter(ledger: Ledger, job: JobView, config: PolicyConfig,
                         leave: Placement | None = None) -> Placement | None:
    """The smallest same-size time-slice group on same-affinity servers that can take one
    more job: fewest members, then the lowest server height, then by GPUs; never ``leave``."""
    best: tuple | None = None
    cap = config.max_jobs_per_gpu
    groups, servers = ledger._groups, ledger.servers
    # eldest_runs: the eldest job of this GPU count keeps its group to itself.
    eldest = ledger.eldest_of(job.gpus) if config.eldest_runs else None
    held_by = ledger.placement.get(eldest) if eldest is not None else None
    for gpus in ledger.groups_by_size.get(job.gpus, ()):
        if gpus == held_by or gpus == leave:
            continue
        # A group that would not beat the best so far is passed over before its members,
        # affinity and memory are read (the answer is the same, at a fraction of the cost).
        count = len(groups.get(gpus, ()))
        if count >= cap or (best is not None and count > best[0]):
            continue
        names = {g.server for g in gpus}
        if any(n not in servers for n in names):
            continue
        key = (count, max(ledger.height(n) for n in names), gpus)
        if best is not None and key >= best:
            continue
        if any(ledger.affinity(n) != job.gpus for n in names):
            continue
        if not takes_turns(ledger, gpus):
            continue
        if not host_ok(ledger, job, gpus, config):
            continue  # its process would not fit beside the group's in the server's memory
        best = key
    return best[2] if best else None


def draining_group(ledger: Ledger, size: int) -> Placement | None:
    """The time-slice group of ``size``-GPU jobs closest to draining: the fewest members,
    then by GPUs (``large_block_one_group`` keeps newcomers out of it alone)."""
    groups = ledger._groups
    return min(ledger.groups_by_size.get(size, ()), key=lambda g: (len(groups.get(g, ())), g), default=None)


def oversubscribe_but_draining(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """``oversubscribe``, but never into the group of the job's GPU count closest to draining."""
    return oversubscribe_filter(ledger, job, config, leave=draining_group(ledger, job.gpus))


FREE_FILTERS: list[tuple[str, Filter]] = [
    ("affinity", affinity_filter),
    ("unallocated", idle_server_filter),
    ("relaxed", relaxed_filter),
]
ALGORITHM_1: list[tuple[str, Filter]] = [*FREE_FILTERS, ("oversubscribe", oversubscribe_filter)]
OVERSUBSCRIBE_ONLY: list[tuple[str, Filter]] = [("oversubscribe", oversubscribe_filter)]
# large_block_one_group: a job held by the block may join a group, but not the one left to drain.
OVERSUBSCRIBE_NOT_DRAINING: list[tuple[str, Filter]] = [("oversubscribe", oversubscribe_but_draining)]


def find_placement(
    ledger: Ledger,
    job: JobView,
    config: PolicyConfig,
    filters: list[tuple[str, Filter]] = ALGORITHM_1,
    misses: Misses | None = None,
) -> Candidate | None:
    """The first filter's answer, in order; None means: queue the job.

    ``misses`` remembers (filter list, GPU count) pairs that found nothing at a ledger
    version: the filters look at nothing but the GPU count and the ledger, so a long
    queue costs one search per size until something changes.
    """
    need = (host_need(job) or config.job_host_memory_bytes) if ledger.host_limit else 0
    if misses is not None and missed(ledger, misses, filters, job.gpus, need):
        return None
    for name, fn in filters:
        gpus = fn(ledger, job, config)
        if gpus is not None:
            return Candidate(gpus, name, oversubscribed=name == "oversubscribe")
    if misses is not None:
        misses[(id(filters), job.gpus)] = (ledger.version, need)
    return None


def missed(ledger: Ledger, misses: Misses, filters: list[tuple[str, Filter]], size: int,
           need: float | None = None) -> bool:
    """``find_placement`` with ``filters`` found no place for ``size`` GPUs at this ledger
    version, for a job of ``need`` bytes of host memory or less (so a walk of the queue may
    skip every job of that size). ``need`` None: any job of that size; where host memory
    is checked a job needing less than the one that missed might fit, and is passed over
    only until the ledger changes."""
    entry = misses.get((id(filters), size))
    return entry is not None and entry[0] == ledger.version and (need is None or need >= entry[1])


def queue_reason(ledger: Ledger, job: JobView, config: PolicyConfig | None = None) -> str:
    """Why a job found no place, in words a user understands."""
    total = ledger.num_gpus
    if job.gpus > total:
        return f"needs {job.gpus} GPUs, the cluster's up servers have {total}"
    free = ledger.total_free()
    where = ""
    if free >= job.gpus and job.gpus <= ledger.max_server_gpus:
        # Free GPUs add up, but no server has enough: spreading would slow the job down.
        where = f" but no server has {job.gpus} free (a job that fits one server is not spread)"
    why = (f"needs {job.gpus} GPUs, {free} free{where}; no time-slice group of {job.gpus}-GPU jobs "
           f"with room on a same-affinity server")
    if config is not None and ledger.host_limit:
        need = host_need(job) or config.job_host_memory_bytes
        assumed, use = config.job_host_memory_bytes, config.host_memory_use
        full = sorted(n for n, limit in ledger.host_limit.items() if ledger.jobs_on[n]
                      and ledger.host_used(n, assumed) + need > limit * use)
        if full:
            gib = 1 << 30
            first = full[0]
            shown = ", ".join(full[:3]) + (f" and {len(full) - 3} more" if len(full) > 3 else "")
            why += (f"; the host memory of {shown} is full: on {first} its jobs, running and suspended, "
                    f"hold {ledger.host_used(first, assumed) / gib:.1f} GiB of the "
                    f"{ledger.host_limit[first] * use / gib:.1f} GiB they may use ({use:.0%} of "
                    f"{ledger.host_limit[first] / gib:.1f} GiB), and this job needs {need / gib:.1f} GiB")
    return why
