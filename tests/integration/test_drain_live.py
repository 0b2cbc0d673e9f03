"""`gandiva drain --wait` live: a real scheduler, two real helpers, two real TensorFlow jobs.

d1 (2 GPUs) runs jobs A and B; d2 (1 GPU) joins empty. Draining d1 migrates one of them to
d2's free GPU and parks the other (checkpointed into d1's ramdisk, queued again: no other
server has room); the drain streams that checkpoint to d2 before it calls d1 drained, and
d1's helper is then killed (the server switched off); the policy starts the parked job on d2
from its checkpoint. Both end with all their steps and with exactly the variables of an
uninterrupted run; nothing lands on d1 while it is
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
from scheduler.core import Settings
from scheduler.policy.types import PolicyConfig

from ..conftest import TEST_SITE
from ..tf_runtime.conftest import assert_same_variables
from .conftest import Cluster

pytestmark = [pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FEED = importlib.util.find_spec("tf_runtime.examples.feed_step").origin  # type: ignore[union-attr]
RUNNING, SUCCEEDED = common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUCCEEDED
# Each job sleeps 0.05 s after each step until the test's event has happened (the drain
# done: the file GO in its tmp_path), then runs at full speed: 1,970 steps after step 30
# are 98 s of sleep at least, so the jobs outlast the drain on a loaded machine; with 700
# fixed 0.05-s steps, at load 25-36, a migrated job ended mid-migration.
STEPS = 2000


def _env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{REPO}{os.pathsep}{TEST_SITE}", "TF_CPP_MIN_LOG_LEVEL": "2"}


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


def _two_on_d1_then_d2(cluster: Any, programs: dict[str, list[str]], tmp_path: Path) -> dict[str, str]:
    """d1 (2 GPUs) runs the two programs (each mini-batch 0.05 s longer until the file GO
    exists: _go), each past step 30; then d2 (1 GPU) joins."""
    cluster.add_helper("d1", 2)
    ids = {}
    for name, prog in programs.items():
        spec = common_pb2.JobSpec(name=name, command=["python", *prog, "--step-sleep", "0.05", "--step-sleep-until",
                                                      str(tmp_path / "GO"), "--dump", str(tmp_path / f"{name}.npz")],
                                  workdir=str(tmp_path), gpus=1, env=_env())
        ids[name] = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
    for job_id in ids.values():
        cluster.wait_for(lambda j=job_id: cluster.job(j).state == RUNNING and cluster.job(j).steps >= 30, 120)
    cluster.add_helper("d2", 1)
    return ids


def _go(tmp_path: Path) -> None:
    """The event the test waits for has happened: the jobs run their last steps at full speed."""
    (tmp_path / "GO").touch()


def test_drain_moves_two_running_jobs_off_and_both_end_bit_identical(policy_cluster: Any, tmp_path: Path) -> None:
    programs = {"a": _program(1, "momentum"), "b": _program(2, "adam")}
    refs = {name: subprocess.Popen([sys.executable, *prog, "--dump", str(tmp_path / f"ref-{name}.npz")],
                                   env={**os.environ, **_env()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, prog in programs.items()}
    # No packing, no background moves of the policy's own: every move here is the drain's.
    cluster = policy_cluster(quantum_s=5.0, enable_packing=False, enable_migration=False)
    # The job migrated to d2 must outlast its pre-warm there (TensorFlow starting, ~20 s on a
    # loaded machine, more at load 25-36): its steps are slow until the drain is done.
    ids = _two_on_d1_then_d2(cluster, programs, tmp_path)

    drained = _gandiva(cluster, "drain", "d1", "--reason", "kernel upgrade", "--wait", "--timeout", "240s",
                       timeout=300)
    _go(tmp_path)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    out = drained.stdout
    assert "server d1 cordoned and draining: 2 job(s) on it" in out, out
    # d2 has room for one of them: the drain takes d1's jobs in id order (random ids), so
    # either may be the one migrated; the other is parked.
    moved, parked = sorted(ids.values(), key=lambda j: f"{j}: migrate (to d2)" not in out)
    assert f"{moved}: migrate (to d2)" in out and f"{parked}: park" in out, out
    # The migrated job's line: where it is now (running, or suspended there for the other's time slice).
    assert re.search(rf"{moved}: (running|suspended) on d2", out) and f"{parked}: checkpointed at step" in out, out
    assert "server d1 drained" in out, out
    srv = next(s for s in cluster.stub.ListServers(scheduler_pb2.ListServersRequest()).servers if s.name == "d1")
    assert (srv.cordoned, srv.draining, srv.cordon_reason) == (True, True, "kernel upgrade")
    assert not srv.checkpoints_for, srv
    # Drained means d1 can be switched off: the parked job's checkpoint (in d1's ramdisk) was
    # streamed to d2 first (or fetched by its launch there), so it resumes at its step, not
    # from step 0. Before, "drained" came as soon as no job was placed on d1, and the parked
    # job's only checkpoint was still there.
    cluster.helpers[0].kill()
    cluster.helpers[0].wait(30)
    parked_events = [e.message for e in cluster.stub.ListEvents(
        scheduler_pb2.ListEventsRequest(job_id=parked, kinds=["job.checkpoint"])).events]
    assert any("off draining server d1 to d2" in m or ("fetched" in m and "from d1" in m) for m in parked_events), parked_events

    # The parked job waits for d2 (time-sliced with the other there, or after it): never on d1 while it is cordoned.
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
        assert "starts over" not in story and "starts from step 0" not in story, story
        assert not any("d1/" in t.reason for t in job.history if t.at > srv.cordoned_at
                       and t.to_state == RUNNING), story
        assert refs[name].wait(120) == 0
        assert_same_variables(tmp_path / f"ref-{name}.npz", tmp_path / f"{name}.npz")
    said = [e.message for e in cluster.stub.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["job.drain"])).events]
    # ("checkpoint": the parked job's checkpoint streamed to d2 while it was queued; not
    # said when its own launch on d2 fetched it first.)
    assert sorted(m.split(":")[0] for m in said if not m.startswith("checkpoint:")) == ["migrate", "park"], said

    # Back in service (its helper started again after the maintenance): with d2 cordoned,
    # the next job goes to d1.
    cluster.add_helper("d1", 2)
    assert _gandiva(cluster, "cordon", "d2").returncode == 0
    assert _gandiva(cluster, "uncordon", "d1").returncode == 0
    spec = common_pb2.JobSpec(name="c", command=["python", *_program(3, "momentum")[:1], "--steps", "20"],
                              workdir=str(tmp_path), gpus=1, env=_env())
    third = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
    done = cluster.wait_for(lambda: (j := cluster.job(third)).state == SUCCEEDED and j, 120)
    assert {g.server for t in [done] for g in t.placement} <= {"d1"}
    assert any("on d1/" in t.reason for t in done.history), _story(done)


def test_drain_with_no_room_elsewhere_moves_the_checkpoints_off_before_it_says_drained(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, tmp_path: Path) -> None:
    """No other server has a free GPU (d2's one is held by a job that cannot be stopped):
    both of d1's jobs are parked, and their checkpoints, written into d1's ramdisk, are
    streamed to d2 before the drain says d1 is drained. d1's helper is then killed (the
    server switched off for its maintenance); once d2's GPU is free, both resume there at
    their steps and end bit-identical. Before, "drained" came as soon as no job was placed
    on d1: switched off, it took both jobs' only checkpoints with it, and each started over
    from step 0 after waiting for d1 to come back."""
    programs = {"a": _program(4, "momentum"), "b": _program(5, "adam")}
    refs = {name: subprocess.Popen([sys.executable, *prog, "--dump", str(tmp_path / f"ref-{name}.npz")],
                                   env={**os.environ, **_env()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, prog in programs.items()}
    # The blocker (no runtime) is known not to be stoppable 2 s after its launch.
    sched = make_scheduler(sqlite_url, tick_s=0.2,
                           policy_config=PolicyConfig(quantum_s=5.0, enable_packing=False, enable_migration=False),
                           settings=Settings(heartbeat_interval_s=1.0, down_after_s=4.0, runtime_connect_deadline_s=2.0))
    cluster = Cluster(sched, tmp_path, wait_for)
    try:
        _no_room(cluster, programs, refs, tmp_path)
    finally:
        cluster.close()


def _no_room(cluster: Cluster, programs: dict[str, list[str]], refs: dict[str, Any], tmp_path: Path) -> None:
    ids = _two_on_d1_then_d2(cluster, programs, tmp_path)
    spec = common_pb2.JobSpec(name="blocker", command=["sleep", "600"], workdir=str(tmp_path), gpus=1)
    blocker = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
    cluster.wait_for(lambda: (j := cluster.job(blocker)).state == RUNNING and not j.suspendable, 120)

    drained = _gandiva(cluster, "drain", "d1", "--wait", "--timeout", "240s", timeout=300)
    _go(tmp_path)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    out = drained.stdout
    for job_id in ids.values():
        assert f"{job_id}: park" in out and f"{job_id}: checkpointed at step" in out, out
    assert "server d1 drained: no job is placed on it and no job's checkpoint is left on it" in out, out
    for job_id in ids.values():
        events = [e.message for e in cluster.stub.ListEvents(
            scheduler_pb2.ListEventsRequest(job_id=job_id, kinds=["job.checkpoint"])).events]
        assert any("off draining server d1 to d2" in m for m in events), events
        assert cluster.job(job_id).state == common_pb2.JOB_STATE_QUEUED
    cluster.helpers[0].kill()  # d1 switched off
    cluster.helpers[0].wait(30)

    cluster.stub.KillJob(scheduler_pb2.JobActionRequest(id=blocker), timeout=10)
    deadline = time.monotonic() + 300
    while not all(cluster.job(j).state == SUCCEEDED for j in ids.values()):
        assert time.monotonic() < deadline, "\n\n".join(_story(cluster.job(j)) for j in ids.values())
        assert all(cluster.job(j).state not in (common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)
                   for j in ids.values()), [_story(cluster.job(j)) for j in ids.values()]
        time.sleep(0.5)
    for name, job_id in ids.items():
        job = cluster.job(job_id)
        story = _story(job)
        assert job.steps == STEPS, story
        assert "starts over" not in story and "starts from step 0" not in story, story
        assert refs[name].wait(120) == 0
        assert_same_variables(tmp_path / f"ref-{name}.npz", tmp_path / f"{name}.npz")
