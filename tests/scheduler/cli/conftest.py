"""Fixtures for the command-line tests: the real entry points run in-process (fast)
or as installed scripts, against the real scheduler of tests/conftest.py, and a
real `gandiva helper` daemon when a test needs jobs to actually run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli import main as gandiva_main
from scheduler.cli import submit as submit_main

BIN = Path(sys.executable).parent


@dataclass
class Result:
    code: int
    out: str
    err: str


def list_jobs(stub: scheduler_pb2_grpc.SchedulerStub) -> list:
    return list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs)


def script(name: str, *argv: str, timeout: float = 60, env: dict | None = None) -> Result:
    """An installed console script (.venv/bin/NAME), as a user runs it."""
    proc = subprocess.run([str(BIN / name), *argv], check=False, capture_output=True,
                          text=True, timeout=timeout, env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def wait_for(predicate: Callable[[], object], timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# The helpers above, as fixtures: with --import-mode=importlib a test module
# cannot import this conftest, but it can ask for these.
@pytest.fixture(name="list_jobs")
def _list_jobs_fixture() -> Callable[..., list]:
    return list_jobs


@pytest.fixture(name="script")
def _script_fixture() -> Callable[..., Result]:
    return script


@pytest.fixture
def bin_dir() -> Path:
    """Where the installed console scripts (gandiva, gandiva-submit) are."""
    return BIN


@pytest.fixture(name="wait_for")
def _wait_for_fixture() -> Callable[..., object]:
    return wait_for


@pytest.fixture
def sched(scheduler_server, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The test scheduler, found by every client through GANDIVA_SCHEDULER."""
    monkeypatch.setenv("GANDIVA_SCHEDULER", scheduler_server.address)
    return scheduler_server


@pytest.fixture
def stub(sched) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:  # type: ignore[no-untyped-def]
    """A plain gRPC stub to check what the CLI did, independently of the CLI."""
    with grpc.insecure_channel(sched.address) as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)


@pytest.fixture
def gandiva(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`gandiva ARGS...` through its entry function, output captured."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = gandiva_main.main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def submit(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`gandiva-submit ARGS...` through its entry function, output captured."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = submit_main.main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def helper(sched, stub, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A real `gandiva helper` daemon with 2 virtual GPUs; yields its server name."""
    name = "n1"
    log = (tmp_path / "helper.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "gandiva"), "helper", "--server-name", name, "--gpus", "2", "--virtual",
         "--ramdisk", str(tmp_path / "ramdisk"), "--scheduler", sched.address],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
    )
    try:
        wait_for(lambda: any(s.name == name and s.up for s in
                             stub.ListServers(scheduler_pb2.ListServersRequest()).servers))
        yield name
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
