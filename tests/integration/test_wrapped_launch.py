"""Jobs launched through wrappers, on a real scheduler and a real `gandiva helper`.

`env FOO=1 python train.py`, `bash -c '...'` and a shell script that runs python all
train under the shim (through the sitecustomize the helper puts on the job's
PYTHONPATH, chained to the job's own): they report mini-batches and can be suspended.
A wrapped job none of whose processes ever connects a runtime is marked not
suspendable and not migratable after the deadline: `gandiva describe` and `gandiva
suspend` say why, and the policy never time-slices another job onto its GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.core import Settings
from scheduler.policy.types import PolicyConfig

from ..in_process import run_gandiva
from .conftest import Cluster

pytestmark = [pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Long enough for TensorFlow jobs on a loaded machine to connect; a job that never
# connects is judged sooner (what is checked does not depend on how long it waited).
DEADLINE_S = 30.0
NEVER_DEADLINE_S = 8.0
RUNNING = common_pb2.JOB_STATE_RUNNING


@pytest.fixture
def deadline_s() -> float:
    return DEADLINE_S


@pytest.fixture
def cluster(make_scheduler: Any, sqlite_url: str, tmp_path: Path, wait_for: Any,
            deadline_s: float) -> Iterator[Cluster]:
    sched = make_scheduler(
        sqlite_url, tick_s=0.2, policy_config=PolicyConfig(quantum_s=1.5),
        settings=Settings(heartbeat_interval_s=1.0, down_after_s=4.0,
                          runtime_connect_deadline_s=deadline_s))
    c = Cluster(sched, tmp_path, wait_for)
    yield c
    c.close()


def job_env(**extra: str) -> dict[str, str]:
    """`python` on PATH is this interpreter, with tf_runtime importable (as on a server
    where the job's interpreter has Gandiva installed)."""
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.update(extra)
    return env


def submit(cluster: Cluster, name: str, command: list[str], workdir: Path, gpus: int = 1,
           **env: str) -> str:
    spec = common_pb2.JobSpec(name=name, command=command, workdir=str(workdir), gpus=gpus,
                              env=job_env(**env))
    return cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id


def gandiva(capsys: pytest.CaptureFixture[str], cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gandiva ARGS` in the test's process (tests/in_process.py): what the commands say and
    do is checked here, not their process (a Python start each, 2-5 s on the CI machine)."""
    return run_gandiva(capsys, *args, "--scheduler", cluster.sched.address)


def test_wrapped_python_runs_under_the_shim(cluster: Cluster, mlp: Any, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_helper("w1", 4)
    train = " ".join(mlp(100000, 0.05))
    # The job's own sitecustomize (first on its PYTHONPATH) must still run.
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.environ['MARK_DIR'], f'mark-{os.getpid()}'), 'w').close()\n")
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\nset -e\nexport FROM_SCRIPT=1\n{train}\n")
    script.chmod(0o755)
    jobs = {
        "env": submit(cluster, "env", ["env", "FOO=1", *mlp(100000, 0.05)], tmp_path),
        "bash": submit(cluster, "bash", ["bash", "-c", f"true && {train}"], tmp_path),
        "script": submit(cluster, "script", [str(script)], tmp_path, MARK_DIR=str(tmp_path),
                         PYTHONPATH=f"{own}{os.pathsep}{REPO}"),
    }
    for name, job_id in jobs.items():
        cluster.wait_for(lambda j=job_id: cluster.job(j).steps >= 5, 120)  # mini-batches reported
        out = gandiva(capsys, cluster, "suspend", job_id)
        assert out.returncode == 0, (name, out.stdout, out.stderr)
        assert cluster.job(job_id).state == common_pb2.JOB_STATE_SUSPENDED
        assert gandiva(capsys, cluster, "resume", job_id).returncode == 0
        described = gandiva(capsys, cluster, "describe", "job", job_id).stdout
        assert re.search(r"Suspendable:?\s+yes", described), described
    assert list(tmp_path.glob("mark-*")), "the job's own sitecustomize did not run"
    for job_id in jobs.values():
        gandiva(capsys, cluster, "kill", job_id)


@pytest.mark.parametrize("deadline_s", [NEVER_DEADLINE_S])
def test_a_job_that_never_connects_is_honestly_uncontrollable(cluster: Cluster, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_helper("w1", 1)
    # Python without TensorFlow behind a wrapper: it never connects a runtime.
    stuck = submit(cluster, "stuck", ["bash", "-c", "python -c 'import time; time.sleep(600)'"],
                   tmp_path)
    cluster.wait_for(lambda: cluster.job(stuck).state == RUNNING, 30)
    running_at = time.monotonic()
    assert cluster.job(stuck).suspendable  # until the deadline it may still connect
    cluster.wait_for(lambda: not cluster.job(stuck).suspendable, NEVER_DEADLINE_S + 30)
    assert time.monotonic() - running_at > NEVER_DEADLINE_S / 2, "judged long before its deadline"
    job = cluster.job(stuck)
    assert not job.migratable and "connected the Gandiva runtime" in job.control_note

    described = gandiva(capsys, cluster, "describe", "job", stuck)
    assert re.search(r"Suspendable:?\s+no \(no process of it connected the Gandiva runtime",
                     described.stdout), described.stdout
    refused = gandiva(capsys, cluster, "suspend", stuck)
    assert refused.returncode != 0
    assert "cannot be suspended" in refused.stdout + refused.stderr
    assert "connected the Gandiva runtime" in refused.stdout + refused.stderr

    # The policy never time-slices a newcomer onto its GPU: it waits.
    other = submit(cluster, "other", ["bash", "-c", "sleep 600"], tmp_path)
    time.sleep(4 * 1.5)  # several time slices
    assert cluster.job(stuck).state == RUNNING
    assert cluster.job(other).state == common_pb2.JOB_STATE_QUEUED
    gandiva(capsys, cluster, "kill", stuck, other)


def test_a_job_that_evaluates_in_a_python_subprocess_trains_to_the_end(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A training program that evaluates its own checkpoint in a Python subprocess importing
    TensorFlow (tests/tf_runtime/programs/spawns_eval.py), launched by a real helper with its
    status pipe: the evaluator used to exit at its import (the pipe's descriptor, named in
    its environment, is closed in the child) and fail the job. It trains to the end and is
    suspended and resumed across evaluations. (The evaluator reads the checkpoint with
    `tf.train.load_variable` and makes no session, so it never starts a runtime: this test
    does not check which process would take the job's stream if it did.)"""
    cluster.add_helper("w1", 1)
    programs = REPO / "tests" / "tf_runtime" / "programs"
    # Evaluations at steps 10, 20, 30 and 40, each a Python importing TensorFlow (3-5 s
    # here): suspended after the first, and again after two more, before the last.
    job_id = submit(cluster, "spawns", ["python", str(programs / "spawns_eval.py"), "--steps", "46",
                                        "--eval-every", "10", "--step-sleep", "0.1",
                                        "--workdir", str(tmp_path / "work")], tmp_path)
    cluster.wait_for(lambda: cluster.job(job_id).steps >= 12, 180)  # past an evaluation
    out = gandiva(capsys, cluster, "suspend", job_id)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert gandiva(capsys, cluster, "resume", job_id).returncode == 0
    cluster.wait_for(lambda: cluster.job(job_id).steps >= 32, 180)
    assert gandiva(capsys, cluster, "suspend", job_id).returncode == 0  # after more evaluations
    assert gandiva(capsys, cluster, "resume", job_id).returncode == 0
    cluster.wait_for(lambda: cluster.job(job_id).state == common_pb2.JOB_STATE_SUCCEEDED, 240)
    log = (tmp_path / "logs" / f"{job_id}.log").read_text()
    assert log.count("held-out loss") == 4, log[-3000:]
    assert "did not start" not in log
