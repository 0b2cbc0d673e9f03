"""``probe_large``: first turns over other GPU counts' servers for jobs larger than a server.

With ``probe_slices`` a newcomer that finds no place gets its first turn (its first 100
mini-batches, the paper's early feedback) by joining a full time-slice group of its own GPU
count. A job larger than a server rarely has one: Algorithm 1 starts it only on free GPUs
that add up to it, no server goes idle while the groups of smaller counts hold them all,
and ``balance_sizes`` never hands servers to a count larger than a server. On ITP cluster04
(25x4) its 32-GPU jobs, 254 of 15,802, make most of gandiva's average wait for the first 100
mini-batches (docs/simulator.md, "Where cluster04's new jobs wait").

``probe_large`` time-slices such a newcomer over whole servers of other counts, as
suspend/resume time-slices any group: the first never-run job larger than a server that is
still queued takes the servers lent least recently, then with the fewest jobs, that add up to
it (each with every server a group of its spans, so that no group runs on half its GPUs:
a burst of such newcomers takes turns over different servers), every job running there is
suspended in place (bound to its GPUs and in host memory, as in any turn), and the servers
are held (``Ledger.hold``): no job joins them, no move lands there and no group there
rotates (``frozen``) until the turn is over (``probe_turn_ends``: its first 100
mini-batches, at least a quantum, at most 16). Then the newcomer is parked (checkpointed,
queued again with its progress) and the groups go on. Nothing moves: unlike
``gather_large``'s loans, a turn needs no room elsewhere for the servers' jobs. One turn at a
time, cluster-wide. A job that cannot be parked (not migratable, or not under the runtime)
keeps the servers until it ends, as such a job keeps its GPUs in any group.
"""

from __future__ import annotations

import math

from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.migration import park
from scheduler.policy.placement import host_ok
from scheduler.policy.state import GandivaState
from scheduler.policy.timeslice import probe_turn_ends
from scheduler.policy.types import Decision, GpuRef, JobView, Place, PolicyConfig, Suspend


def frozen(state: GandivaState) -> frozenset[str]:
    """The servers a first turn holds now (their groups do not rotate)."""
    return state.large_turn[2] if state.large_turn is not None else frozenset()


def large_turns(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    """End the first turn under way if it is over; then start the next one, if a never-run
    job larger than a server waits and servers can take it."""
    out: list[Decision] = []
    if state.large_turn is not None:
        out += _end_turn(ledger, state, config)
        if state.large_turn is not None:
            return out
    now = ledger.snapshot.now
    missed = state.large_turn_missed_at
    if missed is not None and now < missed + config.quantum_s:
        return out  # the last look found no servers: look again a quantum later
    job = _first_never_run(ledger, state)
    if job is None:
        return out
    names = _servers_for(ledger, state, job)
    gpus = tuple(sorted(g for n in names for g in _gpus_of(ledger, n)))[: job.gpus] if names else ()
    if not names or ledger.members(gpus) or not host_ok(ledger, job, gpus, config):
        state.large_turn_missed_at = now
        state.wake_at(now + config.quantum_s)
        return out
    state.large_turn_missed_at = None
    names = sorted({g.server for g in gpus})  # servers a unit adds beyond its GPUs are not held
    why = f"first turn of job {job.id} ({job.gpus} GPUs, larger than a server) over {', '.join(names)}"
    for other in sorted(ledger.running_on(g for n in names for g in _gpus_of(ledger, n))):
        ledger.set_state(other, "SUSPENDED")
        out.append(Suspend(other, reason=why))
    ledger.bind(job.id, gpus, "RUNNING")
    out.append(Place(job.id, gpus, reason=f"probe slice: {why}, their jobs suspended in place"))
    ledger.hold(names, 0)  # no job joins these servers until the turn is over
    state.large_turn = (job.id, gpus, frozenset(names))
    state.wake_at(now + config.quantum_s)
    return out


def _end_turn(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    """Park the newcomer once its first turn is over and give the servers back to their
    groups; nothing while the turn goes on."""
    assert state.large_turn is not None
    job_id, gpus, names = state.large_turn
    now = ledger.snapshot.now
    if (ledger.state.get(job_id) is None or ledger.placement.get(job_id) != gpus
            or any(n not in ledger.servers for n in names)):
        return _give_back(ledger, state, [])  # it finished, was killed or moved; a server left
    ledger.hold(names, 0)  # a fresh ledger (servers changed) has forgotten it
    view = ledger.jobs[job_id]
    if not (view.migratable and view.suspendable):
        return []  # it cannot be checkpointed: it keeps the servers until it ends
    st = ledger.state[job_id]
    if st == "RUNNING":
        until = probe_turn_ends(view, now, config.quantum_s)
        if until is not None:
            state.wake_at(until)
            return []
    if st not in ("RUNNING", "SUSPENDED") or job_id in ledger.changed:
        state.wake_at(now + config.quantum_s)
        return []
    parked = park(ledger, state, job_id, "first turn over servers of other GPU counts over: checkpointed, "
                                         "back in the queue (their groups go on)")
    return _give_back(ledger, state, [parked])


def _give_back(ledger: Ledger, state: GandivaState, out: list[Decision]) -> list[Decision]:
    """End the hold; rotation looks at the servers' groups in this very call."""
    names = frozen(state)
    state.large_turn = None
    for n in names:
        state.large_turn_lent[n] = ledger.snapshot.now
    ledger.release()
    if ledger.touched_groups is not None:
        ledger.touched_groups.update(ledger.placement[j] for n in names if n in ledger.servers
                                     for j in ledger.jobs_on[n])
    return out


def _first_never_run(ledger: Ledger, state: GandivaState) -> JobView | None:
    """The first queued job (queue order) larger than a server that has never run and can be
    parked after its turn, if any. The queues are read again only when one of them changed
    in length since a look found none (a newcomer or a park adds a job, a start takes one):
    a call costs nothing while the queue of such jobs is all jobs that have run."""
    top, total = ledger.max_server_gpus, ledger.num_gpus
    sizes = sorted(k for k in ledger.queued_by_size if top < k <= total)
    lengths = tuple((k, len(ledger.queued_by_size[k])) for k in sizes)
    if lengths == state.large_turn_none_in:
        return None
    best = None
    for size in sizes:
        for key in ledger.queued_by_size[size]:  # mostly jobs that ran and were parked
            view = ledger.jobs[key[-1]]
            if (not view.steps and not view.attained_service_s and view.migratable and view.suspendable
                    and ledger.state[view.id] == "QUEUED"):
                if best is None or key < best:
                    best = key
                break
    if best is None:
        state.large_turn_none_in = lengths
        return None
    state.large_turn_none_in = None
    return ledger.jobs[best[-1]]


def _servers_for(ledger: Ledger, state: GandivaState, job: JobView) -> list[str] | None:
    """Whole servers adding up to ``job``'s GPUs, those lent least recently and then those
    with the fewest jobs first; each with every server its groups span, and only where every
    job may be suspended now (under the runtime, not moving, in no packing trial or first
    turn, not decided this call)."""
    units: list[tuple[float, int, list[str]]] = []
    lent = state.large_turn_lent
    seen: set[str] = set()
    probing = set(state.probes)
    for name in sorted(ledger.servers):
        if name in seen or name in ledger.held or name in ledger.cordoned:
            continue
        jobs = set(ledger.jobs_on[name])
        names = {name}
        while True:  # the closure: every server the groups on these servers span
            more = {n for j in jobs for n in ledger.servers_of[j]} - names
            if not more:
                break
            names |= more
            for n in more:
                jobs |= ledger.jobs_on.get(n, set())
        seen |= names
        if any(n not in ledger.servers or n in ledger.held or n in ledger.cordoned for n in names):
            continue
        if any(ledger.state[j] not in ("RUNNING", "SUSPENDED") or not ledger.jobs[j].suspendable
               or j in state.trials or j in probing or j in ledger.changed for j in jobs):
            continue
        units.append((max(lent.get(n, -math.inf) for n in names), len(jobs), sorted(names)))
    units.sort()
    chosen: list[str] = []
    got = 0
    for _, _, unit in units:
        if got >= job.gpus:
            break
        chosen += unit
        got += sum(len(_gpus_of(ledger, n)) for n in unit)
    return sorted(chosen) if got >= job.gpus else None


def _gpus_of(ledger: Ledger, name: str) -> Placement:
    return tuple(GpuRef(name, i) for i in ledger.servers[name].registered_indices)
