"""Grow-shrink never silently changes a job's result, on a real scheduler and `gandiva helper`.

Two opted-in feed_step jobs of one GPU each on an idle 4-GPU server, both grown by the
policy once the GPUs have been idle:

- one builds ONE TOWER PER DEVICE (`--replicas auto`): its pre-warmed destination on 2
  GPUs builds 2 towers where the source (which reported its count) has 1, and refuses
  before holding (exit 76, TowerReport): the grow is aborted, the source never stops, and
  the scheduler turns grow-shrink off for the job for good (`gandiva describe` says why,
  event `job.grow_shrink`). It is never grown again and ends with exactly the variables
  of an uninterrupted 1-tower run;
- one builds a fixed number of logical towers (`--replicas 2 --devices auto`): it grows,
  and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.core import Settings
from scheduler.policy.types import PolicyConfig

from ..conftest import TEST_SITE
from ..tf_runtime.conftest import assert_same_variables
from .conftest import Cluster

pytestmark = [pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FEED = importlib.util.find_spec("tf_runtime.examples.feed_step").origin  # type: ignore[union-attr]
STEPS = 200
SUCCEEDED = common_pb2.JOB_STATE_SUCCEEDED
MIGRATING = common_pb2.JOB_STATE_MIGRATING


@pytest.fixture
def cluster(make_scheduler: Any, sqlite_url: str, tmp_path: Path, wait_for: Any) -> Iterator[Cluster]:
    sched = make_scheduler(
        sqlite_url, tick_s=0.2, policy_config=PolicyConfig(quantum_s=1.5, grow_idle_s=2.0),
        settings=Settings(heartbeat_interval_s=1.0, down_after_s=4.0))
    c = Cluster(sched, tmp_path, wait_for)
    yield c
    c.close()


def feed(*args: str) -> list[str]:
    return ["python", str(FEED), "--steps", str(STEPS), "--seed", "3", *args]


def env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{REPO}{os.pathsep}{TEST_SITE}", "TF_CPP_MIN_LOG_LEVEL": "2"}


def baseline(args: list[str], dump: Path, devices: str) -> subprocess.Popen[bytes]:
    """The same program uninterrupted, without the shim (no step sleep: it changes nothing)."""
    return subprocess.Popen([sys.executable, *args[1:], "--dump", str(dump)],
                            env={**os.environ, **env(), "CUDA_VISIBLE_DEVICES": devices},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def submit(cluster: Cluster, name: str, command: list[str], workdir: Path) -> str:
    spec = common_pb2.JobSpec(name=name, command=command, workdir=str(workdir), gpus=1,
                              grow_shrink=True, env=env())
    return cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id


def moves(job: Any) -> int:
    return sum(1 for t in job.history if t.to_state == MIGRATING)


def test_a_per_device_program_is_grown_once_then_left_alone_and_its_result_never_changes(
        cluster: Cluster, tmp_path: Path) -> None:
    per_device = feed("--loop", "session", "--optimizer", "momentum", "--replicas", "auto")
    logical = feed("--loop", "mts", "--optimizer", "adam", "--replicas", "2", "--devices", "auto")
    bases = [baseline(per_device, tmp_path / "base-pd.npz", "0"),
             baseline(logical, tmp_path / "base-lt.npz", "0,1")]
    cluster.add_helper("g1", 4)
    pd = submit(cluster, "per-device", [*per_device, "--step-sleep", "0.1",
                                        "--dump", str(tmp_path / "pd.npz")], tmp_path)
    # Slower steps: its grow (a pre-warmed destination starting TensorFlow) must land
    # before it ends, also on a loaded machine (at 0.1 s it once finished mid-grow).
    lt = submit(cluster, "logical", [*logical, "--step-sleep", "0.25",
                                     "--dump", str(tmp_path / "lt.npz")], tmp_path)

    # The per-device job: one grow attempt, refused at its destination, back on its GPU.
    cluster.wait_for(lambda: cluster.job(pd).grow_shrink_note, 150)
    job = cluster.wait_for(lambda: (j := cluster.job(pd)).state == common_pb2.JOB_STATE_RUNNING
                           and moves(j) == 1 and j, 60)
    assert len(job.placement) == 1, job.placement
    assert "one tower per device: growing it would change its result" in job.grow_shrink_note
    assert "tf_runtime.towers" in job.grow_shrink_note
    events = cluster.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=pd)).events
    assert [e.kind for e in events].count("job.grow_shrink") == 1
    # Refused at the pre-warm (its graph has 2 towers, the source's 1): the source was
    # never stopped, no checkpoint taken, nothing restarted.
    phases = {e.message.split()[0]: e.message for e in events if e.kind == "job.migration"}
    assert "aborted" in phases and "code 76" in phases["aborted"], phases
    assert not {"checkpoint", "restarted_at_source"} & set(phases), phases
    described = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "describe", "job", pd,
                                "--scheduler", cluster.sched.address],
                               capture_output=True, text=True, timeout=60, check=False).stdout
    assert re.search(r"Grow-shrink:?\s+off \(the program builds one tower per device: growing it "
                     r"would change its result", described), described

    for job_id in (pd, lt):
        cluster.wait_for(lambda j=job_id: cluster.job(j).state == SUCCEEDED, 180)
    for b in bases:
        assert b.wait(60) == 0
    final = cluster.job(pd)
    assert moves(final) == 1, "grown again after grow-shrink was turned off"
    assert_same_variables(tmp_path / "base-pd.npz", tmp_path / "pd.npz")

    # The logical-tower job grew (2 GPUs) and kept its result, bit for bit.
    grown = cluster.job(lt)
    assert moves(grown) >= 1 and not grown.grow_shrink_note
    assert any("migrated to g1" in t.reason for t in grown.history), list(grown.history)
    assert_same_variables(tmp_path / "base-lt.npz", tmp_path / "lt.npz")
