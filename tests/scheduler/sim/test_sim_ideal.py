"""``benchmarks/sim_ideal.py``: orders of service on an ideal pooled cluster, the reference
docs/simulator.md measures issue 11's JCT goals against."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sim_ideal import ideal_jct
from scheduler.policy import get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

ROOT = Path(__file__).resolve().parents[3]
H = 3600.0


def _job(i: int, at_h: float, hours: float, gpus: int = 1) -> JobSpec:
    return JobSpec(f"j{i}", at_h * H, gpus, duration_s=hours * H)


def test_each_order_serves_a_long_job_and_a_short_newcomer_as_computed_by_hand() -> None:
    # One GPU; a 10 h job at 0, a 2 h job at 1 h.
    jobs = [_job(0, 0, 10), _job(1, 1, 2)]
    servers, model = make_cluster("1x1"), MechanismModel.default()
    fifo = ideal_jct(jobs, servers, model, "fifo")
    # FIFO: the long job ends at 10 h, the short one waits for it and ends at 12 h.
    assert fifo["avg_jct_s"] == pytest.approx((10 + 11) / 2 * H)
    assert fifo["avg_queueing_s"] == pytest.approx((0 + 9) / 2 * H)
    srpt = ideal_jct(jobs, servers, model, "srpt")
    # SRPT: the newcomer (2 h left against 9 h) runs at once, ends at 3 h; the long one at 12 h.
    assert srpt["avg_jct_s"] == pytest.approx((12 + 2) / 2 * H)
    assert srpt["makespan_s"] == pytest.approx(12 * H)
    # Gittins from these two lengths (2 h and 10 h): while the first job may still be the
    # 2 h one it is closer to its end than a newcomer and keeps the GPU; once its service is
    # past 2 h (at the index grid's point 7,680 s) it is the 10 h one, and the newcomer runs
    # its 2 h. The first job ends at 12 h all the same.
    gittins = ideal_jct(jobs, servers, model, "gittins")
    assert gittins["avg_jct_s"] == pytest.approx((12 * H + (7680 + 2 * H - 1 * H)) / 2)
    assert srpt["avg_jct_s"] < gittins["avg_jct_s"] < fifo["avg_jct_s"]


def test_gittins_lets_newcomers_pass_long_runners_where_lengths_are_heavy_tailed() -> None:
    # Nine 1 h jobs and one of 100 h, on one GPU: a job that has run past 1 h is the long
    # one, so Gittins (knowing only the distribution) serves newcomers first, as LAS would.
    jobs = [_job(0, 0, 100)] + [_job(i, 2 * i, 1) for i in range(1, 10)]
    servers, model = make_cluster("1x1"), MechanismModel.default()
    fifo = ideal_jct(jobs, servers, model, "fifo")
    gittins = ideal_jct(jobs, servers, model, "gittins")
    srpt = ideal_jct(jobs, servers, model, "srpt")
    # Each short job waits behind the 100 h one under FIFO; under Gittins and SRPT it runs
    # on arrival and takes its 1 h.
    assert gittins["avg_jct_s"] == pytest.approx(srpt["avg_jct_s"])
    assert gittins["avg_jct_s"] == pytest.approx((109 + 9 * 1) / 10 * H)
    assert fifo["avg_jct_s"] > 5 * gittins["avg_jct_s"]


def test_fifo_on_one_gpu_jobs_is_the_simulators_yarn_cs() -> None:
    # With one GPU a job there is no locality to lose: the ideal FIFO and yarn-cs agree, job
    # for job, which is what lets the table set the ideal orders against yarn-cs.
    rng = random.Random(7)
    at = 0.0
    jobs = []
    for i in range(60):
        at += rng.expovariate(1 / 0.4)
        jobs.append(_job(i, at, rng.choice([0.2, 1.0, 3.0, 8.0])))
    servers, model = make_cluster("2x2"), MechanismModel.default()
    yarn = summarize(Simulator(jobs, servers, get_policy("yarn-cs"), model).run())
    ideal = ideal_jct(jobs, servers, model, "fifo")
    assert ideal["avg_jct_s"] == pytest.approx(yarn["avg_jct_s"], rel=1e-3)
    assert ideal["avg_queueing_s"] == pytest.approx(yarn["avg_queueing_delay_s"], rel=1e-3, abs=1.0)


def test_a_job_larger_than_the_cluster_is_refused_with_its_count() -> None:
    with pytest.raises(ValueError, match="1 jobs need more GPUs than the cluster's 4"):
        ideal_jct([_job(0, 0, 1, gpus=8)], make_cluster("1x4"), MechanismModel.default(), "fifo")
    with pytest.raises(ValueError, match="unknown order 'lifo'"):
        ideal_jct([_job(0, 0, 1)], make_cluster("1x4"), MechanismModel.default(), "lifo")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/sim_ideal.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_table_shows_each_order_and_the_results_file_beside_them(tmp_path: Path) -> None:
    trace = tmp_path / "mini.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,36000\n3600,1,7200\n")
    results = tmp_path / "r.json"
    # A results file whose yarn-cs (12 h) stands in for a replay, and whose gandiva took 9 h.
    entry = {"settings": {"cluster": "1x1", "target_load": 0.5}, "jobs": 2,
             "yarn-cs": {"avg_jct_s": 12 * H, "avg_queueing_delay_s": 6 * H},
             "gandiva": {"avg_jct_s": 9 * H}, "tiresias": {"avg_jct_s": 10 * H}}
    results.write_text(json.dumps({"mini": entry}))
    out = _cli("--trace", str(trace), "--cluster", "1x1", "--target-load", "0.5", "--results", str(results))
    assert out.returncode == 0, out.stderr
    head, _, row = out.stdout.splitlines()[:3]
    assert "ideal fifo h (x yarn-cs)" in head and "gandiva (x yarn-cs)" in head
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[:4] == ["mini", "2", "12.0 (50%)", "<= 0.8x"]
    assert cells[-2:] == ["9.0 (0.75)", "10.0 (0.83)"]
    # The same file at another load is refused, not mixed in.
    out = _cli("--trace", str(trace), "--cluster", "1x1", "--target-load", "0.9", "--results", str(results))
    assert out.returncode == 2 and "pass a file written with the same --cluster and --target-load" in out.stderr


def test_bad_arguments_say_what_is_wrong(tmp_path: Path) -> None:
    out = _cli("--trace", str(tmp_path / "none.csv"), "--orders", "fifo,lifo")
    assert out.returncode == 2 and "unknown order(s) lifo" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n5,1,60\n")
    out = _cli("--trace", str(trace), "--results", str(bad))
    assert out.returncode == 2 and f"--results {bad}" in out.stderr
    out = _cli("--trace", str(trace), "--cluster", "four")
    assert out.returncode == 2 and "--cluster: cluster 'four' is not SERVERSxGPUS" in out.stderr
