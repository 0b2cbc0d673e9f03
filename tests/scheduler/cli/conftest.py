"""Fixtures for the command-line tests: the real entry points run in-process (fast)
or as installed scripts, against the real scheduler of tests/conftest.py, and a
scripted server (the Helper protocol, over the socket) when a test needs jobs to
run and end in a chosen way."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gandiva_cli import main as gandiva_main
from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import transport
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


def script_into_closed_pipe(name: str, *argv: str, timeout: float = 60) -> Result:
    """An installed console script whose stdout is a pipe nobody reads any more (as in
    `NAME ARGS | head -1` once head has exited): its first write fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([str(BIN / name), *argv], check=False, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    finally:
        os.close(write)
    return Result(proc.returncode, "", proc.stderr)


# The helpers above, as fixtures: with --import-mode=importlib a test module
# cannot import this conftest, but it can ask for these.
@pytest.fixture(name="list_jobs")
def _list_jobs_fixture() -> Callable[..., list]:
    return list_jobs


@pytest.fixture(name="script")
def _script_fixture() -> Callable[..., Result]:
    return script


@pytest.fixture(name="script_into_closed_pipe")
def _script_into_closed_pipe_fixture() -> Callable[..., Result]:
    return script_into_closed_pipe


@pytest.fixture
def bin_dir() -> Path:
    """Where the installed console scripts (gandiva, gandiva-submit) are."""
    return BIN


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


def _in_process(entry: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """A console script run through its entry function, output captured."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = entry(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def gandiva(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`gandiva ARGS...` through its entry function, output captured."""
    return _in_process(gandiva_main.main, capsys)


@pytest.fixture
def submit(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`gandiva-submit ARGS...` through its entry function, output captured."""
    return _in_process(submit_main.main, capsys)


class ScriptedHelper:
    """A server that speaks the Helper protocol (over the real socket) like
    `gandiva helper` does, but runs no processes: the test says when a launched
    job makes progress and how it ends, so exit codes can be checked exactly."""

    def __init__(self, address: str, wait_for: Callable[..., object], name: str = "n1",
                 gpus: int = 2, token: str = "") -> None:
        self.name = name
        self.wait_for = wait_for
        self.channel = transport.channel(address, transport.ClientSecurity(token)) if token else \
            grpc.insecure_channel(address)
        self.helper = helper_pb2_grpc.HelperStub(self.channel)
        self.helper.Register(helper_pb2.RegisterServerRequest(
            name=name, gpus=[common_pb2.Gpu(index=i, model="virtual",
                                            memory_total_bytes=16 << 30) for i in range(gpus)]))
        self.launched: dict[str, str] = {}  # job id -> incarnation
        self.logs: dict[str, bytes] = {}  # job id -> what its log holds (ReadLog answers it)
        self.commands = self.helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=name))
        self.thread = threading.Thread(target=self._obey, daemon=True)
        self.thread.start()

    def _obey(self) -> None:
        try:
            for command in self.commands:
                body = command.WhichOneof("body")
                if body == "launch":
                    self.launched[command.launch.job_id] = command.launch.incarnation
                data, size = b"", 0
                if body == "read_log":
                    read = command.read_log
                    log = self.logs.get(read.job_id, b"")
                    data, size = log[read.offset:read.offset + read.max_bytes], len(log)
                self.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
                    server=self.name, command_id=command.command_id, ok=True, data=data, log_size=size))
        except grpc.RpcError:
            pass  # the stream ends with the test
        except ValueError as exc:  # a report racing close(): "Cannot invoke RPC on closed channel!"
            if "closed channel" not in str(exc):
                raise

    def progress(self, job_id: str, steps: int, rate: float) -> None:
        """What the job's shim reports after `steps` mini-batches."""
        incarnation = self.wait_for(lambda: self.launched.get(job_id))
        messages = iter([
            runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(
                job_id=job_id, incarnation=str(incarnation), pid=1)),
            runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(steps=steps, rate=rate)),
        ])
        stream = runtime_pb2_grpc.RuntimeStub(self.channel).Connect(messages)
        scheduler = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.wait_for(lambda: scheduler.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).steps == steps)
        stream.cancel()

    def exit(self, job_id: str, code: int) -> None:
        """The job's process ends with this status."""
        incarnation = self.wait_for(lambda: self.launched.get(job_id))
        self.helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
            server=self.name, job_id=job_id, incarnation=str(incarnation), exit_code=code))

    def close(self) -> None:
        self.commands.cancel()
        self.channel.close()
        self.thread.join(timeout=10)


@pytest.fixture
def helper(sched, wait_for) -> Iterator[ScriptedHelper]:  # type: ignore[no-untyped-def]
    """A registered server "n1" with 2 GPUs whose jobs the test drives."""
    scripted = ScriptedHelper(sched.address, wait_for)
    try:
        yield scripted
    finally:
        scripted.close()
