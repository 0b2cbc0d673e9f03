"""`gandiva helper` as a real process against the real scheduler: it registers its
GPUs, runs what the scheduler places there, migrates on `MigrateJob`, comes back
after the scheduler restarts, and `gandiva logs` shows the job's output."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]


@pytest.fixture
def helpers(scheduler_server: Any, tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(name: str) -> subprocess.Popen[str]:
        # One log per process (two helpers may be started under one name).
        with open(tmp_path / f"{name}-{len(procs)}.err", "w") as err:
            proc = subprocess.Popen(
                [*GANDIVA, "helper", "--server-name", name, "--gpus", "2", "--virtual",
                 "--scheduler", scheduler_server.address, "--ramdisk", str(tmp_path / "rd" / name),
                 "--shared-root", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs")],
                stdout=subprocess.PIPE, stderr=err, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"helper {name} listening on 127.0.0.1:"), line
        return proc

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(15)


def stub(address: str) -> scheduler_pb2_grpc.SchedulerStub:
    return scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))


def servers(api: scheduler_pb2_grpc.SchedulerStub) -> dict[str, common_pb2.Server]:
    return {s.name: s for s in api.ListServers(scheduler_pb2.ListServersRequest(), timeout=30).servers}


def job(api: scheduler_pb2_grpc.SchedulerStub, job_id: str) -> common_pb2.Job:
    return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=30)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapper_exits_0"])
def test_helper_runs_and_migrates_a_job_for_the_scheduler(
    scheduler_server: Any, helpers: Any, fake_job: str, tmp_path: Path, wait_for: Any, wrapped: bool
) -> None:
    """Wrapped, the program's exit for the migration (75) becomes the shell's 0: it is still
    the planned stop. The destination's restore takes a while (as a large model's does), so
    the source's exit comes in mid-migration: it was recorded SUCCEEDED, half trained."""
    helpers("s1")
    api = stub(scheduler_server.address)
    up = wait_for(lambda: servers(api).get("s1"), 10)
    assert up.up and up.gpus == 2 and up.address.startswith("127.0.0.1:")
    command = ["bash", "-c", f"{fake_job}; echo done"] if wrapped else [fake_job]
    # FAKE_OLD_SHIM: the wrapper goes on after the program's exit, as behind a process the
    # shim's launch_end does not reach (tf_runtime.launch).
    spec = common_pb2.JobSpec(name="fake", command=command, workdir=str(tmp_path), gpus=1,
                              env={"FAKE_STEP_S": "0.05", "FAKE_RESTORE_S": "1.5", "FAKE_OLD_SHIM": "1"})
    job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id
    wait_for(lambda: job(api, job_id).steps >= 20, 30)
    helpers("s2")
    wait_for(lambda: servers(api).get("s2"), 10)
    before = job(api, job_id).steps
    api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server="s2"), timeout=10)

    def moved() -> bool:
        j = job(api, job_id)
        return j.state == common_pb2.JOB_STATE_RUNNING and {g.server for g in j.placement} == {"s2"}

    wait_for(moved, 30)
    wait_for(lambda: job(api, job_id).steps > before + 20, 30)
    # `gandiva logs` shows both incarnations' output, in order.
    out = subprocess.run([*GANDIVA, "logs", job_id, "--log-dir", str(tmp_path / "logs")],
                         check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.count(f"=== gandiva: job {job_id} incarnation") == 2
    assert " on s1 " in out.stdout and " on s2 " in out.stdout


def test_a_second_helper_with_the_same_name_is_refused_until_the_first_is_gone(
    scheduler_server: Any, helpers: Any, tmp_path: Path, wait_for: Any
) -> None:
    """Two hosts started with one --server-name: the second helper is refused the name,
    saying why and what to do, while the first lives (its GPUs are not counted twice, and
    its heartbeats do not take turns with the first's); once the first is gone for the
    heartbeat timeout, the second takes the name over."""
    api = stub(scheduler_server.address)
    first = helpers("h1")
    wait_for(lambda: (s := servers(api).get("h1")) is not None and s.up, 30)
    helpers("h1")
    log = tmp_path / "h1-1.err"
    wait_for(lambda: "is held by another live helper" in log.read_text(), 30)
    text = log.read_text()
    assert "two helpers were started with --server-name h1; give this one its own name, or stop the other" in text
    assert "registered with" not in text
    assert servers(api)["h1"].gpus == 2
    first.terminate()
    first.wait(15)
    # The name is free down_after_s (10 s) after the first's last heartbeat.
    wait_for(lambda: "registered with" in log.read_text(), 40)
    wait_for(lambda: servers(api)["h1"].up, 20)


def test_logs_of_an_unknown_job_say_where_logs_live(tmp_path: Path) -> None:
    out = subprocess.run([*GANDIVA, "logs", "nope", "--log-dir", str(tmp_path)],
                         check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "no output for job 'nope'" in out.stderr


def test_bad_flags_exit_2_with_one_clear_line() -> None:
    out = subprocess.run([*GANDIVA, "helper", "--server-name", "bad name!"],
                         check=False, capture_output=True, text=True, timeout=30, env={**os.environ, "GANDIVA_SCHEDULER": "x:1"})
    assert out.returncode == 2 and "--server-name 'bad name!'" in out.stderr


def test_helper_comes_back_after_the_scheduler_restarts(
    make_scheduler: Any, sqlite_url: str, tmp_path: Path, fake_job: str, wait_for: Any
) -> None:
    first = make_scheduler(sqlite_url, tick_s=0.2)
    helper = subprocess.Popen(
        [*GANDIVA, "helper", "--server-name", "s1", "--gpus", "1", "--virtual", "--scheduler", first.address,
         "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert helper.stdout is not None and "listening" in helper.stdout.readline()
        wait_for(lambda: servers(stub(first.address)).get("s1"), 10)
        address = first.address
        first.call(first.server.stop(grace=0.5))  # the process dies; the fixture cleans up
        second = make_scheduler(sqlite_url, listen=address, tick_s=0.2)
        api = stub(second.address)
        # The helper reopens its command stream: a job submitted now runs on it.
        spec = common_pb2.JobSpec(name="after", command=[fake_job], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEPS": "30", "FAKE_STEP_S": "0.01"})
        job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id
        wait_for(lambda: job(api, job_id).state == common_pb2.JOB_STATE_SUCCEEDED, 30)
        assert job(api, job_id).steps >= 30 and servers(api)["s1"].up
    finally:
        helper.terminate()
        helper.wait(15)


def test_logs_follow_prints_output_as_it_is_written(tmp_path: Path) -> None:
    log = tmp_path / "j9.log"
    log.write_text("first line\n")
    follow = subprocess.Popen([*GANDIVA, "logs", "j9", "-f", "--log-dir", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "first line\n"
        with open(log, "a") as f:
            f.write("written later\n")
        assert follow.stdout.readline() == "written later\n"
    finally:
        follow.terminate()
        follow.wait(10)


def test_logs_follow_through_the_scheduler_ends_when_the_job_has_finished(
    scheduler_server: Any, helpers: Any, fake_job: str, tmp_path: Path, wait_for: Any
) -> None:
    """`gandiva logs ID -f` polled forever once the job had finished (as `kubectl logs -f`,
    it now follows until the job ends, prints what is left and exits 0)."""
    helpers("s1")
    api = stub(scheduler_server.address)
    wait_for(lambda: servers(api).get("s1"), 10)
    spec = common_pb2.JobSpec(name="short", command=[fake_job], workdir=str(tmp_path), gpus=1,
                              env={"FAKE_STEPS": "20", "FAKE_STEP_S": "0.05"})
    job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id
    wait_for(lambda: job(api, job_id).state == common_pb2.JOB_STATE_RUNNING, 30)
    follow = [*GANDIVA, "logs", job_id, "-f", "--scheduler", scheduler_server.address]
    running = subprocess.run(follow, check=False, capture_output=True, text=True, timeout=60)
    assert running.returncode == 0, running.stderr
    assert job(api, job_id).state == common_pb2.JOB_STATE_SUCCEEDED
    assert running.stdout == (tmp_path / "logs" / f"{job_id}.log").read_text()
    finished = subprocess.run(follow, check=False, capture_output=True, text=True, timeout=20)
    assert (finished.returncode, finished.stdout) == (0, running.stdout)
