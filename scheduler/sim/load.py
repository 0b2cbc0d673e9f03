"""``--target-load``: compress or stretch arrival times to a chosen offered load.

Offered load = total GPU-time demanded (each job's GPUs x its duration alone) divided
by (the cluster's GPUs x the trace's span from first to last arrival). Arrival
offsets are multiplied by (current load / target), which makes the load the target.
"""

from __future__ import annotations

import dataclasses

from scheduler.policy.types import ServerView
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec


def duration_alone(job: JobSpec, model: MechanismModel) -> float:
    """Seconds the job would run alone on its GPUs of one server."""
    if job.duration_s is not None:
        return job.duration_s
    return (job.total_steps or 0.0) / model.alone_rate(job.model, job.num_gpus)


def offered_load(jobs: list[JobSpec], servers: tuple[ServerView, ...], model: MechanismModel) -> float:
    span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
    gpus = sum(s.num_gpus for s in servers)
    demand = sum(j.num_gpus * duration_alone(j, model) for j in jobs)
    return demand / (gpus * span) if span > 0 else float("inf")


def scale_to_load(jobs: list[JobSpec], servers: tuple[ServerView, ...], model: MechanismModel,
                  target: float) -> tuple[list[JobSpec], float]:
    """(jobs with scaled arrivals, the factor applied to arrival offsets)."""
    if target <= 0:
        raise ValueError(f"target load must be positive, got {target}")
    current = offered_load(jobs, servers, model)
    if current == float("inf"):
        raise ValueError("all jobs arrive at the same time: the load cannot be scaled")
    factor = current / target
    t0 = min(j.submit_time for j in jobs)
    scaled = [dataclasses.replace(j, submit_time=t0 + (j.submit_time - t0) * factor) for j in jobs]
    return scaled, factor
