"""`gandiva drain --wait` live: a real scheduler, two real helpers, two real TensorFlow jobs.

d1 (2 GPUs) runs jobs A and B; d2 (1 GPU) joins empty. Draining d1 migrates A to d2's free
GPU and parks B (checkpointed into d1's ramdisk, queued again: no other server has room),
which the policy then starts on d2 from that checkpoint. Both end with all their steps and
with exactly the variables of an uninterrupted run; nothing lands on d1 while it is
cordoned. Uncordoned (and d2 cordoned), d1 takes the next job.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

from ..tf_runtime.conftest import assert_same_variables

pytestmark = [pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FEED = importlib.util.find_spec("tf_runtime.examples.feed_step").origin  # type: ignore[union-attr]
RUNNING, SUCCEEDED = common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUCCEEDED
STEPS = 700


def _env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _program(seed: int, optimizer: str) -> list[str]:
    return [str(FEED), "--steps", str(STEPS), "--seed", str(seed), "--optimizer", optimizer]


def _gandiva(cluster: Any, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gandiva_cli.main", *args, "--scheduler", cluster.sched.address],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _on(cluster: Any, name: str) -> set[str]:
    servers = cluster.stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=10).servers
    return {j for s in servers if s.name == name for g in s.gpu_list for j in g.jobs}


def _story(job: Any) -> str:
    return "\n".join(f"{t.at:.1f} {common_pb2.JobState.Name(t.to_state)}: {t.reason}" for t in job.history)


def test_drain_moves_two_running_jobs_off_and_both_end_bit_identical(policy_cluster: Any, tmp_path: Path) -> None:
    programs = {"a": _program(1, "momentum"), "b": _program(2, "adam")}
    refs = {name: subprocess.Popen([sys.executable, *prog, "--dump", str(tmp_path / f"ref-{name}.npz")],
                                   env={**os.environ, **_env()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, prog in programs.items()}
    # No packing, no background moves of the policy's own: every move here is the drain's.
    cluster = policy_cluster(quantum_s=5.0, enable_packing=False, enable_migration=False)
    cluster.add_helper("d1", 2)
    ids = {}
    for name, prog in programs.items():
        spec = common_pb2.JobSpec(name=name, command=["python", *prog, "--step-sleep", "0.02", "--dump",
                                                      str(tmp_path / f"{name}.npz")],
                                  workdir=str(tmp_path), gpus=1, env=_env())
        ids[name] = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
    for job_id in ids.values():
        cluster.wait_for(lambda j=job_id: cluster.job(j).state == RUNNING and cluster.job(j).steps >= 30, 120)
    cluster.add_helper("d2", 1)

    drained = _gandiva(cluster, "drain", "d1", "--reason", "kernel upgrade", "--wait", "--timeout", "240s",
                       timeout=300)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    out = drained.stdout
    assert "server d1 cordoned and draining: 2 job(s) on it" in out, out
    assert f"{ids['a']}: migrate (to d2)" in out and f"{ids['b']}: park" in out, out
    # A's line: where it is now (running, or suspended there for B's time slice).
    assert re.search(rf"{ids['a']}: (running|suspended) on d2", out) and f"{ids['b']}: checkpointed at step" in out, out
    assert "server d1 drained" in out, out
    srv = next(s for s in cluster.stub.ListServers(scheduler_pb2.ListServersRequest()).servers if s.name == "d1")
    assert (srv.cordoned, srv.draining, srv.cordon_reason) == (True, True, "kernel upgrade")

    # B waits for d2 (time-sliced with A there, or after it): never on d1 while it is cordoned.
    while not all(cluster.job(j).state == SUCCEEDED for j in ids.values()):
        assert not _on(cluster, "d1"), "a job was placed on the cordoned server"
        time.sleep(0.5)
        assert all(cluster.job(j).state not in (common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)
                   for j in ids.values()), [_story(cluster.job(j)) for j in ids.values()]
        if time.time() - srv.cordoned_at > 400:
            pytest.fail("jobs did not finish: " + "\n\n".join(_story(cluster.job(j)) for j in ids.values()))
    for name, job_id in ids.items():
        job = cluster.job(job_id)
        story = _story(job)
        assert job.steps == STEPS, story
        assert not any("d1/" in t.reason for t in job.history if t.at > srv.cordoned_at
                       and t.to_state == RUNNING), story
        assert refs[name].wait(120) == 0
        assert_same_variables(tmp_path / f"ref-{name}.npz", tmp_path / f"{name}.npz")
    moved = [e.message for e in cluster.stub.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["job.drain"])).events]
    assert sorted(m.split(":")[0] for m in moved) == ["migrate", "park"], moved

    # Back in service: with d2 cordoned, the next job goes to d1.
    assert _gandiva(cluster, "cordon", "d2").returncode == 0
    assert _gandiva(cluster, "uncordon", "d1").returncode == 0
    spec = common_pb2.JobSpec(name="c", command=["python", *_program(3, "momentum")[:1], "--steps", "20"],
                              workdir=str(tmp_path), gpus=1, env=_env())
    third = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
    done = cluster.wait_for(lambda: (j := cluster.job(third)).state == SUCCEEDED and j, 120)
    assert {g.server for t in [done] for g in t.placement} <= {"d1"}
    assert any("on d1/" in t.reason for t in done.history), _story(done)
