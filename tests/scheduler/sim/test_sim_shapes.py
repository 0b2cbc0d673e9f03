"""Valid but unusual workloads and clusters, through every policy.

What must hold for any input: no server runs more jobs on a GPU than the policy allows, every
job that fits the cluster finishes exactly once, no job finishes sooner than it can alone,
the GPU-seconds of service add up to the busy time, virtual time never goes back, the same
input gives the same result, and the summary agrees with the per-job times.
"""

from __future__ import annotations

import pytest

from scheduler.policy import get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import offered_load, scale_to_load
from scheduler.sim.metrics import summarize, utilization_series
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

MODEL = MechanismModel.default()


def test_target_load_is_the_load_of_the_jobs_replayed() -> None:
    """--target-load counted the work of jobs larger than the whole cluster, which the replay
    skips: ITP cluster02 on 8x4 (14 jobs of 64 GPUs) was replayed at load 0.75 for 0.9."""
    servers = make_cluster("2x4")
    jobs = generate(60, seed=1, max_gpus=8) + [JobSpec("wide", 500.0, 16, "resnet50", duration_s=7 * 86400)]
    scaled, _ = scale_to_load(jobs, servers, MODEL, 0.9)
    runs = [j for j in scaled if j.num_gpus <= 8]
    span = max(j.submit_time for j in runs) - min(j.submit_time for j in runs)
    demand = sum(j.num_gpus * (j.duration_s or 0.0) for j in runs)
    assert len(runs) == 60 and abs(demand / (8 * span) - 0.9) < 1e-9
    assert abs(offered_load(scaled, servers, MODEL) - 0.9) < 1e-9


def test_the_utilization_plot_starts_at_the_first_arrival() -> None:
    """The series began at virtual time 0: a trace whose first job arrives at 1e7 s (ITP
    cluster10's first arrives after 630 h) was plotted as idle GPUs for the first 99% of its
    x axis, and the plot's mean was not the table's utilization."""
    jobs = [JobSpec("a", 1e7, 2, "resnet50", duration_s=3600), JobSpec("b", 1e7 + 1800, 4, "vae", duration_s=3600)]
    result = Simulator(jobs, make_cluster("1x8"), get_policy("yarn-cs"), MODEL).run()
    xs, ys = utilization_series(result)
    assert 0 < xs[0] < xs[-1] < 1.5  # hours since the first arrival: the makespan is 1.5 h
    assert ys[0] == 0.25 and ys[-1] == 0.5  # busy from the first bucket on: 2 of 8 GPUs, then 4
    assert sum(ys) / len(ys) == pytest.approx(summarize(result)["utilization"], rel=1e-9)
