"""`gandiva suspend`/`resume`/`migrate` on a job that has another command in progress (a
periodic checkpoint, every few seconds, or another client's action): the scheduler refuses
FAILED_PRECONDITION "try again shortly", and the command used to exit 2 with that, leaving
the user to retry by hand. It now asks again, saying so once, for up to BUSY_WAIT_S."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli import client
from scheduler.errors import BUSY_METADATA
from tests.scheduler.api.test_runtime_api import FakeShim, _launched

BUSY = "job j-1 has a command in progress; try again shortly"  # scheduler/errors.Busy's words


class Busy(scheduler_pb2_grpc.SchedulerServicer):
    """Refuses each action ``busy_for`` times as a job with a command in progress, then does it."""

    def __init__(self, busy_for: int, words: str = BUSY) -> None:
        self.busy_for = busy_for
        self.words = words
        self.calls: list[str] = []

    def _act(self, method: str, request, context, state: int):  # type: ignore[no-untyped-def]
        self.calls.append(method)
        if self.calls.count(method) <= self.busy_for:
            if self.words != BUSY:  # a scheduler of other words marks its refusal as busy
                context.set_trailing_metadata((BUSY_METADATA,))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.words)
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
    busy_for, words = request.param if isinstance(request.param, tuple) else (request.param, BUSY)
    servicer = Busy(busy_for, words)
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


@pytest.mark.parametrize("busy_scheduler", [(2, "job j-1 is mid-checkpoint; ask again in a moment")], indirect=True)
def test_a_busy_refusal_in_other_words_is_asked_again_by_its_metadata(
        gandiva, busy_scheduler: tuple[str, Busy]) -> None:
    """The client told a busy job by the scheduler's English ("has a command in progress"):
    a reworded refusal exited 2 at once. It now goes by the refusal's trailing metadata."""
    address, servicer = busy_scheduler
    r = gandiva("suspend", "--scheduler", address, "j-1")
    assert r.code == 0, r
    assert servicer.calls == ["SuspendJob"] * 3, servicer.calls
    assert r.err.count("mid-checkpoint") == 1 and "asking again" in r.err, r.err


def test_a_suspend_during_a_checkpoint_in_flight_is_refused_as_busy_then_done(
        gandiva, scheduler_server, wait_for, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race CI met (a periodic checkpoint in flight as an operator acts), forced: the
    job is held in the engine's in-flight set, as a checkpoint holds it. The real
    scheduler's refusal carries the busy metadata; `gandiva suspend` asks again and the
    suspend is done once the hold ends (released at the client's first busy answer)."""
    engine = scheduler_server.server.engine
    refusals: list[tuple] = []
    real_is_busy = client.is_busy

    async def hold(job_id: str, held: bool) -> None:
        (engine.inflight.add if held else engine.inflight.discard)(job_id)

    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, _, commands, job, launch = _launched(ch)
        shim = FakeShim(ch, job.id, launch.incarnation)
        try:
            get = lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
            wait_for(lambda: get().state == common_pb2.JOB_STATE_RUNNING, 30)
            scheduler_server.call(hold(job.id, True))

            def busy_then_released(exc: grpc.RpcError) -> bool:
                busy = real_is_busy(exc)
                refusals.append(tuple(tuple(m) for m in exc.trailing_metadata() or ()))
                if busy:
                    scheduler_server.call(hold(job.id, False))
                return busy

            monkeypatch.setattr(client, "is_busy", busy_then_released)
            r = gandiva("suspend", "--scheduler", scheduler_server.address, job.id)
            assert r.code == 0, r
            # Each refusal carried the metadata (one, unless another command met the retry).
            assert refusals and set(refusals) == {(BUSY_METADATA,)}, refusals
            assert r.err.count("has a command in progress") == 1, r.err
            assert get().state == common_pb2.JOB_STATE_SUSPENDED
        finally:
            shim.close()
            commands.cancel()
