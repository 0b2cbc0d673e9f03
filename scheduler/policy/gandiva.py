"""Gandiva's policy: reactive placement plus the introspective passes (brief section 3).

One decide() call runs, in this order:
1. judge packing trials that are due or whose jobs departed; forget departed jobs;
2. reactive mode: place queued jobs by priority, then arrival, through Algorithm 1;
   a job that would only fit by time-sharing first shrinks grown jobs; the first job
   that has waited ``reserve_after_s`` without fitting reserves the free GPUs (jobs
   behind it may only time-share) - our addition against starving large jobs; the
   first that has waited ``share_block_after_s`` stops the jobs behind it from joining
   time-slice groups (they take free GPUs only), so that the groups drain toward it;
   while the first that fits one server has waited ``large_block_after_s`` (with
   ``groupless_block``: or has no time-slice group of its size), jobs larger than a server
   queued after it do not join time-slice groups (smaller ones still do);
   with ``probe_slices`` never-run jobs that found no place join full groups for a first
   turn; with ``probe_large`` the first never-run job larger than a server takes one over
   whole servers of other GPU counts, their jobs suspended in place (large_turns.py);
3. migration (lower the height, make room on one server for a queued job, bring
   spread jobs together, defragment);
4. new packing trials (only when overloaded);
5. time-slicing rotation in every oversubscribed group without a trial;
6. grow opt-in jobs when GPUs have been idle.
"""

from __future__ import annotations

import math

from scheduler.policy.base import Policy
from scheduler.policy.cluster import Ledger, Placement, QueueKey, host_need
from scheduler.policy.growshrink import grow, note_free_since, shrink_all, shrink_for
from scheduler.policy.large_turns import large_turns
from scheduler.policy.migration import (
    balance_sizes,
    consolidate,
    defragment,
    eldest_alone,
    gather_large,
    lower_height,
    make_room,
    movable,
    park,
    spread_yield,
    unpack_idle,
)
from scheduler.policy.packing import end_trials_of, judge_trials, start_trials
from scheduler.policy.placement import (
    ALGORITHM_1,
    FREE_FILTERS,
    OVERSUBSCRIBE_NOT_DRAINING,
    OVERSUBSCRIBE_ONLY,
    Candidate,
    Misses,
    draining_group,
    find_placement,
    host_ok,
    missed,
    queue_reason,
    takes_turns,
)
from scheduler.policy.state import GandivaState
from scheduler.policy.timeslice import probe_turn_ends, ranked_last, rotate
from scheduler.policy.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Park,
    Place,
    PolicyConfig,
    Queue,
    Suspend,
)


class GandivaPolicy(Policy):
    """Introspective scheduling: time-slicing, packing, migration, grow-shrink."""

    name = "gandiva"
    preemption = "hook"

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.state = GandivaState()
        # A queued job that waited reserve_after_s and still does not fit: jobs behind
        # it may only time-share, so that free GPUs add up for it (no starvation).
        self._reserved: str | None = None
        # Groups changed since packing / rotation last looked (None: look at every group).
        self._look_trials: set[Placement] | None = None
        self._look_rotate: set[Placement] | None = None
        self._tracked: Ledger | None = None
        # find_placement's "nothing fits" answers, kept across calls for the ledger and
        # config they were found with: each is keyed by the ledger's version, which moves
        # with everything the filters read, so one stands until the occupancy changes.
        self._misses: Misses = {}
        self._misses_of: tuple[Ledger, PolicyConfig] | None = None

    # Off: packing and rotation look at every group at every call, and placement searches
    # again at every call (the reference the incremental path is tested against; same
    # decisions, cost grows with the groups and the GPU counts waiting).
    incremental = True

    def _take_touched(self, ledger: Ledger) -> None:
        """Hand the groups the ledger saw change to packing and rotation."""
        if ledger is not self._tracked or ledger.touched_groups is None:
            # A fresh ledger: nothing is known about its groups, so both look at all.
            self._tracked = ledger
            ledger.touched_groups = set()
            self._look_trials = self._look_rotate = None
            return
        touched = ledger.touched_groups
        for look in (self._look_trials, self._look_rotate):
            if look is not None:
                look.update(touched)
        touched.clear()

    def next_wakeup(self) -> float | None:
        return self.state.next_wakeup

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        cfg, state = self.config, self.state
        state.next_wakeup = None
        ledger = self.ledger_for(snapshot)
        if cfg.las_slices and (cfg.gittins_slices or cfg.fifo_after_measured):
            self._note_departures(ledger)
        if cfg.eldest_runs or (cfg.lower_spread and cfg.lower_spread_eldest):
            ledger.start_eldest(cfg.eldest_second_group)
        # Trials of departed jobs get their verdicts before the state forgets them.
        out: list[Decision] = judge_trials(ledger, state, cfg)
        state.forget_missing(ledger.jobs)
        out += self._place_queued(ledger)
        if cfg.probe_slices:
            probed = self._probe(ledger)
            if probed:
                placed = {d.job_id for d in probed if isinstance(d, Place)}
                out = [d for d in out if not (isinstance(d, Queue) and d.job_id in placed)] + probed
        if cfg.probe_large:
            turns = large_turns(ledger, self.state, cfg)
            if turns:
                placed = {d.job_id for d in turns if isinstance(d, Place)}
                out = [d for d in out if not (isinstance(d, Queue) and d.job_id in placed)] + turns
        if cfg.enable_migration:
            budget = cfg.max_migrations_per_round
            # While a starving job holds a reservation, free GPUs are kept for it.
            steps = ((make_room, consolidate, defragment) if self._reserved
                     else (lower_height, make_room, consolidate, defragment))
            if cfg.lower_spread_yield_s is not None:
                steps = (*steps, spread_yield)
            if cfg.gather_large:
                steps = (*steps, gather_large)
            if cfg.balance_sizes:
                steps = (*steps, balance_sizes)
            if cfg.unpack_idle and not self._reserved:
                steps = (*steps, unpack_idle)
            for step in steps:
                moves = step(ledger, state, cfg, budget)
                budget -= len(moves)
                out += moves
        # Trials start before rotation so that a group about to rotate can pack instead.
        # Both look only at the groups that changed since they last looked (and rotate at
        # those whose slice is due); a fresh ledger, or ``incremental`` off, looks at all.
        self._take_touched(ledger)
        trials = start_trials(ledger, state, cfg, self._look_trials)
        if trials is not None:  # it looked (else the changes wait for when it does)
            out += trials
            self._look_trials = set() if self.incremental else None
        self._take_touched(ledger)
        if state.probes:  # turns that are over, before rotation gives their GPUs on
            out = self._park(ledger, out)
            self._take_touched(ledger)  # a park changes its group: rotation looks at it now
        out += rotate(ledger, state, cfg, self._look_rotate)
        self._look_rotate = set() if self.incremental else None
        if cfg.eldest_runs and cfg.eldest_parks:
            out += eldest_alone(ledger, state, cfg)
        if state.probes:  # newcomers this rotation suspended
            out = self._park(ledger, out)
        if ledger.grown:
            out += shrink_all(ledger, "grow-shrink is off for this job", opted_out_only=True)
        if not self._reserved:
            out += grow(ledger, state, cfg)
        elif cfg.enable_grow_shrink:  # no grow while GPUs are reserved; their idle still counts
            note_free_since(ledger, state, ledger.snapshot.now)
        return out

    def _note_departures(self, ledger: Ledger) -> None:
        """Add the service per GPU of the jobs that left since the last call to the window
        the Gittins index is computed from (a fresh ledger starts collecting them)."""
        gone = ledger.departed
        if gone is None:
            ledger.departed = []
            return
        now = ledger.snapshot.now
        live = None
        if self.config.gittins_censored:
            def live() -> list[float]:
                return [v.attained_at(now) / (len(v.placement) or v.gpus) for v in ledger.jobs.values()]
        for view in sorted(gone, key=lambda v: v.id):  # removals come as a set: a fixed order
            self.state.service.add(view.attained_at(now) / (len(view.placement) or view.gpus), live,
                                   history=self.config.gittins_history)
        gone.clear()

    def _queue_reason(self, ledger: Ledger, job: JobView, cache: dict[tuple[int, int, int], str]) -> str:
        if self._reserved is not None:
            return f"job {self._reserved} has waited longest and has first claim on free GPUs"
        key = (job.gpus, ledger.version, host_need(job))
        if key not in cache:
            cache[key] = queue_reason(ledger, job, self.config)
        return cache[key]

    def _kept_misses(self, ledger: Ledger) -> Misses:
        """The misses to start this call with. While a grown job exists they start empty:
        the first job that does not fit must be visited, to shrink grown jobs for it."""
        key = self._misses_of
        if (not self.incremental or ledger.grown or key is None or key[0] is not ledger
                or (key[1] is not self.config and key[1] != self.config)):
            self._misses = {}
            self._misses_of = (ledger, self.config)
        return self._misses

    def _place_queued(self, ledger: Ledger) -> list[Decision]:
        out: list[Decision] = []
        # (GPU count, host memory) of jobs no shrink placed this walk: the walk only takes GPUs.
        unshrunk: set[tuple[int, int]] = set()
        misses = self._kept_misses(ledger)
        reasons: dict[tuple[int, int, int], str] = {}
        self._reserved = None
        # share_block_after_s: once the first job still queued (it was passed over: it
        # found no place) has waited that long, the jobs after it may not time-share.
        blocker: str | None = None
        block_s = self.config.share_block_after_s
        # large_block_after_s: once the first queued job that fits one server has waited
        # that long, the jobs larger than a server queued after it may not time-share, so
        # that their groups drain and free whole servers; smaller jobs still join groups.
        # groupless_block: at once while that job's GPU count has no time-slice group anywhere.
        large_head: QueueKey | None = None  # that job's queue key, found at the first large job
        top = ledger.max_server_gpus
        at: QueueKey | None = None  # the walk's position: the key of the job visited last
        limit = self.config.reserve_after_s
        # Without reasons to give and no reservation to find, a job whose GPU count
        # found no place at this ledger version is not visited at all (find_placement
        # would answer None from its cache); otherwise every queued job is.
        walk_all = self.config.queue_reasons or limit is not None

        def shut(size: int) -> bool:
            """The next ``size``-GPU job of the walk may take free GPUs only (a block holds):
            the walk goes in queue order, so every job after ``at`` is behind ``large_head``
            once ``at`` is."""
            return blocker is not None or (
                size > top and large_head is not None and at is not None and at > large_head)

        one_group = self.config.large_block_one_group

        def skip(size: int) -> bool:
            return not walk_all and (missed(ledger, misses, ALGORITHM_1, size) or (
                shut(size) and missed(ledger, misses, FREE_FILTERS, size) and (
                    not one_group or blocker is not None
                    or missed(ledger, misses, OVERSUBSCRIBE_NOT_DRAINING, size))))

        now = ledger.snapshot.now
        shrunk_for = self.state.shrunk_for
        for waiter in [j for j in shrunk_for if ledger.state.get(j) != "QUEUED"]:
            del shrunk_for[waiter]  # placed, or gone
        for job in ledger.queued_in_order(skip):
            if blocker is None and block_s is not None:
                # Only a job that fits one server blocks: it can use GPUs a group frees.
                head = ledger.first_queued(top)
                if head is not None and head[-1] != job.id and now - ledger.jobs[head[-1]].submitted_at >= block_s:
                    blocker = head[-1]  # it stays first for the rest of this walk
            if large_head is None and job.gpus > top:
                head = ledger.first_queued(top)
                if head is not None and self._large_block(ledger, head) is not None:
                    large_head = head  # it stays the one for the rest of this walk
            at = ledger.order(job)
            cand = None
            if self._reserved is None:
                cand = find_placement(ledger, job, self.config, FREE_FILTERS, misses)
            awaited = shrunk_for.get(job.id) if cand is None else None
            if awaited is not None:
                moving = sorted(j for j in awaited if ledger.state.get(j) == "MIGRATING")
                if moving:
                    # Placed last round on GPUs a shrink frees: live, its start waits for that
                    # move to end, the shrinking job seen on all its GPUs meanwhile. Time-sliced
                    # elsewhere instead (demo of session 52: beside a job then moved onto the
                    # freed GPU), the shrink was for another job.
                    if self.config.queue_reasons:
                        out.append(Queue(job.id, f"waits for the GPUs that job {', '.join(moving)} frees "
                                                 f"(shrunk back for it)"))
                    continue
                del shrunk_for[job.id]  # its shrinks ended (or failed): placed as any job
            if cand is None and ledger.grown and self._reserved is None and (job.gpus, host_need(job)) not in unshrunk:
                # Only shrinks whose freed GPUs place this job (growshrink.shrink_for); none
                # placing it, none is made, and a later job of another size may try.
                def free_place(job: JobView = job) -> Candidate | None:
                    return find_placement(ledger, job, self.config, FREE_FILTERS, misses)
                shrinks, cand = shrink_for(ledger, free_place, reason=f"job {job.id} needs GPUs")
                out += shrinks
                if cand is None:
                    unshrunk.add((job.gpus, host_need(job)))
                else:
                    shrunk_for[job.id] = frozenset(d.job_id for d in shrinks)
            if cand is None and (not shut(job.gpus) or self._reserved is not None):
                filters = ALGORITHM_1 if self._reserved is None else OVERSUBSCRIBE_ONLY
                cand = find_placement(ledger, job, self.config, filters, misses)
            elif cand is None and one_group and blocker is None:
                # large_block_one_group: held by the large block, it may still join a group
                # of its count, but not the one closest to draining (left to drain).
                cand = find_placement(ledger, job, self.config, OVERSUBSCRIBE_NOT_DRAINING, misses)
            if cand is None:
                if self.config.queue_reasons:
                    why = self._queue_reason(ledger, job, reasons)
                    if blocker is not None and self._reserved is None:
                        why = (f"job {blocker} has waited {now - ledger.jobs[blocker].submitted_at:.0f}s; "
                               f"until it runs, later jobs do not join time-slice groups ({why})")
                    elif large_head is not None and shut(job.gpus) and self._reserved is None:
                        why = (f"job {large_head[-1]} fits one server and {self._large_block(ledger, large_head)}; "
                               f"until it runs, jobs larger than a server ({top} GPUs) queued after it do not join "
                               + ("the time-slice group of their GPU count closest to draining " if one_group
                                  else "time-slice groups ") + f"({why})")
                    out.append(Queue(job.id, why))
                if (self._reserved is None and limit is not None
                        and ledger.snapshot.now - job.submitted_at >= limit
                        and (job.gpus > top or not self.config.reserve_large_only)):
                    self._reserved = job.id
                continue
            out += self._start(ledger, job, cand.gpus, cand.oversubscribed, f"Algorithm 1: {cand.filter}")
        return out

    def _large_block(self, ledger: Ledger, head: QueueKey) -> str | None:
        """Why jobs larger than a server queued after ``head`` (the first queued job that fits
        one server) may not join time-slice groups, or None: it has waited
        ``large_block_after_s``, or (``groupless_block``) no time-slice group of its GPU count
        exists, so that no filter and no first turn can place it and it waits for free GPUs,
        which only draining groups give."""
        cfg, job = self.config, ledger.jobs[head[-1]]
        waited = ledger.snapshot.now - job.submitted_at
        why = None
        if cfg.large_block_after_s is not None and waited >= cfg.large_block_after_s:
            why = f"has waited {waited:.0f}s"
        elif cfg.groupless_block and not ledger.groups_by_size.get(job.gpus):
            why = f"no time-slice group of {job.gpus}-GPU jobs exists"
        if why is not None and cfg.large_block_lapse:
            # Holding newcomers back frees servers soon only where a group of jobs larger
            # than a server is down to one job; where each still has jobs waiting their
            # turns, it frees nothing until all of them end: the block lapses.
            top = ledger.max_server_gpus
            if not any(len(ledger.members(g)) <= 1 for size, groups in ledger.groups_by_size.items()
                       if size > top for g in groups):
                return None
        return why

    def _start(self, ledger: Ledger, job: JobView, gpus: Placement, shared: bool, reason: str) -> list[Decision]:
        """Place ``job`` on ``gpus``; on a time-slice group the newcomer runs first, so that
        every job gets early feedback, and the incumbent waits for its next turn."""
        out: list[Decision] = []
        if shared:
            why = f"time-slice with new job {job.id}"
            for other in ledger.running_on(gpus):
                ledger.set_state(other, "SUSPENDED")
                end_trials_of(ledger, self.state, self.config, other, why)
                out.append(Suspend(other, reason=why))
        ledger.bind(job.id, gpus, "RUNNING")
        out.append(Place(job.id, gpus, reason=reason))
        return out

    def _probe(self, ledger: Ledger) -> list[Decision]:
        """``probe_slices``: queued jobs that have never run, and found no place, join a
        full time-slice group of their GPU count for their first turn (one at a time per
        group; the group's servers' host memory permitting)."""
        cfg, probes = self.config, self.state.probes
        out: list[Decision] = []
        taken = {ledger.placement.get(j) for j in probes}
        # The blocks of _place_queued hold for first turns too: once the first queued job
        # that fits a server has waited share_block_after_s, no job behind it joins a group;
        # once it has waited large_block_after_s, no job larger than a server behind it does
        # (else first turns would keep the large groups from draining for it).
        top, now = ledger.max_server_gpus, ledger.snapshot.now
        head = ledger.first_queued(top)
        waited = now - ledger.jobs[head[-1]].submitted_at if head is not None else -math.inf
        share_shut = cfg.share_block_after_s is not None and waited >= cfg.share_block_after_s
        large_shut = head is not None and self._large_block(ledger, head) is not None
        for size in sorted(ledger.queued_by_size):
            eldest = ledger.eldest_of(size) if cfg.eldest_runs else None
            own = ledger.placement[eldest] if eldest is not None else None
            if own is not None and not cfg.eldest_first_turns:  # eldest_runs: its group is its own
                taken.add(own)
            groups = [
                g for g in ledger.groups_by_size.get(size, ())
                if g not in taken and (len(ledger.members(g)) >= cfg.max_jobs_per_gpu or g == own)
                and not any(x.server in ledger.held for x in g)
                and all(ledger.servers.get(x.server) is not None for x in g) and takes_turns(ledger, g)
            ]
            if not groups:
                continue
            # eldest_first_turns: the eldest's group takes a first turn only when no full
            # group of the size can (its slice order then hands the GPUs back to the eldest
            # and eldest_alone parks the newcomer).
            groups.sort(key=lambda g: (g == own, len(ledger.members(g)), g))
            spare = large_shut and size > top and cfg.large_block_one_group and not share_shut
            if spare:  # large_block_one_group: every group but the one closest to draining
                drain = draining_group(ledger, size)
                groups = [g for g in groups if g != drain]
                if not groups:
                    continue
            for key in list(ledger.queued_by_size.get(size, ())):
                if (head is not None and key > head and not spare
                        and (share_shut or (large_shut and size > top))):
                    break  # behind the head in queue order, as is every later key of this size
                job = ledger.jobs[key[-1]]
                if job.steps or job.attained_service_s or ledger.state[job.id] != "QUEUED":
                    continue  # it has run before: it gets a turn when its group has room
                fit = next((g for g in groups if host_ok(ledger, job, g, cfg)), None)
                if fit is None:
                    break
                groups.remove(fit)
                probes[job.id] = fit
                out += self._start(ledger, job, fit, True, "probe slice: first turn in a full time-slice group")
                if not groups:
                    break
        return out

    def _park(self, ledger: Ledger, out: list[Decision]) -> list[Decision]:
        """Park each probing newcomer whose first turn is over while its group still holds
        more than the cap: it leaves the GPUs and its host memory to the group's members
        (before rotation, so that the group's next unit runs at once). A turn is at least one
        quantum and lasts until the job's first ``PROBE_STEPS`` mini-batches, the early
        feedback it was let in for. A newcomer whose group has room again, or that was
        moved, stays on as an ordinary member; so does one its runtime has meanwhile found
        not migratable (a ``tf.data`` iterator, say): a park restarts the job from its
        checkpoint, which such a job cannot survive, so it is only ever suspended in place
        and its group holds one job over the cap until a member leaves. One found not under
        the runtime at all (not suspendable) cannot be checkpointed either: it keeps the
        GPUs until it ends, as such a job does in any group."""
        cap, now = self.config.max_jobs_per_gpu, ledger.snapshot.now
        parked: dict[str, Park] = {}  # whom each finished turn parks -> its decision
        for job_id, gpus in list(self.state.probes.items()):
            state = ledger.state.get(job_id)
            if (state is None or ledger.placement.get(job_id) != gpus or len(ledger.members(gpus)) <= cap
                    or not ledger.jobs[job_id].migratable or not ledger.jobs[job_id].suspendable):
                del self.state.probes[job_id]
                continue
            if state == "RUNNING":
                until = probe_turn_ends(ledger.jobs[job_id], now, self.config.quantum_s)
                if until is not None:
                    self.state.wake_at(until)
                    continue
            elif state != "SUSPENDED":
                continue
            del self.state.probes[job_id]
            victim = self._ranked_last(ledger, job_id, gpus, now)
            why = "first turn over: parked"
            end_trials_of(ledger, self.state, self.config, victim, why)
            reason = ("first turn over and its time-slice group is full: checkpointed, back in the queue"
                      if victim == job_id else
                      f"newcomer {job_id} ranks ahead of it in its full time-slice group: checkpointed, "
                      f"back in the queue")
            parked[victim] = park(ledger, self.state, victim, reason)  # a pair no longer takes turns together
        if not parked:
            return out
        # A job suspended by this call's rotation is parked instead (one decision).
        kept = [d for d in out if not (isinstance(d, Suspend) and d.job_id in parked)]
        return kept + [parked[victim] for victim in sorted(parked)]

    def _ranked_last(self, ledger: Ledger, newcomer: str, gpus: Placement, now: float) -> str:
        """Whom a newcomer's finished first turn parks: the newcomer, or with
        ``probe_park_last`` the suspended member free to move that the group's slice order
        ranks last, if that is not the newcomer."""
        cfg, state = self.config, self.state
        if not (cfg.probe_park_last and cfg.las_slices):
            return newcomer
        free = [m for m in ledger.members(gpus)
                if m != newcomer and ledger.state[m] == "SUSPENDED" and ledger.jobs[m].suspendable
                and movable(ledger, m, state)]
        if not free:
            return newcomer
        return ranked_last(ledger, state, cfg, [newcomer, *free], now)
