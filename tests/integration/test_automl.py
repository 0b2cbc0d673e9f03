"""`gandiva automl` on a live cluster: real TensorFlow configurations ranked by the loss
they report at mini-batch boundaries, the worst killed and the best promoted at each rung."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.automl import SuccessiveHalving

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_successive_halving_kills_the_worst_and_promotes_the_best(cluster, mlp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Asynchronous rungs (the synchronous ones choose the same: tests/scheduler/test_automl_rungs.py).
    cluster.add_helper("node-a", 2)
    sweep = tmp_path / "sweep.yaml"
    # lr 2.0 with momentum diverges: it must not survive the first rung. Ranked by the mean
    # loss of the last 10 mini-batches the example publishes (a diverged run's is the largest float).
    sweep.write_text("name: search\ngrid:\n  lr: [0.003, 0.01, 0.03, 2.0]\n")
    run = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "automl", "--sweep", str(sweep), "--metric", "loss_avg",
         "--mode", "min", "--min-steps", "40", "--eta", "2", "--async", "--scheduler", cluster.sched.address,
         "--", *mlp(600, 0.02), "--lr", "{lr}", "--loss-avg", "10"],
        capture_output=True, text=True, timeout=400, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    best = re.search(r"best: lr=(\S+) loss_avg=(\S+) \(job (j-\w+)", run.stdout)
    assert best, run.stdout
    jobs = {j.id: j for j in cluster.stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs}
    by_lr = {j.spec.params["lr"]: j for j in jobs.values()}
    assert set(by_lr) == {"0.003", "0.01", "0.03", "2.0"}
    # Two rungs (4 -> 2 -> 1): three killed, by reasons that say why; the winner still trains.
    killed = [j for j in jobs.values() if j.state == common_pb2.JOB_STATE_KILLED]
    assert len(killed) == 3 and all("automl rung" in j.message for j in killed), [j.message for j in killed]
    assert by_lr["2.0"].state == common_pb2.JOB_STATE_KILLED and "rung 0" in by_lr["2.0"].message
    winner = jobs[best.group(3)]
    assert winner.spec.params["lr"] == best.group(1) and winner.state != common_pb2.JOB_STATE_KILLED
    history = cluster.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=winner.id)).events
    assert [e.message for e in history if e.kind == "job.priority"] == ["1 -> 2", "2 -> 3"]
    # It was the best of the rung-1 pair by the loss it reported then (lower is better).
    assert "rung 1" in run.stdout and float(best.group(2)) < 1.0
    cluster.stub.KillJob(scheduler_pb2.JobActionRequest(id=winner.id))


def test_bad_arguments_are_named() -> None:
    for kwargs, error in (({"mode": "lowest"}, "--mode"), ({"eta": 1}, "--eta"),
                          ({"min_steps": 0}, "--min-steps"), ({"metric": ""}, "--metric")):
        args = {"metric": "loss", **kwargs}
        with pytest.raises(ValueError, match=error):
            SuccessiveHalving(None, **args)  # type: ignore[arg-type]


def test_nan_ranks_last_whatever_the_mode() -> None:
    for mode, order in (("min", ["a", "b", "nan"]), ("max", ["b", "a", "nan"])):
        search = SuccessiveHalving(None, "loss", mode)
        ranked = search._better_first([("nan", math.nan), ("b", 2.0), ("a", 1.0)])
        assert [j for j, _ in ranked] == order


def test_cli_without_a_sweep_or_metric_says_what_is_missing(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "automl", "--metric", "loss", "--", "x"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "--sweep" in run.stderr
    sweep = tmp_path / "s.yaml"
    sweep.write_text("grid:\n  lr: [0.1, 0.2]\n")
    for extra, error in ((["--hyperband"], "needs --max-steps"), (["--max-steps", "100"], "is for --algorithm hyperband"),
                         (["--hyperband", "--max-steps", "10", "--min-steps", "50"], "--max-steps 10")):
        run = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "automl", "--sweep", str(sweep), "--metric",
                              "loss", *extra, "--scheduler", "127.0.0.1:9", "--", "x", "{lr}"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 2 and error in run.stderr, (extra, run.stderr)
