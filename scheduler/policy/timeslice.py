"""Priority-weighted round-robin time-slicing inside each time-slice group.

A group is the set of jobs bound to exactly the same GPUs. One *unit* of the group
runs at a time: a single job, or a pair that packing decided to keep together (both
run at once). The running unit keeps the GPUs for ``quantum_s x weight`` (weight =
the highest priority in the unit, at least 1), then the unit that has waited longest
gets them. Slices end on a cluster-wide beat of ``quantum_s`` (see ``_slice_end``).
Suspend/resume happen at the jobs' next mini-batch boundary (live side).

Two rules of our own, on by default and each measured on and off (docs/policy.md):
- ``las_slices``: when a slice ends, the unit with the least attained service (GPU-seconds
  per GPU of its least-served job) runs next, the running unit included (it then keeps
  the GPUs, no switch); ties go to the running unit, then to the one waiting longest.
  Short and new jobs finish first, as under Tiresias, but inside a group and at once.
- ``slice_growth`` g > 0: a unit's slice is g x its attained service per GPU (at least
  ``quantum_s``, at most ``MAX_SLICE_QUANTA`` quanta), times its weight: a job that has
  run for days switches every half hour, not every minute, while new jobs keep
  minute-long slices (and a newcomer still starts at once: placement suspends the
  incumbent).

Two more rules against what ``las_slices`` alone does where jobs are not heavy-tailed
(issue 11, ITP cluster09: a long job starves inside a full group while newcomers keep
arriving with less service, and keeps its place, so later jobs queue behind the cap):
- ``fifo_after_s`` S > 0 (service buckets, as Tiresias' discretized LAS): a unit with at
  least S seconds of attained service per GPU is in the long bucket; the short bucket
  runs first (least attained service, as ``las_slices``), and inside the long bucket the
  unit submitted first runs, the running unit keeping the GPUs while it stays in its
  bucket. Long jobs then finish one after another, first come first served, instead of
  all progressing a little at a time and holding the group's places meanwhile.
- ``starve_factor`` K > 0 (a starvation limit, as Tiresias' ``dlas-gpu-K``): a waiting unit
  that has been suspended for at least K x its attained service per GPU (and at least a
  quantum) runs next, ahead of the order above, for one slice.

And one that tells the two kinds of trace apart from what the policy sees:
- ``gittins_slices``: the unit with the highest Gittins index of its attained service per
  GPU runs next instead of the least served (scheduler/policy/gittins.py: the index comes
  from the service with which the latest jobs left; least attained service where lengths
  are heavy-tailed, first come first served where they are not). Ties as ``las_slices``'s:
  the running unit, then the one waiting longest. Until enough jobs have left, and for
  units with more service than the departures tell about: least attained service (those
  after every unit with an index). The running unit keeps the GPUs until its service crosses the next
  point of the index's grid (where its index can change) or its slice ends.
- ``fifo_after_measured`` (the cheaper alternative): the service buckets of ``fifo_after_s``
  with the boundary taken from the same departures: the service at which the mean residual
  service of the jobs that ran that long is highest (below it a job that has run longer
  has more left, so least attained service is right; above it less, so first come first
  served is); no long bucket while it is still rising where the departures end.

And one for the makespan (off by default; measured in docs/simulator.md):
- ``eldest_runs``: the unit holding the eldest job of its GPU count (``Ledger.eldest_of``)
  runs ahead of every other, and keeps the GPUs until it ends (gandiva.py parks the other
  members of its group: ``migration.eldest_alone``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.gittins import GittinsTable
from scheduler.policy.packing import trial_of_co_run
from scheduler.policy.state import GandivaState
from scheduler.policy.types import Decision, JobView, PolicyConfig, Resume, Suspend


def group_units(ledger: Ledger, members: list[str], state: GandivaState) -> list[tuple[str, ...]]:
    """Split a group into units: everything running is one unit; kept pairs stay together."""
    running = tuple(sorted(m for m in members if ledger.state[m] == "RUNNING"))
    units: list[tuple[str, ...]] = [running] if running else []
    seen = set(running)
    jobs, states = ledger.jobs, ledger.state
    for _, m in sorted([(jobs[j].last_state_change_at, j) for j in members if states[j] == "SUSPENDED"]):
        if m in seen:
            continue
        partner = state.kept_pairs.get(m)
        if partner in members and partner not in seen and ledger.state[partner] == "SUSPENDED":
            units.append((m, partner))
            seen.update((m, partner))
        else:
            units.append((m,))
            seen.add(m)
    return units


# The longest slice slice_growth can give, in quanta.
MAX_SLICE_QUANTA = 32


def _attained(view: JobView, at: float) -> float:
    """Attained GPU-seconds at ``at``; for a running job also before its last report (it ran
    since ``at``: callers ask about the start of its current slice), so that a slice's
    length does not depend on when the job last reported."""
    if view.state != "RUNNING":
        return view.attained_service_s  # what it reported (attained_at's answer, quicker)
    if view.reported_at is not None and at < view.reported_at:
        return max(0.0, view.attained_service_s - len(view.placement) * (view.reported_at - at))
    return view.attained_at(at)


def _served(ledger: Ledger, unit: tuple[str, ...], at: float) -> float:
    """Attained service per GPU, in seconds, of the unit's least-served job at ``at``."""
    jobs, placement = ledger.jobs, ledger.placement
    best = math.inf
    for j in unit:
        view = jobs[j]
        served = _attained(view, at) / (len(placement.get(j, ())) or view.gpus)  # gpus >= 1: JobView checks
        best = min(best, served)
    return best


def _slice_of(ledger: Ledger, unit: tuple[str, ...], config: PolicyConfig, at: float) -> float:
    base = config.quantum_s
    if config.slice_growth > 0:
        grown = config.slice_growth * _served(ledger, unit, at)
        base = min(max(base, grown), MAX_SLICE_QUANTA * config.quantum_s)
    return base * max(ledger.jobs[j].weight for j in unit)


def _rank(ledger: Ledger, config: PolicyConfig, now: float, served: dict[tuple[str, ...], float],
          table: GittinsTable | None = None,
          fifo_s: float | None = None) -> Callable[[tuple[str, ...]], tuple[int, float]]:
    """The las_slices order as a key (lower runs first): (class, value), where class -1 is a
    starving unit (``starve_factor``; -2: the eldest of its GPU count, ``eldest_runs``), 0 the short bucket ordered by attained service (with
    ``table``, ``gittins_slices``: by its Gittins index, highest first, then the units past
    the table's end by attained service, or with ``gittins_tail_fifo`` in class 1 by
    submission), 1 the long bucket
    (service per GPU at least ``fifo_s``: ``fifo_after_s`` or ``fifo_after_measured``'s)
    ordered by submission (service counts no more there)."""
    jobs = ledger.jobs

    eldest = ledger.eldest_of if config.eldest_runs else None

    def rank(u: tuple[str, ...]) -> tuple[int, float]:
        if eldest is not None and any(eldest(jobs[j].requested_gpus) == j for j in u):
            return (-2, 0.0)  # eldest_runs: the eldest of its GPU count, ahead of all
        if config.starve_factor > 0 and ledger.state[u[0]] == "SUSPENDED":
            waited = now - min(jobs[j].last_state_change_at for j in u)
            if waited >= max(config.quantum_s, config.starve_factor * served[u]):
                return (-1, 0.0)
        if fifo_s is not None and fifo_s <= served[u]:
            return (1, min(jobs[j].submitted_at for j in u))
        if table is not None:
            index = table.at(served[u])
            if index is not None:
                return (0, -index)  # an index is > 0: ahead of every unit past the table's end
            if config.gittins_tail_fifo:  # past the end: first come first served, last
                return (1, min(jobs[j].submitted_at for j in u))
        return (0, served[u])

    return rank


def ranked_last(ledger: Ledger, state: GandivaState, config: PolicyConfig, candidates: list[str],
                now: float) -> str:
    """Of ``candidates`` (members of one time-slice group, each a unit of its own), the one
    the group's ``las_slices`` order (``_rank``: attained service, the Gittins index, the
    buckets) would run last; ties go to the most served, then the last id."""
    units: list[tuple[str, ...]] = [(j,) for j in candidates]
    served = {u: _served(ledger, u, now) for u in units}
    rank = _rank(ledger, config, now, served, *_order_inputs(state, config))
    return max(units, key=lambda u: (rank(u), served[u], u))[0]


def _order_inputs(state: GandivaState, config: PolicyConfig) -> tuple[GittinsTable | None, float | None]:
    """What ``_rank`` orders by besides service: the Gittins table (``gittins_slices``, once
    known) and the long bucket's boundary (``fifo_after_s``, or ``fifo_after_measured``'s)."""
    known = state.service.table
    fifo_s = config.fifo_after_s or None
    if config.fifo_after_measured:
        fifo_s = known.mrl_peak if known is not None else None
    return (known if config.gittins_slices else None), fifo_s


def _next_unit(ledger: Ledger, units: list[tuple[str, ...]], running: tuple[str, ...] = (),
               served: dict[tuple[str, ...], float] | None = None,
               rank: Callable[[tuple[str, ...]], tuple[int, float]] | None = None) -> tuple[str, ...]:
    """The unit to run next; ``served`` (las_slices): each unit's ``_served`` now; ``rank``:
    the order of ``_rank`` when a bucket or starvation rule is on."""
    def waited(u: tuple[str, ...]) -> tuple[float, int, tuple[float, int], tuple[str, ...]]:
        # The unit suspended longest goes next; higher priority breaks ties, then arrival
        # (jobs suspended together, placed in one call: ids as text put t-10 before t-2).
        jobs = [ledger.jobs[j] for j in u]
        return (min(v.last_state_change_at for v in jobs), -max(v.priority for v in jobs),
                min((v.submitted_at, v.arrival) for v in jobs), u)

    if rank is not None:
        ranks = {u: rank(u) for u in units}
        best = min(ranks.values())
        units = [u for u in units if ranks[u] == best]
        if len(units) == 1:
            return units[0]
        return min(units, key=lambda u: (u != running, waited(u)))
    if served is not None:
        # Least attained service; ties to the running unit, then to the one waiting longest.
        least = min(served[u] for u in units)
        units = [u for u in units if served[u] == least]
        if len(units) == 1:
            return units[0]
        return min(units, key=lambda u: (u != running, waited(u)))
    return min(units, key=waited)


def rotate(ledger: Ledger, state: GandivaState, config: PolicyConfig,
           look: set[Placement] | None = None) -> list[Decision]:
    """Suspend units whose slice is over and resume the next in each group.

    ``look``: the groups that changed since the last call (``Ledger.touched_groups``);
    with it only those and the groups whose slice is due are looked at, so a call costs
    time in proportion to what changed and what is due, not to the groups. None: every
    group is looked at (a fresh policy, and tests comparing both ways).
    """
    now = ledger.snapshot.now
    book = state.slices
    out: list[Decision] = []
    if look is None:
        visit = set(ledger.shared)
        visit.update(ledger.placement[j] for j in ledger.by_state.get("SUSPENDED", ()))
        visit.update(book.due)
        book.due.clear()
        book.heap.clear()
    else:
        visit = set(look)
        heap, due = book.heap, book.due
        while heap and heap[0][0] <= now:
            at, gpus = heapq.heappop(heap)
            if due.get(gpus) == at:
                del due[gpus]
                visit.add(gpus)
    # probe_large: the groups on servers held for a first turn wait until it is over (then
    # looked at again, as changed groups).
    frozen = state.large_turn[2] if state.large_turn is not None else None
    for gpus in sorted(visit):
        if frozen and any(g.server in frozen for g in gpus):
            book.due.pop(gpus, None)
            continue
        when = _look_at(ledger, state, config, gpus, now, out)
        if when is None:
            book.due.pop(gpus, None)
        elif book.due.get(gpus) != when:
            book.due[gpus] = when
            heapq.heappush(book.heap, (when, gpus))
    heap = book.heap
    while heap and book.due.get(heap[0][1]) != heap[0][0]:
        heapq.heappop(heap)  # stale: the group changed since
    if heap:
        state.wake_at(heap[0][0])
    return out


def _look_at(ledger: Ledger, state: GandivaState, config: PolicyConfig, gpus: Placement, now: float,
             out: list[Decision]) -> float | None:
    """Rotate the group on ``gpus`` if its slice is over; when to look at it next (None:
    not until it changes)."""
    members = ledger.members(gpus)
    kept = state.slices.kept
    if not members or (len(members) == 1 and ledger.state[members[0]] != "SUSPENDED"):
        kept.pop(gpus, None)
        return None
    # One pass over the members (a group may hold many): what the checks below ask.
    states, trials, changed = ledger.state, state.trials, ledger.changed
    running_ids: list[str] = []
    migrating = in_trial = was_changed = False
    for m in members:
        st = states[m]
        if st == "RUNNING":
            running_ids.append(m)
        elif st == "MIGRATING":
            migrating = True
        in_trial = in_trial or m in trials
        was_changed = was_changed or m in changed
    if migrating:
        return None
    if ledger.moving_onto(gpus):
        # A job moving onto (or off) these GPUs takes them: the group waits for the move
        # and is looked at each beat (a failed move leaves it without a change it sees).
        return _slice_end(now + config.quantum_s, config)
    if in_trial:
        return None  # the trial's verdict comes first (judge_trials wakes the policy)
    if was_changed:
        # Changed in this very call: its slice starts now.
        kept.pop(gpus, None)
        return _slice_end(now + config.quantum_s, config)
    if len(running_ids) > 1 and not (len(running_ids) == 2
                                     and state.kept_pairs.get(running_ids[0]) == running_ids[1]):
        # Jobs running together that no trial judged (their pack is no kept pair): before,
        # read as a kept pack, never rotated or measured. A change is kept only when the
        # measured rate says it helped: a trial of them starts, else they take turns. (After
        # the check above: a job this call changed gets no second decision.)
        if trial_of_co_run(ledger, state, config, gpus, running_ids):
            return None
        if not _part(ledger, gpus, running_ids, out):
            return None  # more than one cannot be stopped
        kept.pop(gpus, None)
        return _slice_end(now + config.quantum_s, config)  # the others' turns after a quantum
    if len(running_ids) == len(members):
        return None  # nobody waits: a kept pack, or a lone job
    if any(not ledger.jobs[m].suspendable for m in running_ids):
        return None  # it cannot be stopped: the others wait for it to end
    started = now
    if running_ids:
        # Cheap test first: most groups are in the middle of a slice.
        started = max(ledger.jobs[j].last_state_change_at for j in running_ids)
        ends = _slice_end(started + _slice_of(ledger, tuple(running_ids), config, started), config)
        if now < ends:
            return ends
        # A unit that kept the GPUs (las_slices) is in a slice of its own until then.
        unit, until = kept.get(gpus, ((), 0.0))
        if now < until and unit == tuple(sorted(running_ids)):
            return until
    units = group_units(ledger, members, state)
    # The running unit, if any, comes first; the others wait.
    running = units[0] if running_ids else ()
    waiting = units[1:] if running_ids else units
    if not waiting:
        return None
    # Under las_slices the running unit competes too (and keeps the GPUs if it wins).
    rank = None
    if config.las_slices:
        served = {u: _served(ledger, u, now) for u in units}
        table, fifo_s = _order_inputs(state, config)
        if fifo_s is not None or config.starve_factor > 0 or table is not None or config.eldest_runs:
            rank = _rank(ledger, config, now, served, table, fifo_s)
        nxt = _next_unit(ledger, units, running, served, rank)
    else:
        nxt = _next_unit(ledger, waiting)
    if nxt == running:
        # It still has the least attained service: it keeps the GPUs until the first beat
        # after it no longer has (its service per GPU grows one second a second; the
        # waiting units' stands still), or the end of another slice if that comes first.
        if rank is not None:
            crossing = _handover(ledger, config, now, served, running, waiting, rank, table, fifo_s)
        else:
            least = min(served[u] for u in waiting)
            crossing = now + max(0.0, least - served[running])
        until = _slice_end(now + _slice_of(ledger, running, config, now), config)
        if crossing < until:
            until = min(until, (math.floor(crossing / config.quantum_s) + 1) * config.quantum_s)
        kept[gpus] = (running, until)
        return until
    kept.pop(gpus, None)
    for j in running:
        ledger.set_state(j, "SUSPENDED")
        out.append(Suspend(j, reason=f"time slice of {now - started:.0f}s over"))
    return _resume_unit(ledger, nxt, gpus, config, out)


def _part(ledger: Ledger, gpus: Placement, running: list[str], out: list[Decision]) -> bool:
    """Suspend all but one of ``running`` (a co-run no trial judged), which then take turns as
    the group's other members: the one not under the runtime (it cannot be suspended), else
    the one that ran there first, keeps the GPUs one more quantum. False (nothing done)
    where more than one cannot be suspended."""
    if sum(not ledger.jobs[j].suspendable for j in running) > 1:
        return False
    stays = sorted(running, key=lambda j: (ledger.jobs[j].suspendable, ledger.jobs[j].last_state_change_at, j))
    for j in stays[1:]:
        ledger.set_state(j, "SUSPENDED")
        out.append(Suspend(j, reason=f"ran beside {stays[0]} on {_where(gpus)} with no packing trial "
                                     "(not kept by a measured gain): they take turns"))
    return True


def _where(gpus: Placement) -> str:
    return ", ".join(f"{g.server}/{g.index}" for g in gpus)


def _handover(ledger: Ledger, config: PolicyConfig, now: float, served: dict[tuple[str, ...], float],
              running: tuple[str, ...], waiting: list[tuple[str, ...]],
              rank: Callable[[tuple[str, ...]], tuple[int, float]],
              table: GittinsTable | None = None, fifo_s: float | None = None) -> float:
    """When a running unit that won under ``_rank`` stops winning if nothing else changes
    (inf: not before its slice ends): the first waiting unit to starve, the running unit's
    service passing the least-served short-bucket unit's (with ``table``: its service
    reaching the next grid point, where its index may change), or (in the short bucket, with
    a long-bucket unit waiting) its own move into the long bucket."""
    when = math.inf
    if rank(running)[0] == -2:
        return when  # eldest_runs: it keeps the GPUs until it ends
    if config.starve_factor > 0:
        for u in waiting:
            since = min(ledger.jobs[j].last_state_change_at for j in u)
            when = min(when, since + max(config.quantum_s, config.starve_factor * served[u]))
    ranks = [rank(u) for u in waiting]
    short = [v for c, v in ranks if c == 0]
    mine = served[running]
    if fifo_s is None or mine < fifo_s:  # it is in the short bucket
        if short:
            if table is not None and table.at(mine) is not None:
                passed = table.next_change(mine)  # where its index may change
            else:
                passed = min(short)  # least attained service (past the table's end too)
            when = min(when, now + max(0.0, passed - mine))
        if fifo_s is not None and len(short) < len(ranks):
            when = min(when, now + max(0.0, fifo_s - mine))
    return max(now, when)


def _resume_unit(ledger: Ledger, unit: tuple[str, ...], gpus: Placement,
                 config: PolicyConfig, out: list[Decision]) -> float:
    """Resume ``unit``; when its slice ends."""
    for j in unit:
        ledger.set_state(j, "RUNNING")
        out.append(Resume(j, gpus, reason="its turn in the time-slice group"))
    now = ledger.snapshot.now
    return _slice_end(now + _slice_of(ledger, unit, config, now), config)


def _slice_end(ends: float, config: PolicyConfig) -> float:
    """The beat (a multiple of quantum_s) at which a slice ending at ``ends`` is switched.

    Slices end on a cluster-wide beat so that all groups switch together: one round of
    commands per beat instead of one per group. Only a job's first slice is stretched
    (by less than a quantum); ``slice_slack_s`` keeps a slice that ends just after a
    beat from waiting for the next one.
    """
    return math.ceil((ends - config.slice_slack_s) / config.quantum_s) * config.quantum_s


# probe_slices: a newcomer let into a full time-slice group runs until its first this many
# mini-batches (the early feedback of the paper's section 2) and at least one quantum.
PROBE_STEPS = 100
# ... or this many quanta of service.
PROBE_MAX_QUANTA = 16


def probe_turn_ends(job: JobView, now: float, quantum: float) -> float | None:
    """When to look again at a probing newcomer's first turn (None: it is over). A turn
    is at least one quantum of service per GPU and lasts until the job has reported its
    first PROBE_STEPS mini-batches, or PROBE_MAX_QUANTA quanta have passed (a slow job
    leaves with the mini-batches it has). The next look is when its measured rate says
    they are due, and at most one a quantum (a job still starting, with no rate yet, is
    looked at every quantum)."""
    gpus = len(job.placement) or job.gpus
    served = job.attained_at(now) / gpus
    if served < quantum - 1e-9:
        return now + quantum - served
    # Its steps as last reported (not extrapolated: live, a running job's reported_at is
    # when it started running, and its steps are newer than that).
    if job.steps >= PROBE_STEPS or served >= PROBE_MAX_QUANTA * quantum - 1e-9:
        return None
    # At most one look a quantum: the reported steps may be older than the rate says
    # they are due (a report comes when it comes).
    due = (PROBE_STEPS - job.steps) / job.rate if job.rate else quantum
    return now + min(max(due, quantum), PROBE_MAX_QUANTA * quantum - served)
