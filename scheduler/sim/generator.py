"""The project's own synthetic workload: Philly-like arrivals, sizes and durations.

Distributions (documented in docs/simulator.md; chosen from the published Philly
characterisation, Jeon et al. ATC'19, and the GPU-count mix of the Gavel msr traces):
- arrivals: Poisson, ``mean_interarrival_s`` apart on average;
- GPU counts: 1 (70%), 2 (4%), 4 (13%), 8 (11%), 16 (1.5%), 32 (0.5%), capped at
  ``max_gpus``;
- durations alone: log-normal, median ``median_duration_s`` (30 min), sigma 1.8,
  clipped to [60 s, 7 days] - many short jobs, a heavy tail of long ones;
- models: drawn uniformly from the mechanism model's built-in table;
- hyper-parameter multi-jobs: with probability ``multi_job_prob`` an arrival is a
  search of 4-16 one-GPU jobs of one model submitted together (AutoML), shorter
  (median / 4) since searches stop early.
The same seed always gives the same workload.

Other shapes, for evaluating on workloads the policy was not measured on
(``benchmarks/sim_heldout.py``); each left at its default draws exactly what it drew before:
- ``burst_max`` > 1: arrivals come in bursts, 1 to ``burst_max`` jobs (uniformly) at one
  instant, the instants ``mean_interarrival_s`` apart on average;
- ``gpu_mix``: another GPU-count mix, ``((gpus, weight), ...)`` (e.g. mostly large jobs);
- ``duration_sigma``: the log-normal's sigma (2.5: a heavier tail than Philly's 1.8).
"""

from __future__ import annotations

import math
import random

from scheduler.sim.model import DEFAULT_MODELS
from scheduler.sim.trace import JobSpec

GPU_MIX = ((1, 0.70), (2, 0.04), (4, 0.13), (8, 0.11), (16, 0.015), (32, 0.005))


MAX_JOBS = 1_000_000


def generate(
    num_jobs: int,
    seed: int = 0,
    mean_interarrival_s: float = 60.0,
    median_duration_s: float = 1800.0,
    max_gpus: int = 32,
    multi_job_prob: float = 0.05,
    grow_shrink_prob: float = 0.0,
    burst_max: int = 1,
    gpu_mix: tuple[tuple[int, float], ...] = GPU_MIX,
    duration_sigma: float = 1.8,
) -> list[JobSpec]:
    """``num_jobs`` jobs sorted by submit time; deterministic for a given seed."""
    if burst_max < 1:
        raise ValueError(f"burst_max must be at least 1 (one job per arrival), got {burst_max}")
    if duration_sigma < 0:
        raise ValueError(f"duration_sigma must not be negative, got {duration_sigma}")
    if not gpu_mix or any(g < 1 or w < 0 for g, w in gpu_mix) or not any(w > 0 for _, w in gpu_mix):
        raise ValueError(f"gpu_mix must be (gpus >= 1, weight >= 0) pairs with some weight, got {gpu_mix!r}")
    if num_jobs < 1:
        raise ValueError(f"num_jobs must be at least 1, got {num_jobs}")
    if num_jobs > MAX_JOBS:  # a typo (--jobs 100000000) must not fill the memory for minutes
        raise ValueError(f"--jobs {num_jobs:,} is more than the generator makes ({MAX_JOBS:,}; the largest "
                         f"trace we know has 15,802 jobs)")
    rng = random.Random(seed)
    models = sorted(DEFAULT_MODELS)
    sizes = [g for g, _ in gpu_mix if g <= max_gpus] or [1]
    weights = [w for g, w in gpu_mix if g <= max_gpus] or [1.0]
    jobs: list[JobSpec] = []
    t = 0.0
    burst = 0  # jobs still to come at instant t
    while len(jobs) < num_jobs:
        if burst == 0:
            t += rng.expovariate(1.0 / mean_interarrival_s)
            burst = rng.randint(1, burst_max) if burst_max > 1 else 1
        burst -= 1
        model = rng.choice(models)
        if rng.random() < multi_job_prob:
            group = f"hp{len(jobs)}"
            for _ in range(min(rng.randint(4, 16), num_jobs - len(jobs))):
                jobs.append(_job(rng, len(jobs), t, 1, model, median_duration_s / 4, group, 0.0, duration_sigma))
            continue
        gpus = rng.choices(sizes, weights)[0]
        jobs.append(_job(rng, len(jobs), t, gpus, model, median_duration_s, None, grow_shrink_prob, duration_sigma))
    return jobs


def _job(rng: random.Random, n: int, t: float, gpus: int, model: str, median: float,
         group: str | None, grow_prob: float, sigma: float = 1.8) -> JobSpec:
    duration = min(7 * 86400.0, max(60.0, math.exp(rng.gauss(math.log(median), sigma))))
    return JobSpec(id=f"job-{n}", submit_time=round(t, 3), num_gpus=gpus, model=model,
                   duration_s=round(duration, 1), multi_job=group,
                   grow_shrink=rng.random() < grow_prob)
