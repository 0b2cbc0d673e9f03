"""The trace-driven simulator: the same Policy object the live scheduler uses, on a SimClock.

The loop jumps from event to event: the next arrival, the next completion, or the
time the policy asked to be woken at (end of a time slice, of a packing trial, ...).
At each event it builds a ClusterSnapshot, calls ``policy.decide`` and applies the
decisions to the SimBackend. A running job's progress fields in the snapshot are
refreshed every ``report_interval_s`` (the live shim also reports periodically; the
view says when, and policies extrapolate attained service from it); state,
placement and rate changes show at once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.policy.base import Policy
from scheduler.policy.types import (
    ClusterSnapshot,
    JobProfile,
    JobView,
    Queue,
    ServerView,
    SnapshotDelta,
)
from scheduler.sim.backend import SimBackend, SimClock, SimJob
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec
from scheduler.validation import MAX_GPUS

logger = logging.getLogger(__name__)
# The policy is woken no sooner than this after the current event, so a policy that
# asks for "now" again cannot stall virtual time.
MIN_WAKEUP_STEP_S = 0.1
MAX_SERVERS = 100_000  # 100,000 servers of 8 GPUs replay 50 jobs in about 20 s; a typo must not hang


def make_cluster(spec: str, gpu_memory_gib: float = 16.0, host_memory_gib: float = 0.0) -> tuple[ServerView, ...]:
    """Servers from ``SERVERSxGPUS`` (e.g. ``25x4``); ValueError says what is wrong.

    ``host_memory_gib``: each server's host memory, which its jobs' processes hold, running
    and suspended (0: not checked, as before the policy could check it)."""
    if host_memory_gib < 0:
        raise ValueError(f"host memory must not be negative, got {host_memory_gib} GiB")
    # ASCII digits only: int() would also take ' 2', '+2', '2_0' and other scripts' digits.
    # Any GPU count per server is a cluster (2x3: servers of 3 GPUs, as a live helper may
    # report); only a job's request is a power of two.
    match = re.fullmatch(r"([0-9]+)[xX]([0-9]+)", spec)
    if match is None:
        raise ValueError(f"cluster {spec!r} is not SERVERSxGPUS, e.g. 25x4")
    n, g = int(match[1]), int(match[2])
    if n < 1 or g < 1:
        raise ValueError(f"cluster {spec!r} needs at least one server with one GPU")
    if n > MAX_SERVERS or g > MAX_GPUS:
        raise ValueError(f"cluster {spec!r} is larger than the simulator replays: at most {MAX_SERVERS} "
                         f"servers of at most {MAX_GPUS} GPUs")
    width = len(str(n - 1))
    return tuple(ServerView(f"server-{i:0{width}d}", g, gpu_memory_bytes=int(gpu_memory_gib * (1 << 30)),
                            host_memory_bytes=int(host_memory_gib * (1 << 30)))
                 for i in range(n))


def skipped_note(jobs: list[JobSpec], servers: tuple[ServerView, ...]) -> str | None:
    """What a replay on ``servers`` leaves out: the jobs needing more GPUs than the whole
    cluster (None when every job fits). ``gandiva sim`` says it once for all its policies;
    a Simulator logs it (``warn_skipped``)."""
    total = sum(s.num_gpus for s in servers)
    wide = [j for j in jobs if j.num_gpus > total]
    if not wide:
        return None
    widest = max(wide, key=lambda j: j.num_gpus)
    return (f"{len(wide)} job(s) need more GPUs than the cluster's {total} (e.g. {widest.id} with "
            f"{widest.num_gpus}) and are left out of this replay, counted as skipped; a cluster of "
            f"{widest.num_gpus} GPUs or more replays them")


@dataclass
class SimResult:
    """What happened to every job, plus cluster-wide counters, for one policy."""

    policy: str
    num_gpus: int
    jobs: list[SimJob]
    counts: dict[str, int]
    busy_series: list[tuple[float, int]]
    busy_gpu_s: float
    unfinished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    decide_calls: int = 0
    # The most suspended jobs one server held at once (each keeps its process and state in
    # the server's host memory); None under restart preemption, where they hold nothing.
    max_suspended_per_server: int | None = None


class Simulator:
    """Replays ``jobs`` on ``servers`` under ``policy`` with the given mechanism model.

    For the length of ``run()`` the policy's ``queue_reasons`` is turned off (the simulator
    ignores Queue decisions, and with it off a decide() call costs time in proportion to
    what it decides); ``run()`` gives the policy its own config back when it returns or
    fails, so the caller's policy object keeps the config it was given.
    """

    def __init__(self, jobs: list[JobSpec], servers: tuple[ServerView, ...], policy: Policy,
                 model: MechanismModel, first_n: int = 100, report_interval_s: float = 300.0,
                 progress: Callable[[int, int], None] | None = None,
                 observer: Callable[[float, dict[str, SimJob]], None] | None = None,
                 warn_skipped: bool = True) -> None:
        self.servers = servers
        self.policy = policy
        self.model = model
        self.first_n = first_n
        self.report_interval_s = report_interval_s
        self.progress = progress
        # Called after every event with the time and the unfinished jobs as they stay until
        # the next event (benchmarks/sim_breakdown.py adds up where GPU-hours go with it).
        self.observer = observer
        # Ids of the jobs whose state or placement the latest event may have changed: those
        # that arrived, finished or were named by a decision, and their GPU neighbours. An
        # observer that keeps its own totals looks at these only (benchmarks/sim_breakdown.py).
        self.changed: set[str] = set()
        self._next_report = 0.0
        self._seq = 0
        self._removed: set[str] = set()
        self.clock = SimClock()
        self.backend = SimBackend(servers, model, policy.preemption, first_n)
        total = sum(s.num_gpus for s in servers)
        self.skipped = [j.id for j in jobs if j.num_gpus > total]
        if self.skipped and warn_skipped:
            logger.warning("%s", skipped_note(jobs, servers))
        self.specs = sorted((j for j in jobs if j.num_gpus <= total), key=lambda j: j.submit_time)

    def _new_job(self, spec: JobSpec) -> SimJob:
        steps = spec.total_steps
        if steps is None:
            steps = (spec.duration_s or 0.0) * self.model.alone_rate(spec.model, spec.num_gpus)
        memory, util = self.model.profile(spec.model)
        alone = self.model.alone_rate(spec.model, spec.num_gpus)
        profile = JobProfile(memory, util, step_time_s=spec.num_gpus / alone if alone else None,
                             host_memory_bytes=int(self.model.job_host_memory_gib * (1 << 30)))
        return SimJob(spec=spec, total_steps=max(1.0, steps), profile=profile)

    def _view(self, job: SimJob, now: float) -> JobView:
        spec = job.spec
        return JobView(
            id=spec.id, gpus=len(job.placement) or spec.num_gpus, priority=spec.priority,
            state=job.state, placement=job.placement, submitted_at=spec.submit_time,
            steps=int(job.steps_at(now)), rate=job.rate if job.state == "RUNNING" else job.last_rate,
            alone_rate=job.alone[1] if job.alone is not None and job.alone[0] == job.placement else None,
            grow_shrink=spec.grow_shrink, profile=job.profile, last_state_change_at=job.last_change,
            attained_service_s=job.attained_at(now), reported_at=now, base_gpus=spec.num_gpus, model=spec.model,
            multi_job=spec.multi_job, arrival=job.arrival,
        )

    def _snapshot(self, now: float, active: dict[str, SimJob], views: dict[str, JobView]) -> ClusterSnapshot:
        """Rebuild only the views that changed (and running ones at each report interval).

        The snapshot says what changed since the previous one (``delta``), so the policy
        looks at those jobs only, not at every job waiting.
        """
        dirty = self.backend.view_dirty
        if now >= self._next_report:
            self._next_report = now + self.report_interval_s
            dirty.update(self.backend.running)
        changed = []
        for jid in sorted(dirty):
            job = active.get(jid)
            if job is not None:
                view = views[jid] = self._view(job, now)
                changed.append(view)
        dirty.clear()
        self._seq += 1
        delta = SnapshotDelta(self._seq - 1, tuple(changed), frozenset(self._removed))
        self._removed.clear()
        return ClusterSnapshot(now, self.servers, tuple(views.values()), seq=self._seq, delta=delta)

    def run(self) -> SimResult:
        policy = self.policy
        given = policy.config
        policy.config = dataclasses.replace(given, queue_reasons=False)
        try:
            return self._run()
        finally:
            policy.config = given

    def _run(self) -> SimResult:
        backend, clock, specs = self.backend, self.clock, self.specs
        active: dict[str, SimJob] = {}
        views: dict[str, JobView] = {}
        self._next_report = 0.0
        finished: list[SimJob] = []
        i, calls, idle_call = 0, 0, False
        if specs:
            clock.advance_to(specs[0].submit_time)
            backend.start(clock.now)
        while i < len(specs) or active:
            t_arrival = specs[i].submit_time if i < len(specs) else math.inf
            t_done = backend.next_completion() or math.inf
            wake = self.policy.next_wakeup()
            t_wake = max(wake, clock.now + MIN_WAKEUP_STEP_S) if wake is not None else math.inf
            if t_arrival == math.inf and t_done == math.inf:
                stalled = idle_call and not any(j.state == "RUNNING" for j in active.values())
                if stalled or t_wake == math.inf:
                    break  # nothing can ever run again: report the rest as unfinished
            t = min(t_arrival, t_done, t_wake)
            clock.advance_to(t)
            changed: set[str] = set()
            for job in backend.pop_finished(t):
                finished.append(active.pop(job.spec.id))
                views.pop(job.spec.id, None)
                self._removed.add(job.spec.id)
                changed.add(job.spec.id)
            while i < len(specs) and specs[i].submit_time <= t:
                job = self._new_job(specs[i])
                job.arrival = i  # the trace's order breaks ties of submit time
                backend.add(job, t)
                active[job.spec.id] = job
                backend.view_dirty.add(job.spec.id)
                changed.add(job.spec.id)
                i += 1
            snapshot = self._snapshot(t, active, views)
            decisions = self.policy.decide(snapshot)
            calls += 1
            idle_call = not any(not isinstance(d, Queue) for d in decisions)
            touched = backend.apply(decisions, t)
            backend.refresh(touched, t)
            changed |= touched
            self.changed = changed
            if self.progress is not None:
                self.progress(len(finished), len(specs))
            if self.observer is not None:
                self.observer(t, active)
        backend.busy_area += backend.busy * (clock.now - backend.busy_t)
        backend.busy_t = clock.now
        return SimResult(
            policy=self.policy.name, num_gpus=sum(s.num_gpus for s in self.servers),
            jobs=finished, counts=dict(backend.counts), busy_series=backend.busy_series,
            busy_gpu_s=backend.busy_area, unfinished=sorted(active), skipped=self.skipped,
            decide_calls=calls,
            max_suspended_per_server=backend.max_suspended_on if backend.holds_suspended else None,
        )
