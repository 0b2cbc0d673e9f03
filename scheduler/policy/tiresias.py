"""``tiresias``: discretized two-dimensional least-attained-service (Tiresias' ``dlas-gpu``).

What it models (Gu et al., NSDI'19, and the ``dlas-gpu`` scheduler of its simulator,
SymbioticLab/Tiresias): a job's attained service is GPUs x seconds run (the two
dimensions). There are ``len(tiresias_thresholds_gpu_s) + 1`` priority queues; a new job
joins the end of the first. A running job whose service since it last entered the
first queue reaches its queue's threshold moves to the end of the next queue (one
queue per event, as the original checks once per event). At every event the queues are
walked in order, and inside a queue in its order; each job is admitted while its GPUs
fit the GPUs not yet handed out (a job that does not fit is skipped, not waited for);
running jobs that are not admitted are preempted, admitted pending jobs start. After
the walk every queue is reordered as the original does: the jobs running now first,
then the pending ones, each part in its previous order - so a running job stays ahead
of a pending job of the same queue, and a just-preempted job goes to the head of the
pending part. Starvation (the original's ``dlas-gpu-N`` variants, off in its default
``dlas-gpu``): with ``tiresias_starve_factor`` N > 0, a pending job outside the first
queue that has waited N times as long as it ran since it last entered the first queue
goes back to the end of the first queue, its count started afresh.

Where we differ from the original, on purpose: Tiresias has no job-side hook, so a
preemption is a checkpoint-kill-restart that costs ``--restart-s`` (the original's is
free); a started job is placed on free GPUs, on one server when one has room, else
spread (the original's ``dlas-gpu`` only counts GPUs); times are not rounded to seconds.

The queues are kept between calls (``_Queues``); a fresh policy (a restarted live
scheduler) files the jobs it finds by their attained service. A call visits the jobs
that run or start; a queue's pending part (``_Pending``) is filed by GPU count as well,
so its walk steps over the jobs too large for the GPUs left and stops once none is left:
a call costs time in proportion to the running jobs and decisions, not to the queue.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from scheduler.policy.base import Policy
from scheduler.policy.baselines import exclusive_placement
from scheduler.policy.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Place,
    PolicyConfig,
    Queue,
    Resume,
    Suspend,
)


def _holds(job: JobView) -> bool:
    return job.state in ("RUNNING", "MIGRATING")


class _Pending:
    """A queue's pending part: its jobs in order, filed by GPU count as well, so that a walk
    with ``free`` GPUs left visits only the jobs that fit (and the ones it must look at
    whatever their size) instead of every job that waits.

    The order is kept as a position per job: ``push_front`` files jobs before every
    present one, ``append`` after; each GPU count's list is in position order."""

    __slots__ = ("_hi", "_lo", "by_gpus", "gpus", "pos")

    def __init__(self) -> None:
        self.pos: dict[str, int] = {}
        self.gpus: dict[str, int] = {}
        self.by_gpus: dict[int, list[str]] = {}
        self._lo = 0
        self._hi = 0

    def __len__(self) -> int:
        return len(self.pos)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.pos

    def order(self) -> list[str]:
        """Every job, in order (for checks; the walk never needs it whole)."""
        return sorted(self.pos, key=self.pos.__getitem__)

    def append(self, job_id: str, gpus: int) -> None:
        self._hi += 1
        self.pos[job_id] = self._hi
        self.gpus[job_id] = gpus
        self.by_gpus.setdefault(gpus, []).append(job_id)

    def push_front(self, ids: list[str], gpus_of: dict[str, int]) -> None:
        """``ids`` (in their order) before every job already here."""
        ahead: dict[int, list[str]] = {}
        for job_id in reversed(ids):
            self._lo -= 1
            self.pos[job_id] = self._lo
            self.gpus[job_id] = g = gpus_of[job_id]
            ahead.setdefault(g, []).append(job_id)
        for g, part in ahead.items():
            part.reverse()
            self.by_gpus.setdefault(g, [])[0:0] = part

    def remove(self, job_id: str) -> None:
        del self.pos[job_id]
        g = self.gpus.pop(job_id)
        part = self.by_gpus[g]
        part.remove(job_id)
        if not part:
            del self.by_gpus[g]

    def refile(self, job_id: str, gpus: int) -> None:
        """The job's GPU count changed: file it under the new count, in the same place."""
        at = self.pos[job_id]
        self.remove(job_id)
        self.pos[job_id], self.gpus[job_id] = at, gpus
        part = self.by_gpus.setdefault(gpus, [])
        part.insert(bisect.bisect(part, at, key=self.pos.__getitem__), job_id)

    def drop_prefixes(self, visited: dict[int, int], gone: set[str]) -> None:
        """Take the ``gone`` jobs out of the first ``visited[g]`` jobs of each GPU count."""
        for g, n in visited.items():
            part = self.by_gpus[g]
            part[:n] = [j for j in part[:n] if j not in gone]
            if not part:
                del self.by_gpus[g]
        for job_id in gone:
            del self.pos[job_id]
            del self.gpus[job_id]


@dataclass
class _Queues:
    """The priority queues: per queue the running part, the pending part and the jobs
    appended since the last walk (new, demoted or promoted), each in order."""

    run: list[list[str]]
    pend: list[_Pending]
    tail: list[list[str]]
    qid: dict[str, int] = field(default_factory=dict)
    # Attained GPU-seconds when the job last entered the first queue.
    base: dict[str, float] = field(default_factory=dict)
    # When a pending job that had run was last preempted (starvation clock).
    pending_since: dict[str, float] = field(default_factory=dict)
    # (time, job, its pending_since) at which a pending job is due for promotion;
    # an entry whose pending_since changed since is stale and skipped.
    promotions: list[tuple[float, str, float]] = field(default_factory=list)

    @classmethod
    def empty(cls, n: int) -> _Queues:
        return cls([[] for _ in range(n)], [_Pending() for _ in range(n)], [[] for _ in range(n)])

    def _take_out(self, job_id: str, q: int) -> None:
        """Out of whichever part of queue ``q`` holds it."""
        if job_id in self.pend[q]:
            self.pend[q].remove(job_id)
            return
        for part in (self.run[q], self.tail[q]):
            if job_id in part:
                part.remove(job_id)
                return

    def remove(self, job_id: str) -> None:
        self._take_out(job_id, self.qid.pop(job_id))
        self.base.pop(job_id, None)
        self.pending_since.pop(job_id, None)

    def move(self, job_id: str, q: int) -> None:
        """To the end of queue ``q``."""
        self._take_out(job_id, self.qid[job_id])
        self.qid[job_id] = q
        self.tail[q].append(job_id)


class TiresiasPolicy(Policy):
    """Discretized 2D-LAS (Tiresias) with preemption by restart."""

    name = "tiresias"
    preemption = "restart"
    # False: the pending walk visits every pending job in order until no GPU is left, as
    # the original does (the reference the size-skipping walk is tested against).
    incremental = True

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self._wakeup: float | None = None
        self._queues = _Queues.empty(len(self.config.tiresias_thresholds_gpu_s) + 1)
        self._seq: int | None = None

    def next_wakeup(self) -> float | None:
        return self._wakeup

    def _wake(self, when: float) -> None:
        if self._wakeup is None or when < self._wakeup:
            self._wakeup = when

    # --- keeping the queues ---------------------------------------------------------

    def _file(self, snapshot: ClusterSnapshot) -> None:
        """Add new jobs to the queues and drop departed ones (only the changed ones when
        the snapshot says what changed since the one we saw last)."""
        qs, limits = self._queues, self.config.tiresias_thresholds_gpu_s
        delta = snapshot.delta_since(self._seq)
        if delta is not None:
            gone: set[str] = set(delta.removed)
            views: tuple[JobView, ...] = delta.changed
        else:
            present = {j.id for j in snapshot.jobs}
            gone = {j for j in qs.qid if j not in present}
            views = snapshot.jobs
        self._seq = snapshot.seq
        for job_id in gone:
            if job_id in qs.qid:
                qs.remove(job_id)
        for view in views:
            q = qs.qid.get(view.id)
            if q is not None and view.id in qs.pend[q] and qs.pend[q].gpus[view.id] != view.gpus:
                qs.pend[q].refile(view.id, view.gpus)
        fresh = [v for v in views if v.id not in qs.qid]
        # A fresh policy meets running jobs too: running first, then by arrival.
        for view in sorted(fresh, key=lambda v: (v.state != "RUNNING", v.submitted_at, v.arrival, v.id)):
            attained = view.attained_at(snapshot.now)
            q = sum(1 for t in limits if attained >= t)
            qs.qid[view.id] = q
            qs.base[view.id] = 0.0
            qs.tail[q].append(view.id)
            if view.state == "SUSPENDED" and attained > 0:
                self._preempted(view.id, view.last_state_change_at, attained / view.gpus)

    def _preempted(self, job_id: str, at: float, executed_s: float) -> None:
        qs, factor = self._queues, self.config.tiresias_starve_factor
        qs.pending_since[job_id] = at
        if factor > 0 and executed_s > 0 and qs.qid[job_id] > 0:
            heapq.heappush(qs.promotions, (at + factor * executed_s, job_id, at))

    def _promotable(self, jobs: dict[str, JobView], job_id: str, since: float) -> bool:
        """Still pending since ``since`` (the policy's own record: a start clears it), and
        outside the first queue. Not the view's state: a job preempted in this call (or
        whose suspension the live side has not confirmed yet) still shows RUNNING, and
        reading that as 'ran again' dropped every promotion of a job preempted while
        running, so the starvation rule never fired for them."""
        qs = self._queues
        return job_id in jobs and qs.pending_since.get(job_id) == since and qs.qid.get(job_id, 0) > 0

    def _executed(self, view: JobView, now: float) -> float:
        """GPU-seconds run since the job last entered the first queue."""
        return view.attained_at(now) - self._queues.base.get(view.id, 0.0)

    def _demote_and_promote(self, jobs: dict[str, JobView], now: float) -> dict[str, float]:
        """Returns ``_executed`` of the running jobs it looked at (for ``_plan_wakeups``)."""
        qs, limits = self._queues, self.config.tiresias_thresholds_gpu_s
        executed: dict[str, float] = {}
        # Decide every demotion first, then move: a job moves down one queue per event
        # (as the original), never on through the next queue's check in the same call.
        demote: list[tuple[str, int]] = []
        for q in range(len(limits)):
            for job_id in qs.run[q] + qs.tail[q]:
                if jobs[job_id].state == "RUNNING":
                    executed[job_id] = done = self._executed(jobs[job_id], now)
                    if done >= limits[q]:
                        demote.append((job_id, q + 1))
        for job_id, q in demote:
            qs.move(job_id, q)
        while qs.promotions and qs.promotions[0][0] <= now:
            _, job_id, since = heapq.heappop(qs.promotions)
            if not self._promotable(jobs, job_id, since):
                continue  # ran again, finished or already promoted since
            view = jobs[job_id]
            qs.base[job_id] = view.attained_at(now)
            del qs.pending_since[job_id]
            qs.move(job_id, 0)
        return executed

    # --- one event ------------------------------------------------------------------

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        now = snapshot.now
        self._wakeup = None
        ledger = self.ledger_for(snapshot, holds=_holds)
        jobs = ledger.jobs
        self._file(snapshot)
        qs = self._queues
        executed = self._demote_and_promote(jobs, now)
        free = ledger.num_gpus - sum(jobs[j].gpus for j in ledger.by_state.get("MIGRATING", ()))
        # A running job that cannot be stopped (no runtime) keeps its GPUs: never preempted.
        fixed = {j for j in ledger.by_state.get("RUNNING", ()) if not jobs[j].suspendable}
        free -= sum(jobs[j].gpus for j in fixed)
        stop: list[str] = []
        start: list[str] = []

        def admit(job_id: str) -> bool:
            """Hand the job GPUs if they are left; record what changes for it."""
            nonlocal free
            view = jobs[job_id]
            if view.state == "MIGRATING" or job_id in fixed:
                return True  # its GPUs were counted out above
            if free >= view.gpus:
                free -= view.gpus
                if view.state != "RUNNING":
                    start.append(job_id)
                return True
            if view.state == "RUNNING":
                stop.append(job_id)
            return False

        # Pending jobs whose view still holds GPUs (the live side has not suspended them
        # yet, or they migrate): the pending walk visits these whatever their size.
        held = ledger.by_state.get("RUNNING", set())
        if ledger.by_state.get("MIGRATING"):
            held = held | ledger.by_state["MIGRATING"]

        def walk_pending(pend: _Pending, odd: list[str], new_run: list[str]) -> None:
            """Visit the pending part in order while GPUs are left, as a plain walk over
            every pending job would, but step over the jobs too large for the GPUs left
            (a plain walk visits them and admits none: ``free`` only falls): at each step
            the next job is the first, by position, of the heads of the GPU counts that
            fit and of ``odd`` (jobs admit() must see whatever their size)."""
            if not self.incremental:
                for job_id in pend.order():
                    if free <= 0:
                        break
                    if admit(job_id):
                        new_run.append(job_id)
                        pend.remove(job_id)
                return
            pos, parts = pend.pos, pend.by_gpus
            odd.sort(key=pos.__getitem__)
            skip = set(odd)
            sizes = sorted(parts)
            seen = dict.fromkeys(sizes, 0)
            admitted: set[str] = set()
            o = 0
            while free > 0:
                best, best_at, best_g = "", float("inf"), 0
                for g in sizes:
                    if g > free:
                        break
                    part, i = parts[g], seen[g]
                    while i < len(part) and part[i] in skip:
                        i += 1
                    seen[g] = i
                    if i < len(part) and pos[part[i]] < best_at:
                        best, best_at, best_g = part[i], pos[part[i]], g
                if o < len(odd) and pos[odd[o]] < best_at:
                    job_id = odd[o]
                    o += 1
                elif best_g:
                    job_id = best
                    seen[best_g] += 1
                else:
                    break
                if admit(job_id):
                    new_run.append(job_id)
                    admitted.add(job_id)
            pend.drop_prefixes(seen, admitted.difference(odd))
            for job_id in admitted.intersection(odd):
                pend.remove(job_id)

        for q in range(len(qs.run)):
            new_run: list[str] = []
            preempted: list[str] = []
            for job_id in qs.run[q]:
                (new_run if admit(job_id) else preempted).append(job_id)
            # The pending part is walked only while GPUs are left (a job the live side
            # has not suspended yet is found again at the next call).
            pend = qs.pend[q]
            if free > 0 and pend:
                walk_pending(pend, list(pend.pos.keys() & held), new_run)
            for job_id in qs.tail[q]:
                if admit(job_id):
                    new_run.append(job_id)
                else:
                    pend.append(job_id, jobs[job_id].gpus)
            pend.push_front(preempted, {j: jobs[j].gpus for j in preempted})
            qs.run[q] = new_run
            qs.tail[q] = []
        out: list[Decision] = []
        for job_id in stop:
            view = jobs[job_id]
            ledger.unbind(job_id)
            self._preempted(job_id, now, self._executed(view, now) / view.gpus)
            out.append(Suspend(job_id, reason="preempted by jobs with less attained service"))
        for job_id in start:
            view = jobs[job_id]
            gpus = exclusive_placement(ledger, view, self.config)
            if gpus is None:  # cannot happen while admission counts free GPUs; kept safe
                continue
            ledger.bind(job_id, gpus, "RUNNING")
            qs.pending_since.pop(job_id, None)
            if view.state == "QUEUED":
                out.append(Place(job_id, gpus, reason="least attained service"))
            else:
                out.append(Resume(job_id, gpus, reason="least attained service"))
        if self.config.queue_reasons:
            started = set(start)
            for job_id in sorted(ledger.by_state.get("QUEUED", ())):
                if job_id not in started:
                    out.append(Queue(job_id, "jobs with less attained service hold the GPUs"))
        self._plan_wakeups(jobs, now, executed)
        return out

    def _plan_wakeups(self, jobs: dict[str, JobView], now: float, executed: dict[str, float]) -> None:
        qs, limits = self._queues, self.config.tiresias_thresholds_gpu_s
        for q, part in enumerate(qs.run):
            if q >= len(limits):
                break
            for job_id in part:
                view = jobs[job_id]
                if view.state == "RUNNING":
                    done = executed.get(job_id)
                    if done is None:  # admitted from the pending part, not yet suspended live
                        done = self._executed(view, now)
                    self._wake(now + max(0.0, limits[q] - done) / view.gpus)
        while qs.promotions:
            when, job_id, since = qs.promotions[0]
            if self._promotable(jobs, job_id, since):
                self._wake(when)
                break
            heapq.heappop(qs.promotions)
