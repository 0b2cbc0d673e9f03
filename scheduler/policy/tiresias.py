"""``tiresias``: discretized two-dimensional least-attained-service with preemption.

What it models (Gu et al., NSDI'19, "Tiresias"): a job's attained service is GPUs x
seconds run so far (the two dimensions). Jobs sit in priority queues split at
``tiresias_thresholds_gpu_s``; lower queues go first and, within a queue, earlier
arrivals go first. Every call, jobs are admitted in that order while their GPUs fit
the cluster; running jobs outside the admitted set are preempted. A job that has
waited ``tiresias_starve_factor`` times as long as it has run is promoted to the
first queue (Tiresias' starvation guard). Tiresias has no job-side hook, so its
preemption is checkpoint-kill-restart (``preemption = "restart"``), and a resumed job
may land on any free GPUs (consolidated when possible).
"""

from __future__ import annotations

from scheduler.policy.base import Policy
from scheduler.policy.baselines import exclusive_placement
from scheduler.policy.types import ClusterSnapshot, Decision, JobView, Place, Queue, Resume, Suspend


def _holds(job: JobView) -> bool:
    return job.state in ("RUNNING", "MIGRATING")


class TiresiasPolicy(Policy):
    """Discretized 2D-LAS (Tiresias) with preemption by restart."""

    name = "tiresias"
    preemption = "restart"
    _wakeup: float | None = None

    def next_wakeup(self) -> float | None:
        return self._wakeup

    def _queue_index(self, job: JobView, now: float) -> int:
        attained = job.attained_at(now)
        executed = attained / job.gpus
        if job.state != "RUNNING" and executed > 0:
            promote_at = job.last_state_change_at + self.config.tiresias_starve_factor * executed
            if now >= promote_at:
                return 0
            self._wake(promote_at)
        idx = sum(1 for t in self.config.tiresias_thresholds_gpu_s if attained >= t)
        if job.state == "RUNNING":
            for t in self.config.tiresias_thresholds_gpu_s:
                if attained < t:
                    self._wake(now + (t - attained) / job.gpus)
                    break
        return idx

    def _wake(self, when: float) -> None:
        if self._wakeup is None or when < self._wakeup:
            self._wakeup = when

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        now = snapshot.now
        self._wakeup = None
        capacity = sum(s.num_gpus for s in snapshot.servers if s.up)
        active = [j for j in snapshot.jobs if j.state != "MIGRATING"]
        # A running job that cannot be stopped (no runtime) keeps its GPUs: admitted first.
        fixed = {j.id for j in active if j.state == "RUNNING" and not j.suspendable}
        order = sorted(active, key=lambda j: (j.id not in fixed, self._queue_index(j, now),
                                              j.submitted_at, j.id))
        admitted: set[str] = set()
        used = sum(j.gpus for j in snapshot.jobs if j.state == "MIGRATING")
        for job in order:
            if job.id in fixed or used + job.gpus <= capacity:
                admitted.add(job.id)
                used += job.gpus
        # Only running jobs hold GPUs: a preempted job gave its GPUs back.
        ledger = self.ledger_for(snapshot, holds=_holds)
        out: list[Decision] = []
        for job in snapshot.jobs:
            if job.state == "RUNNING" and job.id not in admitted:
                ledger.unbind(job.id)
                out.append(Suspend(job.id, reason="preempted by jobs with less attained service"))
        for job in order:
            if job.id not in admitted or job.state in ("RUNNING", "MIGRATING"):
                continue
            gpus = exclusive_placement(ledger, job, self.config)
            if gpus is None:
                if job.state == "QUEUED":
                    out.append(Queue(job.id, f"needs {job.gpus} free GPUs together"))
                continue
            ledger.bind(job.id, gpus, "RUNNING")
            if job.state == "QUEUED":
                out.append(Place(job.id, gpus, reason="least attained service"))
            else:
                out.append(Resume(job.id, gpus, reason="least attained service"))
        for job in order:
            if job.id not in admitted and job.state == "QUEUED":
                out.append(Queue(job.id, "jobs with less attained service hold the GPUs"))
        return out
