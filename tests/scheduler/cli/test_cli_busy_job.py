"""`gandiva suspend`/`resume`/`migrate` on a job that has another command in progress (a
periodic checkpoint, every few seconds, or another client's action): the scheduler refuses
FAILED_PRECONDITION "try again shortly", and the command used to exit 2 with that, leaving
the user to retry by hand. It now asks again, saying so once, for up to BUSY_WAIT_S."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2_grpc
from scheduler.cli import client

BUSY = "job j-1 has a command in progress; try again shortly"  # scheduler/engine/live.py's words


class Busy(scheduler_pb2_grpc.SchedulerServicer):
    """Refuses each action ``busy_for`` times as a job with a command in progress, then does it."""

    def __init__(self, busy_for: int) -> None:
        self.busy_for = busy_for
        self.calls: list[str] = []

    def _act(self, method: str, request, context, state: int):  # type: ignore[no-untyped-def]
        self.calls.append(method)
        if self.calls.count(method) <= self.busy_for:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUSY)
        return common_pb2.Job(id=request.id, state=state)

    def SuspendJob(self, request, context):  # type: ignore[no-untyped-def]
        return self._act("SuspendJob", request, context, common_pb2.JOB_STATE_SUSPENDED)

    def ResumeJob(self, request, context):  # type: ignore[no-untyped-def]
        return self._act("ResumeJob", request, context, common_pb2.JOB_STATE_RUNNING)

    def MigrateJob(self, request, context):  # type: ignore[no-untyped-def]
        return self._act("MigrateJob", request, context, common_pb2.JOB_STATE_MIGRATING)

    def KillJob(self, request, context):  # type: ignore[no-untyped-def]
        self.calls.append("KillJob")
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, BUSY)


@pytest.fixture
def busy_scheduler(request: pytest.FixtureRequest) -> Iterator[tuple[str, Busy]]:
    servicer = Busy(request.param)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(0)


@pytest.mark.parametrize("busy_scheduler", [2], indirect=True)
@pytest.mark.parametrize(("action", "args", "method", "said"), [
    ("suspend", [], "SuspendJob", "suspended"),
    ("resume", [], "ResumeJob", "resumed"),
    ("migrate", ["--to", "s2"], "MigrateJob", "migrating to s2"),
])
def test_an_action_on_a_job_busy_with_a_checkpoint_is_asked_again_until_it_is_done(
        gandiva, busy_scheduler: tuple[str, Busy], action: str, args: list[str], method: str, said: str) -> None:
    address, servicer = busy_scheduler
    r = gandiva(action, "--scheduler", address, "j-1", *args)
    assert r.code == 0, r
    assert servicer.calls == [method] * 3, servicer.calls
    assert said in r.out, r
    # said once, not at every try
    assert r.err.count("has a command in progress") == 1 and "asking again for up to 30s" in r.err, r.err


@pytest.mark.parametrize("busy_scheduler", [10**6], indirect=True)
def test_a_job_busy_for_longer_than_the_wait_is_reported_in_one_line_and_exits_2(
        gandiva, busy_scheduler: tuple[str, Busy], monkeypatch: pytest.MonkeyPatch) -> None:
    address, servicer = busy_scheduler
    monkeypatch.setattr(client, "BUSY_WAIT_S", 1.0)
    r = gandiva("suspend", "--scheduler", address, "j-1")
    assert r.code == 2, r
    assert 2 <= servicer.calls.count("SuspendJob") <= 4, servicer.calls  # 0.25 + 0.5 s of back-off
    last = r.err.strip().splitlines()[-1]
    assert "j-1" in last and "try again shortly" in last, r.err
    # Other refusals are not waited on: kill answers at once.
    servicer.calls.clear()
    r = gandiva("kill", "--scheduler", address, "j-1")
    assert r.code == 2 and servicer.calls == ["KillJob"], (r, servicer.calls)
