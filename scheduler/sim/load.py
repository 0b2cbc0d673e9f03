"""``--target-load``: compress or stretch arrival times to a chosen offered load.

Offered load = total GPU-time demanded (each job's GPUs x its duration alone) divided
by (the cluster's GPUs x the trace's span from first to last arrival), over the jobs the
replay runs (not those larger than the whole cluster, which it skips). Arrival
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


def replayed(jobs: list[JobSpec], servers: tuple[ServerView, ...]) -> list[JobSpec]:
    """The jobs a replay on ``servers`` runs: those no larger than the whole cluster (the
    simulator skips the others, and counts them)."""
    total = sum(s.num_gpus for s in servers)
    return [j for j in jobs if j.num_gpus <= total]


def offered_load(jobs: list[JobSpec], servers: tuple[ServerView, ...], model: MechanismModel) -> float:
    """The load of the jobs the replay runs: jobs larger than the cluster are not replayed,
    so neither their work nor their arrivals count (inf: fewer than two arrival times)."""
    jobs = replayed(jobs, servers)
    if not jobs:
        return float("inf")
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
        runs = len(replayed(jobs, servers))
        raise ValueError("all jobs arrive at the same time: the load cannot be scaled" if runs > 1 else
                         "one job to replay: the load cannot be scaled" if runs else
                         f"no job fits the cluster's {sum(s.num_gpus for s in servers)} GPUs: nothing to replay")
    factor = current / target
    t0 = min(j.submit_time for j in jobs)
    scaled = [dataclasses.replace(j, submit_time=t0 + (j.submit_time - t0) * factor) for j in jobs]
    return scaled, factor


def fastest_run_s(job: JobSpec, servers: tuple[ServerView, ...], model: MechanismModel) -> float:
    """The shortest time the job can possibly run: alone, on as few servers as it needs.

    A job that fits one server runs at its alone rate there. A job larger than the
    largest server must span servers, so it runs at least at the spread slowdown
    (``MechanismModel.spread``); no placement avoids it. Packing never speeds a job up
    (Gavel's packed rates are at most the alone rate), so nothing runs faster.
    """
    duration = duration_alone(job, model)
    if job.num_gpus > max(s.num_gpus for s in servers):
        factor = model.spread(job.model, job.num_gpus)
        return duration / factor if factor > 0 else float("inf")
    return duration


def makespan_bound(jobs: list[JobSpec], servers: tuple[ServerView, ...],
                   model: MechanismModel) -> tuple[float, JobSpec | None]:
    """(a makespan no policy can beat, the job that sets it).

    The latest (arrival + fastest possible run) over all jobs, measured from the first
    arrival: that job cannot finish earlier under any policy, whatever the others do.
    Jobs larger than the cluster are left out (the simulator skips them).
    """
    fits = replayed(jobs, servers)
    if not fits:
        return 0.0, None
    t0 = min(j.submit_time for j in fits)
    last = max(fits, key=lambda j: j.submit_time + fastest_run_s(j, servers, model))
    return last.submit_time + fastest_run_s(last, servers, model) - t0, last
