"""Grow-shrink for opt-in jobs (brief section 2, primitive 4).

Grow: when GPUs have been free, with nothing queued or waiting, for ``grow_idle_s``,
an opt-in job running alone on one server grows to the largest power of two of GPUs
that its server has had free for ``grow_idle_s`` each (never beyond the server; a GPU
freed a moment ago is not yet idle, however long other servers' GPUs have been). Shrink: at once, back to the
job's own GPU count, when a job needs GPUs that are not free and the GPUs its shrink frees
give that job its place (``shrink_for``). A grown job that is no
longer grow-shrink (its runtime found that a grow changes its result) is shrunk back
at once, whatever else is going on.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.cluster import Ledger, Placement, arrival_key
from scheduler.policy.placement import Candidate
from scheduler.policy.state import GandivaState
from scheduler.policy.types import Decision, Grow, PolicyConfig, Shrink


def shrink_all(ledger: Ledger, reason: str, opted_out_only: bool = False) -> list[Decision]:
    """Return every grown job to its own GPU count (keeping its first GPUs); with
    `opted_out_only`, only those that may no longer grow (grow_shrink off)."""
    out: list[Decision] = []
    for job_id in sorted(ledger.grown):
        job, gpus = ledger.jobs[job_id], ledger.placement[job_id]
        if opted_out_only and job.grow_shrink:
            continue
        if ledger.state[job_id] == "RUNNING":
            kept = gpus[: job.requested_gpus]
            ledger.bind(job_id, kept, "RUNNING")
            out.append(Shrink(job_id, kept, reason=reason))
    return out


def shrink_for(ledger: Ledger, place: Callable[[], Candidate | None],
               reason: str) -> tuple[list[Decision], Candidate | None]:
    """Shrink the running grown jobs whose freed GPUs give a job its place: ``place()`` is
    asked with every one of them shrunk back to its own GPU count (keeping its first GPUs);
    only those whose freed GPUs are among the place found stay shrunk, the others
    are bound back as they were (none, where it finds no place). Returns the Shrinks and the
    place. Before, every grown job was shrunk for the first job that did not fit, also
    where that job then fit none of the freed GPUs (a 2-GPU newcomer and a job grown from 1
    to 2 GPUs): it was time-sliced elsewhere in the same round, the freed GPU stood idle,
    and the shrunk job could not grow back while that job waited."""
    before: dict[str, Placement] = {}
    for job_id in sorted(ledger.grown):
        if ledger.state[job_id] == "RUNNING":
            before[job_id] = ledger.placement[job_id]
    if not before:
        return [], None
    untouched = {j for j in before if j not in ledger.changed}
    for job_id, gpus in before.items():
        ledger.bind(job_id, gpus[: ledger.jobs[job_id].requested_gpus], "RUNNING")
    found = place()
    used = set(found.gpus) if found is not None else set()
    out: list[Decision] = []
    for job_id, gpus in before.items():
        kept = gpus[: ledger.jobs[job_id].requested_gpus]
        if used.intersection(gpus[len(kept):]):
            out.append(Shrink(job_id, kept, reason=reason))
            continue
        ledger.bind(job_id, gpus, "RUNNING")  # as it was: this round changed nothing of it
        if job_id in untouched:
            ledger.changed.discard(job_id)
    return out, found


def note_free_since(ledger: Ledger, state: GandivaState, now: float) -> None:
    """Keep, for the servers of the grow-shrink jobs, since when each of their GPUs has been
    free (the other servers' entries are dropped: no job there could grow). Every round, a
    round that reserves free GPUs for a waiting job too (a GPU taken and freed again then
    counts from its freeing)."""
    seen: dict = {}
    for job in ledger.jobs.values():
        if job.grow_shrink:
            for server in {g.server for g in ledger.placement.get(job.id, ())}:
                for gpu in ledger.free_gpus(server):
                    seen[gpu] = state.gpu_free_since.get(gpu, now)
    state.gpu_free_since = seen


def grow(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    now = ledger.snapshot.now
    if not config.enable_grow_shrink:
        state.idle_since = None
        state.gpu_free_since = {}
        return []
    note_free_since(ledger, state, now)
    waiting = any(ids for st, ids in ledger.by_state.items() if st != "RUNNING")
    has_free = ledger.total_free() > 0
    if waiting or not has_free:
        state.idle_since = None
        return []
    if state.idle_since is None:
        state.idle_since = now
    if now < state.idle_since + config.grow_idle_s:
        state.wake_at(state.idle_since + config.grow_idle_s)
        return []
    out: list[Decision] = []
    # In arrival order, not the snapshot's (which follows job ids in the simulator, the
    # database's rows live): where two jobs could take the same free GPUs, the elder grows.
    for job in sorted((j for j in ledger.jobs.values() if j.grow_shrink), key=arrival_key):
        if not job.suspendable:
            continue
        job_id, gpus = job.id, ledger.placement.get(job.id, ())
        servers = {g.server for g in gpus}
        if (len(servers) != 1 or job_id in ledger.changed
                or len(ledger.members(gpus)) > 1 or ledger.state[job_id] != "RUNNING"):
            continue
        free = ledger.free_gpus(next(iter(servers)))
        idle = [g for g in free if state.gpu_free_since.get(g, now) + config.grow_idle_s <= now]
        target = len(gpus)
        while target * 2 <= len(gpus) + len(idle):
            target *= 2
        if target * 2 <= len(gpus) + len(free):  # more once the newly freed have idled
            later = sorted(state.gpu_free_since.get(g, now) for g in free)
            state.wake_at(later[target * 2 - len(gpus) - 1] + config.grow_idle_s)
        free = idle
        if target > len(gpus):
            new = tuple(gpus) + tuple(free[: target - len(gpus)])
            ledger.bind(job_id, new, "RUNNING")
            since = max(state.gpu_free_since.get(g, now) for g in new[len(gpus):])
            out.append(Grow(job_id, new, reason=f"GPUs idle for {now - since:.0f}s"))
    return out
