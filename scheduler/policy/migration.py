"""Migration: lower the height, bring spread-out jobs together, defragment in the background.

Three passes, each only when the move is expected to pay off:

1. ``lower_height``: a job waiting in a time-slice group moves to free GPUs (one
   server, or whole idle servers for jobs larger than a server; with ``lower_spread``
   such a job takes any free GPUs that add up to it). It would otherwise
   wait; a move costs about a second. With ``lower_kept_pairs`` (off by default) a
   suspended member of a kept pair moves too, and the pair ends; without it a kept pair
   waits for its turn while GPUs stand idle (under ``fifo_after_s`` on Philly 6c71a0, 70
   of 100 GPUs idle beside 100 such jobs for hundreds of hours). A *running* pack is not
   split onto free GPUs: that was tried and measured worse on the Philly traces (JCT
   0.65x -> 0.82x yarn-cs on 0e4a51, the packs re-formed and paid new trials).
2. ``consolidate``: a running job spread over more servers than it needs moves onto
   the fewest servers with free GPUs, removing the cross-server slowdown.
3. ``make_room``: the first queued job (in queue order) that fits one server finds no
   server with room although the free GPUs add up to it: empty the non-idle server
   with the most free GPUs by moving its jobs onto servers at least as full (each must fit
   without time-sharing); the job is placed on it in the next round. Reactive
   placement never spreads such a job, so without this it would wait for a departure.
4. ``defragment`` (every ``defrag_interval_s``, only while some job waits or is
   spread, i.e. while a freed server would be used): take the non-idle server with
   the most free GPUs (at least ``defrag_free_gpus``) and move all its jobs onto
   fuller non-idle servers, if every one of them fits without time-sharing.
5. ``balance_sizes`` (``PolicyConfig.balance_sizes``, on by default; at the first call at least
   ``defrag_interval_s`` after its last look):
   Algorithm 1 gives each server to one GPU count (affinity), so each GPU count
   time-shares only its own servers, however crowded they are. When the GPU count
   whose jobs are most crowded (jobs per same-size GPU set) has jobs waiting, the
   server of a less crowded GPU count is handed over: its jobs join same-size
   time-slice groups on other servers (the migrated job runs first there, as a
   newcomer does), if afterwards that GPU count is still less crowded than the
   crowded one with the server added; in the same call the crowded count's queued
   jobs, then its suspended ones from the fullest groups, take the freed server. Jobs
   larger than a server are counted too and can give (never take): their group moves
   into other groups of its size and hands over every server it spans (else the
   servers the rule frees drift to them, whose groups never drain).
6. ``gather_large`` (``PolicyConfig.gather_large``, off by default; its own look at the same
   pace as ``balance_sizes``): jobs larger than a server start only on idle servers, and
   where time-slice groups hold every server none goes idle. When such a GPU count has jobs
   waiting and is the most crowded of those counts, servers are *held* for it
   (``Ledger.hold``: no filter sees their free GPUs, and no group there takes a job of
   another count): idle ones and those of less crowded counts, the fewest jobs first,
   each only if its jobs find room in same-size groups elsewhere and its count stays less
   crowded than the one it helps. Their jobs move off, at most the round's budget a call;
   once none is left, the count's first queued job (else a suspended one) starts there and
   the hold ends (the servers now have that count's affinity, so its next jobs join the
   group). A gathering not done within an hour (``GATHER_MAX_S``) is given up. With
   ``probe_slices`` on too the servers are only lent: the first never-run job larger than a
   server gets them for its first turn, is parked, and each goes back to the count it was
   taken from (no crowding test: nothing is given for good).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterator

from scheduler.policy.cluster import Ledger, Placement, QueueKey, arrival_key, host_need
from scheduler.policy.packing import end_trials_of
from scheduler.policy.placement import (
    affinity_filter,
    any_free_filter,
    best_fit,
    host_ok,
    unallocated_filter,
)
from scheduler.policy.state import GandivaState, Gathering
from scheduler.policy.timeslice import probe_turn_ends
from scheduler.policy.types import Decision, JobView, Migrate, Park, Place, PolicyConfig, Suspend

# How the reasons of balance_sizes' hand-over decisions begin (its parks, moves and the
# placements onto the servers it frees): the live engine holds them back while a park is
# still in flight (scheduler/engine/live.py).
HAND_OVER = "hand "


def _servers_needed(ledger: Ledger, job: JobView) -> int:
    return -(-job.gpus // ledger.max_server_gpus)


def _compact_target(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Free GPUs on as few servers as the job needs: affinity, then idle, then best fit."""
    for fn in (affinity_filter, unallocated_filter):
        gpus = fn(ledger, job, config)
        if gpus is not None and len({g.server for g in gpus}) <= _servers_needed(ledger, job):
            return gpus
    return best_fit(ledger, job.gpus, job, config)


def movable(ledger: Ledger, job_id: str, state: GandivaState, pairs: bool = True) -> bool:
    """The job may be moved (or parked) this call: migratable, not changed by this call,
    in no packing trial and (unless ``pairs`` is False) no kept pair."""
    job = ledger.jobs[job_id]
    return (job.migratable and job_id not in ledger.changed and job_id not in state.trials
            and not (pairs and job_id in state.kept_pairs))


def _can_leave(ledger: Ledger, state: GandivaState, job_id: str) -> bool:
    """The job may leave its GPUs this call, moved into another group or parked: bound,
    under the runtime (which checkpoints it), and free to move."""
    return (ledger.state[job_id] in ("RUNNING", "SUSPENDED") and ledger.jobs[job_id].suspendable
            and movable(ledger, job_id, state))


def park(ledger: Ledger, state: GandivaState, job_id: str, reason: str) -> Park:
    """Park the job: it leaves its GPUs and its kept pair, queued again with its progress
    (the engine checkpoints it)."""
    state.drop_pair(job_id)
    ledger.unbind(job_id)
    ledger.set_state(job_id, "QUEUED")
    return Park(job_id, reason=reason)


def eldest_alone(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Park]:
    """``eldest_runs``: the eldest job of each GPU count (``Ledger.eldest_of``), once it
    runs, keeps its GPUs to itself until it ends: the other members of its group would
    wait that long, and a job packed beside it would slow it. Each that may leave is
    parked (its packing trial or kept pair ended; checkpointed, back in the queue, where
    Algorithm 1 places it again: free GPUs, else another group of its size; placement and
    first turns pass the eldest's group over)."""
    out: list[Park] = []
    if ledger.eldest is None:
        return out
    for size in sorted(ledger.eldest):
        eldest = ledger.eldest_of(size)
        if eldest is None or ledger.state[eldest] != "RUNNING":
            continue
        members = ledger.members(ledger.placement[eldest])
        if len(members) < 2:
            continue
        why = (f"job {eldest}, the eldest {size}-GPU job, keeps these GPUs to itself until it ends "
               f"(eldest_runs): checkpointed, back in the queue")
        for job_id in sorted(members):
            if job_id == eldest or job_id in ledger.changed or not _can_leave(ledger, state, job_id):
                continue  # one decision per job a call: one this call changed goes at the next
            end_trials_of(ledger, state, config, job_id, why)
            state.probes.pop(job_id, None)
            out.append(park(ledger, state, job_id, why))
    return out


def _move(ledger: Ledger, job_id: str, gpus: Placement, reason: str) -> Migrate:
    ledger.bind(job_id, gpus, "RUNNING")
    return Migrate(job_id, gpus, reason=reason)


def _spread_waited_for(ledger: Ledger, state: GandivaState, config: PolicyConfig, job_id: str,
                       target: Placement) -> bool:
    """``lower_spread_unwaited``: someone waits for the scattered free GPUs ``target`` a
    suspended job larger than a server would take: a job suspended in a group on one of
    their servers (its mover's own group-mates aside), or a suspended job of a count that
    fits one server which ``lower_height`` could move onto the free GPUs of one of them."""
    own = set(ledger.members(ledger.placement[job_id]))
    servers = {g.server for g in target}
    for server in servers:
        if any(ledger.state[j] == "SUSPENDED" and j not in own for j in ledger.jobs_on[server]):
            return True
    most = max(ledger.num_free(n) for n in servers)
    pairs = not config.lower_kept_pairs
    return any(j not in own and ledger.jobs[j].gpus <= most and movable(ledger, j, state, pairs=pairs)
               for j in ledger.by_state.get("SUSPENDED", ()))


def lower_height(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    out: list[Decision] = []
    if ledger.total_free() == 0:
        return out
    misses: dict[int, int] = {}
    # A size no free GPUs can take now is skipped before sorting (moves only use GPUs up):
    # up to a server's size it needs one server with that many free, beyond it idle servers.
    max_free = ledger.max_free()
    idle_free = sum(ledger.num_free(n) for n in ledger.idle_servers)
    # lower_spread_idle: scattered free GPUs go to a suspended large job only while no job
    # is queued (a queued job may be waiting for them to add up to its size).
    spread = config.lower_spread and not (config.lower_spread_idle and ledger.first_queued() is not None)
    if spread:  # a job larger than a server takes any free GPUs, spread
        idle_free = ledger.total_free()

    def feasible(size: int) -> bool:
        return size <= max_free if size <= ledger.max_server_gpus else size <= idle_free

    groups = sorted(((g, ledger.members(g)) for g in ledger.shared if feasible(len(g))),
                    key=lambda kv: (-len(kv[1]), kv[0]))
    for gpus, members in groups:
        if misses.get(len(gpus)) == ledger.version:
            continue
        waiting = [j for j in members if ledger.state[j] == "SUSPENDED"]
        for job_id in sorted(waiting, key=lambda j: ledger.jobs[j].last_state_change_at) if waiting else ():
            if len(out) >= budget:
                return out
            # A suspended member of a kept pair moves too (the pair ends: alone on free GPUs
            # each runs faster than packed, and waiting for the pair's turn while GPUs stand
            # idle is the worst of both); its partner then waits, or moves, on its own.
            partner = state.kept_pairs.get(job_id) if config.lower_kept_pairs else None
            if not movable(ledger, job_id, state, pairs=partner is None):
                continue
            job = ledger.jobs[job_id]
            target = _compact_target(ledger, job, config)
            if target is None and spread and job.gpus > ledger.max_server_gpus:
                if config.lower_spread_eldest and ledger.eldest_of(job.requested_gpus) != job_id:
                    continue  # lower_spread_eldest: only its count's eldest goes spread
                target = any_free_filter(ledger, job, config)
                if target is not None and config.lower_spread_unwaited and _spread_waited_for(
                        ledger, state, config, job_id, target):
                    break  # lower_spread_unwaited: the free GPUs go to a suspended smaller job first
            if target is None:
                misses[len(gpus)] = ledger.version
                break
            reason = "lower the height: free GPUs elsewhere"
            if partner is not None:
                state.drop_pair(job_id)
                ledger.touch(gpus)  # its group's units changed: rotation looks again
                reason += f" (its kept pack with {partner} ends: each runs faster alone)"
            out.append(_move(ledger, job_id, target, reason))
    return out


def spread_yield(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """``lower_spread_yield_s``: a job larger than a server running alone on GPUs spread over
    more servers than it needs (``lower_spread`` moved it there while nobody waited, or
    Algorithm 1's ``relaxed`` placed it) gives them back once the first queued job that fits
    one server has waited ``lower_spread_yield_s`` and one of the spread job's servers would
    then hold it: the spread job moves into a time-slice group of its GPU count on whole
    servers of that count (one with room under the cap, its members free to be joined; it
    runs first there, as balance_sizes' hand-over does), and the freed GPUs are the queued
    job's at the next placement. One such move a call; none when no group of its count has
    room (it keeps the GPUs). The spread rules look only at who waits when a spread is made;
    this bounds how long it keeps the GPUs once someone waits after it."""
    out: list[Decision] = []
    limit = config.lower_spread_yield_s
    top = ledger.max_server_gpus
    if limit is None or budget <= 0:
        return out
    head = ledger.first_queued(top)
    if head is None:
        return out
    waiter = ledger.jobs[head[-1]]
    spread: list[tuple[int, str]] = []
    for job_id in ledger.by_state.get("RUNNING", ()):
        job = ledger.jobs[job_id]
        gpus = ledger.placement[job_id]
        names = ledger.servers_of[job_id]
        if job.gpus <= top or len(names) <= _servers_needed(ledger, job) or len(ledger.members(gpus)) != 1:
            continue
        # The most GPUs one of its servers would have free once it leaves.
        room = max(ledger.num_free(n) + sum(g.server == n for g in gpus) for n in names)
        if room >= waiter.gpus and movable(ledger, job_id, state) and job.suspendable:
            spread.append((-room, job_id))
    if not spread:
        return out
    now = ledger.snapshot.now
    due = waiter.submitted_at + limit
    if now < due:
        state.wake_at(due)
        return out
    why = (f"job {waiter.id} ({waiter.gpus} GPUs) has waited {now - waiter.submitted_at:.0f}s for GPUs that "
           f"this spread job holds (lower_spread_yield_s): back into a group of its GPU count")
    def targets(size: int) -> list[tuple[Placement, set[str], int]]:
        # Not a group this call changed: its newcomer, placed now, runs first (and one
        # decision per job a call), so the spread job joins it at a later call.
        return [t for t in _handover_targets(ledger, state, size)
                if ledger.changed.isdisjoint(ledger.members(t[0]))]

    for _, job_id in sorted(spread):
        plan = _plan_into_groups(ledger, state, config, [job_id], set(ledger.servers_of[job_id]), targets, limit=1)
        if not plan:
            continue
        target = plan[0][1]
        for other in sorted(ledger.running_on(target)):
            ledger.set_state(other, "SUSPENDED")
            out.append(Suspend(other, reason=why))
        out.append(_move(ledger, job_id, target, why))
        break
    return out


def unpack_idle(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """``unpack_idle``: a kept pair running packed while GPUs stand idle parts: one member
    moves onto free GPUs and both run alone, each faster than packed. Packing is for an
    overloaded cluster (trials start only then), but a kept pair stayed packed as long as
    both ran, also once GPUs stood idle (on Philly 6c71a0 the last finishers ran packed for
    680-930 h of the trace's tail: docs/simulator.md, "The makespan tails of e13805 and
    6c71a0"). It acts as the last migration step, once every other step of the call has had
    the free GPUs, and only while no job is queued (free GPUs may be what a queued job waits
    to add up to) and no job of the pair's GPU count is suspended (the free GPUs would be
    its turn). The mover takes free GPUs only on a server of its own GPU count (Algorithm
    1's affinity filter): idle servers stay whole for jobs larger than a server and for
    spread jobs coming together, and other counts' servers for those counts."""
    out: list[Decision] = []
    if not state.kept_pairs or ledger.total_free() == 0 or ledger.first_queued() is not None:
        return out
    waiting = {ledger.jobs[j].gpus for j in ledger.by_state.get("SUSPENDED", ())}

    def arrived(job_id: str) -> QueueKey:
        job = ledger.jobs.get(job_id)
        return arrival_key(job) if job is not None else (1, 0.0, 0, job_id)

    # Each pair once, the elder pair first and its elder member tried first as the mover: by
    # arrival, not by name (named otherwise, a trace moved the other member).
    pairs = {tuple(sorted(pair, key=arrived)) for pair in state.kept_pairs.items()}
    for job_id, partner in sorted(pairs, key=lambda pair: arrived(pair[0])):
        if len(out) >= budget or ledger.total_free() == 0:
            break
        if ledger.placement.get(job_id) != ledger.placement.get(partner):
            continue  # a pair whose members were parted is no pack
        if not (ledger.state.get(job_id) == ledger.state.get(partner) == "RUNNING"):
            continue
        if ledger.jobs[job_id].gpus in waiting:
            continue
        for mover in (job_id, partner):
            if not movable(ledger, mover, state, pairs=False):
                continue
            target = affinity_filter(ledger, ledger.jobs[mover], config)
            if target is None:
                continue
            gpus = ledger.placement[mover]
            state.drop_pair(mover)
            ledger.touch(gpus)
            out.append(_move(ledger, mover, target, f"unpack onto idle GPUs: its kept pack with "
                                                    f"{partner if mover == job_id else job_id} ends, "
                                                    f"each runs faster alone"))
            break
    return out


def consolidate(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    out: list[Decision] = []
    if not ledger.spread or ledger.total_free() == 0:
        return out
    misses: dict[int, int] = {}
    for job_id in sorted(ledger.spread):
        if len(out) >= budget:
            break
        job, gpus = ledger.jobs[job_id], ledger.placement[job_id]
        used = len(ledger.servers_of[job_id])
        if (ledger.state[job_id] != "RUNNING" or used <= _servers_needed(ledger, job)
                or len(ledger.members(gpus)) > 1 or not movable(ledger, job_id, state)):
            continue
        if misses.get(job.gpus) == ledger.version or ledger.total_free() < job.gpus:
            continue
        target = _compact_target(ledger, job, config)
        if target is None:
            misses[job.gpus] = ledger.version
        elif len({g.server for g in target}) < used:
            out.append(_move(ledger, job_id, target, f"bring together from {used} servers"))
    return out


# After make_room's moves the policy looks again this soon, to place the waiting job.
MAKE_ROOM_RECHECK_S = 5.0


def make_room(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    out: list[Decision] = []
    key = ledger.first_queued(ledger.max_server_gpus)
    first = ledger.jobs[key[-1]] if key is not None else None
    if first is None or ledger.total_free() < first.gpus:
        return out
    if ledger.max_free() >= first.gpus:
        return out  # it fits somewhere already; placement will take it
    for source in sorted((n for n in ledger.servers if not ledger.is_idle(n) and ledger.num_free(n) > 0),
                         key=lambda n: (-ledger.num_free(n), n)):
        # Onto servers as full as the source, too: emptying it is the point (on two-GPU
        # servers with one free each, "only fuller" would never let the job in).
        moves = _plan_evacuation(ledger, source, state, config, as_full_ok=True)
        if moves is None or len(moves) > budget:
            continue
        for job_id, gpus in moves:
            out.append(_move(ledger, job_id, gpus, f"make room for job {first.id}: empty {source}"))
        state.wake_at(ledger.snapshot.now + MAKE_ROOM_RECHECK_S)
        break
    return out


def _demand(ledger: Ledger) -> bool:
    """Would a freed server be used? Jobs waiting, queued, or spread out."""
    if ledger.by_state.get("QUEUED") or ledger.by_state.get("SUSPENDED"):
        return True
    return bool(ledger.spread)


def defragment(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    now = ledger.snapshot.now
    if state.last_defrag_at is not None and now < state.last_defrag_at + config.defrag_interval_s:
        state.wake_at(state.last_defrag_at + config.defrag_interval_s)
        return []
    if not _demand(ledger):
        return []
    state.last_defrag_at = now
    out: list[Decision] = []
    tried: set[str] = set()
    while len(out) < budget:
        sources = [n for n in ledger.servers if n not in tried and not ledger.is_idle(n)
                   and ledger.num_free(n) >= config.defrag_free_gpus]
        if not sources:
            break
        source = max(sources, key=lambda n: (ledger.num_free(n), n))
        tried.add(source)
        moves = _plan_evacuation(ledger, source, state, config)
        if moves is None or len(out) + len(moves) > budget:
            continue
        for job_id, gpus in moves:
            out.append(_move(ledger, job_id, gpus, f"defragment: empty {source}"))
    return out


def _plan_evacuation(
    ledger: Ledger, source: str, state: GandivaState, config: PolicyConfig, as_full_ok: bool = False
) -> list[tuple[str, Placement]] | None:
    """Where each job on ``source`` would go on fuller servers (``as_full_ok``: or as
    full); None if any does not fit."""
    jobs = sorted(ledger.jobs_on[source])
    plan: list[tuple[str, Placement]] = []
    taken: set = set()
    planned: dict[str, float] = {}
    for job_id in jobs:
        gpus = ledger.placement[job_id]
        if (len({g.server for g in gpus}) > 1 or len(ledger.members(gpus)) > 1
                or ledger.state[job_id] != "RUNNING" or not movable(ledger, job_id, state)):
            return None
        job = ledger.jobs[job_id]
        dests = sorted(
            (n for n in ledger.servers if n != source and not ledger.is_idle(n)),
            key=lambda n: (ledger.affinity(n) != job.gpus, ledger.num_free(n), n),
        )
        target = None
        for name in dests:
            free = [g for g in ledger.free_gpus(name) if g not in taken]
            # Only fuller servers: moving to an emptier one would not defragment.
            fuller = ledger.num_free(name) < ledger.num_free(source) + (1 if as_full_ok else 0)
            if len(free) >= job.gpus and fuller and host_ok(ledger, job, tuple(free[: job.gpus]), config, planned):
                target = tuple(free[: job.gpus])
                break
        if target is None:
            return None
        taken.update(target)
        _plan_host(ledger, job, target, planned, config)
        plan.append((job_id, target))
    return plan


def _plan_host(ledger: Ledger, job: JobView, gpus: Placement, planned: dict[str, float],
               config: PolicyConfig) -> None:
    """Note in ``planned`` the host memory ``job`` will hold on ``gpus``'s servers."""
    if not ledger.host_limit:
        return
    need = host_need(job) or config.job_host_memory_bytes
    for name in {g.server for g in gpus}:
        if name in ledger.host_limit:
            planned[name] = planned.get(name, 0.0) + need


def _crowding(ledger: Ledger) -> tuple[dict[int, int], set[int]]:
    """Jobs (bound or queued) per requested GPU count, and the GPU counts with jobs waiting
    (queued or suspended): the ledger's tallies, kept as states change."""
    count = {k: n for k, n in ledger.jobs_by_request.items() if n}
    waiting = {k for k, n in ledger.waiting_by_request.items() if n}
    return count, waiting


def _look_due(ledger: Ledger, state: GandivaState, config: PolicyConfig, last_at: float | None) -> bool:
    """A look paced at ``defrag_interval_s`` (its last at ``last_at``) is due, with jobs waiting
    for it to help; when it is not due yet the policy wakes when it is."""
    if last_at is not None and ledger.snapshot.now < last_at + config.defrag_interval_s:
        state.wake_at(last_at + config.defrag_interval_s)
        return False
    return bool(ledger.by_state.get("QUEUED") or ledger.by_state.get("SUSPENDED"))


def balance_sizes(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """Hand a server of a less crowded GPU count to the most crowded one (module docstring, 5)."""
    now = ledger.snapshot.now
    if not _look_due(ledger, state, config, state.last_balance_at):
        return []
    state.last_balance_at = now
    count, waiting = _crowding(ledger)
    if not waiting:
        return []
    crowd = _crowd(ledger, count, config.balance_per_gpu)
    # Only a GPU count that fits one server can take a server; any count can give one (a
    # group of jobs larger than a server gives all the servers it spans, whole). A count
    # whose waiting jobs cannot take it now (all suspended in kept pairs, trials, or just
    # changed) is not helped: the server would stand idle until placement gave it back to
    # a job of the donor's count, whose jobs this look would park again, and so on.
    helped = [k for k in waiting if k <= ledger.max_server_gpus and _can_take(ledger, state, k)]
    if not helped:
        return []
    crowded = max(helped, key=lambda k: (crowd(k), k))
    donors = []
    for name in ledger.servers:
        sizes = ledger.sizes[name]
        if len(sizes) != 1 or ledger.is_idle(name) or name in ledger.held:
            continue
        (size,) = sizes
        gets = ledger.servers[name].num_gpus // crowded
        if size == crowded or size not in count or gets == 0 or crowd(crowded) <= crowd(size):
            continue
        donors.append((len(ledger.jobs_on[name]), name, size, gets))
    targets: dict[int, list[tuple[Placement, set[str], int]]] = {}  # per size; no donor changes them
    # balance_park: the first donor whose jobs can all be parked, should none move into groups.
    to_park: tuple[list[str], int, list[str]] | None = None
    for _, name, size, gets in sorted(donors):
        # Every job on the server moves (or none): what the hand-over would free and leave
        # is known before its plan, which is made only for a hand-over worth making.
        moving = ledger.jobs_on[name]
        freed = _whole_servers(ledger, moving)
        if freed is None:
            continue
        gets *= len(freed)
        own = {ledger.placement[j] for j in moving}
        if crowd(size, -len(own)) >= crowd(crowded, gets):
            continue  # it would leave this GPU count more crowded than the one it helps
        plan = None
        if len(moving) <= budget:
            if size not in targets:
                targets[size] = _handover_targets(ledger, state, size)
            plan = _plan_handover(ledger, state, config, name, targets[size])
        if plan is None:
            # A count's last group may go too (the crowding test above still holds): keeping
            # it was measured and lost goals (docs/simulator.md, "balance_park").
            if to_park is None and config.balance_park and all(_can_leave(ledger, state, j) for j in moving):
                to_park = (freed, size, sorted(moving))
            continue
        why = f"{HAND_OVER}{', '.join(freed)} to the {crowded}-GPU jobs (more crowded than the {size}-GPU jobs)"
        out: list[Decision] = []
        for job_id, target in plan:
            for other in sorted(ledger.running_on(target)):
                ledger.set_state(other, "SUSPENDED")
                out.append(Suspend(other, reason=why))
            out.append(_move(ledger, job_id, target, why))
        return out + _fill_all(ledger, state, config, freed, crowded, budget - len(plan), why)
    if to_park is None:
        return []
    # No donor's jobs fit into the other groups of their size (every group is full, or a
    # server holds more jobs than a round may migrate): the fewest jobs are parked instead,
    # checkpointed and queued again with their progress, to rejoin their groups as room comes.
    freed, size, parking = to_park
    why = (f"{HAND_OVER}{', '.join(freed)} to the {crowded}-GPU jobs (more crowded than the {size}-GPU jobs; "
           f"its jobs cannot all move into other groups of their size): checkpointed, back in the queue")
    for job_id in parking:
        state.probes.pop(job_id, None)
    parks = [park(ledger, state, job_id, why) for job_id in parking]
    return [*parks, *_fill_all(ledger, state, config, freed, crowded, budget, why)]


def _can_take(ledger: Ledger, state: GandivaState, size: int) -> bool:
    """A waiting ``size``-GPU job could take a handed-over server now (as ``_fill`` puts
    them there): one queued, or one suspended that is free to move."""
    return ledger.next_queued(size) is not None or next(_suspended_movers(ledger, state, size), None) is not None


def _fill_all(ledger: Ledger, state: GandivaState, config: PolicyConfig, freed: list[str], size: int,
              budget: int, why: str) -> list[Decision]:
    """The crowded jobs take the handed-over servers at once: left idle, the next call's
    placement or lower_height could give them to any GPU count (the donors' own waiting jobs
    first)."""
    out: list[Decision] = []
    for server in freed:
        filled = _fill(ledger, state, config, [server], size, budget, why)
        budget -= sum(isinstance(d, Migrate) for d in filled)
        out += filled
    return out


def _crowd(ledger: Ledger, count: dict[int, int], per_gpu: bool) -> Callable[..., float]:
    """A GPU count's crowding: its jobs per same-size GPU set (``per_gpu``: per GPU of those
    sets), with ``more_sets`` sets added or taken away."""
    sets = {k: len(ledger.groups_by_size.get(k, ())) for k in count}

    def crowd(k: int, more_sets: int = 0) -> float:
        return count[k] / (max(1, sets[k] + more_sets) * (k if per_gpu else 1))

    return crowd


# A gathering whose servers are not empty this long after it began is given up (their
# free GPUs are free to all again): an hour, as the other rules' S.
GATHER_MAX_S = 3600.0


def gather_large(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """Hold whole servers for the most crowded GPU count larger than a server, empty them
    into other time-slice groups, and start its first waiting job there; with probe_slices,
    lend them for the first turn of the first never-run such job instead, then give them
    back (``_end_loan``; module docstring, 6)."""
    now = ledger.snapshot.now
    if state.lent is not None:
        return _end_loan(ledger, state, config, budget)
    if state.gather is not None:
        size, names, since, target, _ = state.gather
        if ((ledger.state.get(target) != "QUEUED" if target is not None else not ledger.waiting_by_request.get(size))
                or any(n not in ledger.servers for n in names) or now - since > GATHER_MAX_S):
            _end_gather(ledger, state)
            return []
        ledger.hold(names, size)  # a fresh ledger (servers changed) has forgotten it
        return _empty_held(ledger, state, config, budget)
    if not _look_due(ledger, state, config, state.last_gather_at):
        return []
    state.last_gather_at = now
    count, waiting = _crowding(ledger)
    large = [k for k in waiting if ledger.max_server_gpus < k <= ledger.num_gpus]
    if not large:
        return []
    # Per GPU: a set of jobs larger than a server takes several servers, so its jobs are
    # weighed by the GPUs each needs (as Tiresias' 2D attained service weighs them).
    crowd = _crowd(ledger, count, per_gpu=True)
    size = max(large, key=lambda k: (crowd(k), k))
    # With probe_slices the servers are only lent, for the first turn of the first job larger
    # than a server that has never run (then they go back): no count gives up servers for good.
    lend = None
    if config.probe_slices:
        firsts = [key for k in large for key in ledger.queued_by_size.get(k, ())[:64]
                  if not (ledger.jobs[key[-1]].steps or ledger.jobs[key[-1]].attained_service_s)]
        if not firsts:
            return []
        lend = min(firsts)[-1]
        size = ledger.jobs[lend].gpus
    # Servers in units that empty together (an idle server; a server of one less crowded
    # GPU count with every server its jobs span), the fewest jobs to move first.
    units: list[tuple[int, list[str], int]] = []
    for name in ledger.servers:
        if ledger.is_idle(name):
            units.append((0, [name], 0))
            continue
        sizes = ledger.sizes[name]
        if len(sizes) != 1:
            continue
        (own,) = sizes
        if own == size or own not in count or (lend is None and crowd(size) <= crowd(own)):
            continue
        moving = ledger.jobs_on[name]
        freed = _whole_servers(ledger, moving)
        if freed is None or freed[0] != name:  # a unit is listed once, under its first server
            continue
        if not all(_can_leave(ledger, state, j) for j in moving):
            continue
        units.append((len(moving), freed, own))
    units.sort()
    chosen: list[str] = []
    lost: Counter[int] = Counter()  # sets each donor GPU count gives up
    moves: Counter[int] = Counter()  # jobs of each GPU count to move
    targets: dict[int, list[tuple[Placement, set[str], int]]] = {}
    donors: list[tuple[str, int | None]] = []
    got = 0
    for n_jobs, freed, own in units:
        if got >= size:
            break
        if n_jobs:
            sets = len({ledger.placement[j] for j in ledger.jobs_on[freed[0]]})
            if lend is None and crowd(own, -(lost[own] + sets)) >= crowd(size, 1):
                continue  # it would leave its GPU count more crowded than the one it helps
            if own not in targets:
                targets[own] = _handover_targets(ledger, state, own)
            away = {*chosen, *freed}
            room = sum(config.max_jobs_per_gpu - m for gpus, names, m in targets[own]
                       if away.isdisjoint(names) and m < config.max_jobs_per_gpu)
            if room < moves[own] + n_jobs:
                continue
            lost[own] += sets
            moves[own] += n_jobs
        chosen += freed
        donors += [(n, own if n_jobs else None) for n in freed]
        got += sum(ledger.servers[n].num_gpus for n in freed)
    if got < size:
        return []
    state.gather = Gathering(size, tuple(sorted(chosen)), now, lend, tuple(sorted(donors)))
    ledger.hold(chosen, size)
    return _empty_held(ledger, state, config, budget)


def _empty_held(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """Move the jobs off the held servers (at most ``budget``) into other time-slice groups
    of their GPU count; once none is left, start the gathered count's first waiting job on
    them (queued first, else a suspended one) and end the hold."""
    assert state.gather is not None
    size, names, _, lend, donors = state.gather
    why = (f"gather {', '.join(names)} for the {size}-GPU jobs (the most crowded GPU count)"
           if lend is None else f"lend {', '.join(names)} to job {lend} for its first turn (larger than a server)")
    out: list[Decision] = []
    jobs = sorted({j for n in names for j in ledger.jobs_on[n]})
    if jobs:
        targets: dict[int, list[tuple[Placement, set[str], int]]] = {}

        def targets_of(k: int) -> list[tuple[Placement, set[str], int]]:
            if k not in targets:
                targets[k] = _handover_targets(ledger, state, k)
            return targets[k]

        plan = _plan_into_groups(ledger, state, config, jobs, set(names), targets_of, budget) or []
        for job_id, target in plan:
            for other in sorted(ledger.running_on(target)):
                ledger.set_state(other, "SUSPENDED")
                out.append(Suspend(other, reason=why))
            out.append(_move(ledger, job_id, target, why))
        if any(ledger.jobs_on[n] for n in names):
            if not plan and budget > 0 and not any(j in ledger.changed or j in state.trials for j in jobs):
                # Nothing can move and waiting will not change that (newcomers took the room
                # in the other groups, or a job is not migratable): give the servers back.
                _end_gather(ledger, state)
                return out
            state.wake_at(ledger.snapshot.now + MAKE_ROOM_RECHECK_S)
            return out
    free = [g for n in names for g in ledger.held_free(n)]
    _end_gather(ledger, state)
    gpus = tuple(free[:size])
    if len(gpus) < size:
        return out
    if lend is not None:
        if ledger.state.get(lend) == "QUEUED" and host_ok(ledger, ledger.jobs[lend], gpus, config):
            ledger.bind(lend, gpus, "RUNNING")
            out.append(Place(lend, gpus, reason=f"probe slice: first turn on {', '.join(names)}, lent to it"))
            state.lent = (lend, gpus, donors)
            ledger.hold(names, 0)  # its group takes no one else: the servers go back after the turn
        else:
            out += _refill(ledger, state, config, donors, budget - len(out), why)
        return out
    key = ledger.next_queued(size)
    if key is not None and host_ok(ledger, ledger.jobs[key[-1]], gpus, config):
        ledger.bind(key[-1], gpus, "RUNNING")
        out.append(Place(key[-1], gpus, reason=why))
        return out
    for job_id in _suspended_movers(ledger, state, size):
        if host_ok(ledger, ledger.jobs[job_id], gpus, config):
            out.append(_move(ledger, job_id, gpus, why))
            break
    return out


def _end_gather(ledger: Ledger, state: GandivaState) -> None:
    """The gathering is over (done or given up): its servers are free to all again."""
    state.gather = None
    ledger.release()


def _end_loan(ledger: Ledger, state: GandivaState, config: PolicyConfig, budget: int) -> list[Decision]:
    """Servers lent for a never-run job's first turn (``gather_large`` with ``probe_slices``):
    once the turn is over (``probe_turn_ends``) the job is parked (checkpointed, queued again
    with its progress) and each server goes back to the GPU count it was taken from."""
    assert state.lent is not None
    job_id, gpus, donors = state.lent
    names = [n for n, _ in donors]
    out: list[Decision] = []
    if ledger.state.get(job_id) is not None and ledger.placement.get(job_id) == gpus:
        if any(n not in ledger.servers for n in names):
            state.lent = None
            ledger.release()
            return out
        ledger.hold(names, 0)  # a fresh ledger (servers changed) has forgotten it
        now = ledger.snapshot.now
        if ledger.state[job_id] == "RUNNING":
            until = probe_turn_ends(ledger.jobs[job_id], now, config.quantum_s)
            if until is not None:
                state.wake_at(until)
                return out
        if ledger.state[job_id] not in ("RUNNING", "SUSPENDED") or job_id in ledger.changed:
            state.wake_at(now + MAKE_ROOM_RECHECK_S)
            return out
        if ledger.jobs[job_id].migratable and ledger.jobs[job_id].suspendable:
            out.append(park(ledger, state, job_id, f"first turn on the servers lent to it is over: checkpointed, "
                                                   f"back in the queue ({', '.join(names)} go back)"))
        # Not migratable (a park would restart it from a checkpoint it cannot survive) or
        # not under the runtime at all (nothing can checkpoint it): it keeps the servers as
        # a group of its own, and the loan ends.
    # Finished, killed or moved meanwhile, or parked: the servers go back.
    state.lent = None
    ledger.release()
    return out + _refill(ledger, state, config, donors, budget, "servers lent for a first turn come back")


def _refill(ledger: Ledger, state: GandivaState, config: PolicyConfig, donors: tuple[tuple[str, int | None], ...],
            budget: int, why: str) -> list[Decision]:
    """Give each of ``donors``' servers back to the GPU count its jobs had (``_fill``)."""
    by_size: dict[int, list[str]] = {}
    for name, size in donors:
        if size is not None and name in ledger.servers and ledger.is_idle(name):
            by_size.setdefault(size, []).append(name)
    out: list[Decision] = []
    for size, names in sorted(by_size.items()):
        parts = [[n] for n in names] if size <= ledger.max_server_gpus else [names]
        for part in parts:
            filled = _fill(ledger, state, config, part, size, budget, why)
            budget -= sum(isinstance(d, Migrate) for d in filled)
            out += filled
    return out


def _whole_servers(ledger: Ledger, moving: set[str]) -> list[str] | None:
    """The servers the ``moving`` jobs (every job on a donor server) leave idle: that server,
    and for a group of jobs larger than a server every server it spans; None if another job
    stays on one of them."""
    names = sorted({n for job_id in moving for n in ledger.servers_of[job_id]})
    if any(not ledger.jobs_on[n] <= moving for n in names):
        return None
    return names


def _fill(ledger: Ledger, state: GandivaState, config: PolicyConfig, servers: list[str], size: int, budget: int,
          why: str) -> list[Decision]:
    """Put waiting ``size``-GPU jobs on the idle ``servers``, one per ``size`` GPUs (of one
    server, or of several for jobs larger than a server): queued ones first, in queue order
    (they have waited without running), then suspended ones from the fullest groups (a
    migration each, within ``budget``); each while its host memory fits."""
    sets: list[Placement] = []
    if size <= ledger.max_server_gpus:
        for server in servers:
            free = ledger.free_gpus(server)
            sets += [tuple(free[i:i + size]) for i in range(0, len(free) - size + 1, size)]
    else:
        free = [g for server in servers for g in ledger.free_gpus(server)]
        sets = [tuple(free[i:i + size]) for i in range(0, len(free) - size + 1, size)]
    out: list[Decision] = []
    while sets:
        key = ledger.next_queued(size)
        if key is None:
            break
        if not host_ok(ledger, ledger.jobs[key[-1]], sets[0], config):
            break
        gpus = sets.pop(0)
        ledger.bind(key[-1], gpus, "RUNNING")
        out.append(Place(key[-1], gpus, reason=why))
    for job_id in _suspended_movers(ledger, state, size):
        if not sets or budget <= 0:
            break
        if host_ok(ledger, ledger.jobs[job_id], sets[0], config):
            out.append(_move(ledger, job_id, sets.pop(0), why))
            budget -= 1
    return out


def _suspended_movers(ledger: Ledger, state: GandivaState, size: int) -> Iterator[str]:
    """The suspended ``size``-GPU jobs free to move, from the fullest groups first, the
    longest suspended of each first (each looked at when the caller asks for it)."""
    for group in sorted(ledger.groups_by_size.get(size, ()), key=lambda g: (-len(ledger.members(g)), g)):
        for job_id in sorted(ledger.members(group), key=lambda j: (ledger.jobs[j].last_state_change_at, j)):
            if (ledger.state[job_id] == "SUSPENDED" and ledger.jobs[job_id].suspendable
                    and movable(ledger, job_id, state)):
                yield job_id


def _handover_targets(ledger: Ledger, state: GandivaState, size: int) -> list[tuple[Placement, set[str], int]]:
    """The ``size``-GPU time-slice groups a donor's jobs may join: on servers of that affinity,
    every member free to be joined (suspendable, not in a trial or kept pair) and no job
    moving off or onto its GPUs; each with the servers it spans and its members."""
    out: list[tuple[Placement, set[str], int]] = []
    for gpus in ledger.groups_by_size.get(size, ()):
        names = {g.server for g in gpus}
        if any(n not in ledger.servers or ledger.affinity(n) != size for n in names):
            continue
        group = ledger.members(gpus)
        if ledger.moving_onto(gpus) or any(not ledger.jobs[m].suspendable or m in state.trials
                                           or m in state.kept_pairs for m in group):
            continue
        out.append((gpus, names, len(group)))
    return out


def _plan_handover(ledger: Ledger, state: GandivaState, config: PolicyConfig, source: str,
                   targets: list[tuple[Placement, set[str], int]]) -> list[tuple[str, Placement]] | None:
    """For each job on ``source``: one of ``targets`` (``_handover_targets``) on other servers
    with room, the least full first; None if any job cannot move."""
    return _plan_into_groups(ledger, state, config, sorted(ledger.jobs_on[source]), {source},
                             lambda size: targets)


def _plan_into_groups(ledger: Ledger, state: GandivaState, config: PolicyConfig, jobs: list[str],
                      away: set[str], targets_of: Callable[[int], list[tuple[Placement, set[str], int]]],
                      limit: int | None = None) -> list[tuple[str, Placement]] | None:
    """For each of ``jobs`` (on the ``away`` servers): a time-slice group of its size from
    ``targets_of(size)`` (``_handover_targets``) on none of the ``away`` servers, with room
    and host memory for it, the least full first. ``limit`` None: every job or None if one
    cannot move; else at most ``limit`` moves, passing over the jobs that cannot move."""
    # Per size, the groups with room, least full first (then by GPUs), as a heap.
    rooms: dict[int, list[tuple[int, Placement]]] = {}
    plan: list[tuple[str, Placement]] = []
    planned: dict[str, float] = {}
    for job_id in jobs:
        if limit is not None and len(plan) >= limit:
            break
        view = ledger.jobs[job_id]
        if away.isdisjoint(ledger.servers_of[job_id]) or not _can_leave(ledger, state, job_id):
            if limit is None:
                return None
            continue
        size = len(ledger.placement[job_id])
        room = rooms.get(size)
        if room is None:
            room = rooms[size] = [(n, gpus) for gpus, names, n in targets_of(size)
                                  if away.isdisjoint(names) and n < config.max_jobs_per_gpu]
            heapq.heapify(room)
        # The least full group whose servers' host memory takes the job too.
        passed = []
        while room and not host_ok(ledger, view, room[0][1], config, planned):
            passed.append(heapq.heappop(room))
        if not room:
            for entry in passed:
                heapq.heappush(room, entry)
            if limit is None:
                return None
            continue
        n, target = heapq.heappop(room)
        for entry in passed:
            heapq.heappush(room, entry)
        if n + 1 < config.max_jobs_per_gpu:
            heapq.heappush(room, (n + 1, target))
        _plan_host(ledger, view, target, planned, config)
        plan.append((job_id, target))
    return plan
