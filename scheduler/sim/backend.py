"""SimClock and SimBackend: the simulated cluster the policy's decisions act on.

The backend keeps, per job, its state, placement and progress. Progress is kept
lazily: steps(t) = anchor_steps + rate x (t - max(anchor_t, paused_until)), and the
anchor moves only when the job's rate changes, so an event costs time in proportion
to the jobs it touches, not to the cluster size.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from scheduler.policy.types import (
    Decision,
    GpuRef,
    Grow,
    JobProfile,
    Migrate,
    Pack,
    Park,
    Place,
    Queue,
    Resume,
    ServerView,
    Shrink,
    Suspend,
    Unpack,
)
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec


class SimClock:
    """Virtual time in seconds; only the simulator moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance_to(self, t: float) -> None:
        if t < self.now:
            raise ValueError(f"the clock cannot go back from {self.now} to {t}")
        self.now = t


@dataclass
class SimJob:
    """A job's simulated life; times are virtual seconds."""

    spec: JobSpec
    total_steps: float
    profile: JobProfile
    state: str = "QUEUED"
    placement: tuple[GpuRef, ...] = ()
    arrival: int = 0  # its place in the replay's arrivals (JobView.arrival)
    anchor_t: float = 0.0
    anchor_steps: float = 0.0
    attained_anchor: float = 0.0
    paused_until: float = 0.0
    rate: float = 0.0
    last_rate: float | None = None
    # Its placement and rate when it last ran there with no other job running on its GPUs
    # (JobView.alone_rate): last_rate may be a packed one.
    alone: tuple[tuple[GpuRef, ...], float] | None = None
    last_change: float = 0.0
    first_run_at: float | None = None
    first_n_at: float | None = None
    finished_at: float | None = None
    version: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    # Parked (checkpointed to disk, back in the queue): its next Place restores it.
    parked: bool = False

    def steps_at(self, t: float) -> float:
        return self.anchor_steps + self.rate * max(0.0, t - max(self.anchor_t, self.paused_until))

    def attained_at(self, t: float) -> float:
        if self.state != "RUNNING":
            return self.attained_anchor
        return self.attained_anchor + len(self.placement) * max(0.0, t - self.anchor_t)


class SimBackend:
    """Applies decisions to simulated jobs and tracks rates, completions and GPU use."""

    def __init__(self, servers: tuple[ServerView, ...], model: MechanismModel,
                 preemption: str, first_n: int) -> None:
        self.servers = servers
        self.model = model
        self.resume_cost = model.costs.restart_s if preemption == "restart" else model.costs.suspend_resume_s
        self.first_n = first_n
        self.gpus = {GpuRef(s.name, i) for s in servers for i in range(s.num_gpus)}
        self.jobs: dict[str, SimJob] = {}
        # The RUNNING jobs on each GPU (only they change each other's rates; a job
        # preempted by restart stays bound to its old GPUs but is not here). A GPU is
        # busy while it has an entry.
        self.run_on: dict[GpuRef, set[str]] = {}
        self.completions: list[tuple[float, int, str]] = []
        self.busy = 0
        # Jobs whose JobView must be rebuilt before the next snapshot.
        self.view_dirty: set[str] = set()
        # Jobs RUNNING now (their progress is reported periodically).
        self.running: set[str] = set()
        self.busy_area = 0.0
        self.busy_t = 0.0
        self.busy_series: list[tuple[float, int]] = [(0.0, 0)]
        self.counts = {"suspends": 0, "resumes": 0, "packs": 0, "unpacks": 0,
                       "migrations": 0, "grows": 0, "shrinks": 0, "parks": 0}
        # Suspended jobs per server now, and the most any server held at once: a suspended
        # job keeps its process and state in its server's host memory (a job spread over
        # servers counts on each).
        # Under restart preemption (tiresias) a preempted job is checkpointed and holds
        # nothing: not counted (``holds_suspended`` False).
        self.holds_suspended = preemption != "restart"
        self.suspended_on: dict[str, int] = {}
        self.max_suspended_on = 0
        # Servers whose count changed in this batch of decisions: the peak is read once a
        # batch is applied (inside one, a group's suspend comes before its resume).
        self._suspended_dirty: set[str] = set()

    # --- bookkeeping --------------------------------------------------------------

    def start(self, now: float) -> None:
        """The replay begins at ``now`` (its first arrival): GPU use is counted from there,
        so a trace whose first job arrives late (ITP cluster10: after 630 h) has no idle
        stretch before it in its utilization series."""
        self.busy_t = now
        self.busy_series = [(now, 0)]

    def add(self, job: SimJob, now: float) -> None:
        job.last_change = now
        self.jobs[job.spec.id] = job

    def _track_busy(self, now: float) -> None:
        """Update the count of GPUs running at least one job."""
        busy = len(self.run_on)
        if busy != self.busy:
            self.busy_area += self.busy * (now - self.busy_t)
            self.busy, self.busy_t = busy, now
            self.busy_series.append((now, busy))

    def _reanchor(self, job: SimJob, now: float) -> None:
        """Fold progress up to ``now`` into the anchor before the rate changes."""
        steps = job.steps_at(now)
        if job.first_n_at is None and steps >= self.first_n and job.rate > 0:
            start = max(job.anchor_t, job.paused_until)
            job.first_n_at = start + (self.first_n - job.anchor_steps) / job.rate
        job.attained_anchor = job.attained_at(now)
        job.anchor_steps, job.anchor_t = min(steps, job.total_steps), now

    def _bind(self, job: SimJob, gpus: tuple[GpuRef, ...]) -> None:
        for g in gpus:
            if g not in self.gpus:
                raise ValueError(f"decision for job {job.spec.id} names unknown GPU {g}")
        running = job.state == "RUNNING"
        suspended = job.state == "SUSPENDED"
        if running:
            self._run_on(job, False)
        if suspended:
            self._count_suspended(job, -1)
        job.placement = gpus
        if running:
            self._run_on(job, True)
        if suspended:
            self._count_suspended(job, 1)

    def _count_suspended(self, job: SimJob, delta: int) -> None:
        if not self.holds_suspended:
            return
        on = self.suspended_on
        for name in {g.server for g in job.placement}:
            on[name] = on.get(name, 0) + delta
            self._suspended_dirty.add(name)

    def _note_suspended_peak(self) -> None:
        dirty = self._suspended_dirty
        if dirty:
            self.max_suspended_on = max(self.max_suspended_on, max(self.suspended_on[n] for n in dirty))
            dirty.clear()

    def _run_on(self, job: SimJob, add: bool) -> None:
        jid = job.spec.id
        for g in job.placement:
            if add:
                self.run_on.setdefault(g, set()).add(jid)
            else:
                ids = self.run_on[g]
                ids.discard(jid)
                if not ids:
                    del self.run_on[g]

    def _effective_rate(self, job: SimJob) -> float:
        if job.state != "RUNNING":
            return 0.0
        k = len(job.placement)
        rate = self.model.alone_rate(job.spec.model, k)
        if len({g.server for g in job.placement}) > 1:
            rate *= self.model.spread(job.spec.model, k)
        others = {o for g in job.placement for o in self.run_on.get(g, ()) if o != job.spec.id}
        for other in others:
            rate *= self.model.packed(job.spec.model, self.jobs[other].spec.model, k)
        return rate

    def refresh(self, touched: set[str], now: float) -> None:
        """Recompute rates and completion times of the touched jobs and their GPU neighbours."""
        affected = set(touched)
        for jid in touched:
            job = self.jobs.get(jid)
            if job is not None:
                for g in job.placement:
                    affected |= self.run_on.get(g, set())
        for jid in affected:
            job = self.jobs.get(jid)
            if job is None or job.finished_at is not None:
                continue
            new = self._effective_rate(job)
            alone = new > 0 and not any(o != jid for g in job.placement for o in self.run_on.get(g, ()))
            if alone and job.alone != (job.placement, new):
                job.alone = (job.placement, new)
                self.view_dirty.add(jid)
            if new == job.rate and jid not in touched:
                continue
            self._reanchor(job, now)
            job.rate = new
            if new > 0:
                job.last_rate = new
                if job.first_run_at is None:
                    job.first_run_at = now
            job.version += 1
            self.view_dirty.add(job.spec.id)
            if new > 0:
                start = max(now, job.paused_until)
                done = start + (job.total_steps - job.anchor_steps) / new
                heapq.heappush(self.completions, (done, job.version, jid))
        self._track_busy(now)

    # --- decisions ----------------------------------------------------------------

    def apply(self, decisions: list[Decision], now: float) -> set[str]:
        """Apply decisions in order; returns the ids of the jobs they changed."""
        touched: set[str] = set()
        for d in decisions:
            if isinstance(d, Queue):
                continue
            job = self.jobs.get(d.job_id)
            if job is None or job.finished_at is not None:
                raise ValueError(f"decision {d!r} names a job that is not active")
            self._reanchor(job, now)
            touched.add(d.job_id)
            # Its GPU neighbours' rates may change (only running ones have a rate).
            touched.update(j for g in job.placement for j in self.run_on.get(g, ()))
            self._apply_one(job, d, now)
            job.last_change = now
            self.view_dirty.add(job.spec.id)
        self._note_suspended_peak()
        return touched

    def _apply_one(self, job: SimJob, d: Decision, now: float) -> None:
        costs = self.model.costs
        if isinstance(d, Place):
            self._expect(job, d, ("QUEUED",))
            self._bind(job, d.gpus)
            self._set_state(job, "RUNNING")
            if job.parked:  # restored from its checkpoint in a new process
                job.parked = False
                job.paused_until = now + costs.restart_s
        elif isinstance(d, Suspend):
            self._expect(job, d, ("RUNNING",))
            self._set_state(job, "SUSPENDED")
            self._count(job, "suspends")
        elif isinstance(d, Park):
            self._expect(job, d, ("SUSPENDED", "RUNNING"))
            self._bind(job, ())
            self._set_state(job, "QUEUED")
            job.parked = True
            self._count(job, "parks")
        elif isinstance(d, (Resume, Pack)):
            self._expect(job, d, ("SUSPENDED", "QUEUED") if isinstance(d, Pack) else ("SUSPENDED",))
            moved = d.gpus != job.placement
            self._bind(job, d.gpus)
            self._set_state(job, "RUNNING")
            job.paused_until = now + (costs.migrate_s if moved and self.resume_cost < costs.migrate_s
                                      else self.resume_cost)
            self._count(job, "packs" if isinstance(d, Pack) else "resumes")
        elif isinstance(d, Unpack):
            self._expect(job, d, ("RUNNING",))
            self._bind(job, d.gpus)
            self._set_state(job, "SUSPENDED")
            self._count(job, "unpacks")
        elif isinstance(d, (Migrate, Grow, Shrink)):
            self._expect(job, d, ("RUNNING", "SUSPENDED"))
            gpus = d.to_gpus if isinstance(d, Migrate) else d.gpus
            self._bind(job, gpus)
            self._set_state(job, "RUNNING")
            job.paused_until = now + costs.migrate_s
            kind = {Migrate: "migrations", Grow: "grows", Shrink: "shrinks"}[type(d)]
            self._count(job, kind)
        else:
            raise TypeError(f"unknown decision {d!r}")

    def _count(self, job: SimJob, kind: str) -> None:
        """One more ``kind`` (suspends, migrations, ...) for the run and for ``job`` (its own
        counts are `gandiva sim --jobs-csv`'s columns)."""
        self.counts[kind] += 1
        job.counts[kind] = job.counts.get(kind, 0) + 1

    def _set_state(self, job: SimJob, state: str) -> None:
        was = job.state == "RUNNING"
        if (job.state == "SUSPENDED") != (state == "SUSPENDED"):
            self._count_suspended(job, 1 if state == "SUSPENDED" else -1)
        job.state = state
        if state == "RUNNING":
            self.running.add(job.spec.id)
            if not was:
                self._run_on(job, True)
        else:
            self.running.discard(job.spec.id)
            if was:
                self._run_on(job, False)

    @staticmethod
    def _expect(job: SimJob, d: Decision, states: tuple[str, ...]) -> None:
        if job.state not in states:
            raise ValueError(f"{type(d).__name__} for job {job.spec.id} in state {job.state}; "
                             f"allowed from {', '.join(states)}")

    # --- completions --------------------------------------------------------------

    def next_completion(self) -> float | None:
        while self.completions:
            t, version, jid = self.completions[0]
            job = self.jobs.get(jid)
            if job is None or job.version != version or job.finished_at is not None:
                heapq.heappop(self.completions)
                continue
            return t
        return None

    def pop_finished(self, now: float) -> list[SimJob]:
        done = []
        while self.completions and self.completions[0][0] <= now + 1e-9:
            t, version, jid = heapq.heappop(self.completions)
            job = self.jobs.get(jid)
            if job is None or job.version != version or job.finished_at is not None:
                continue
            self._reanchor(job, t)
            job.anchor_steps = job.total_steps
            job.finished_at = t
            if job.first_n_at is None:
                job.first_n_at = t  # a job shorter than N mini-batches
            neighbours = {j for g in job.placement for j in self.run_on.get(g, ()) if j != jid}
            self._bind(job, ())
            self._set_state(job, "DONE")
            done.append(job)
            self.refresh(neighbours, t)
        self._track_busy(now)
        return done
