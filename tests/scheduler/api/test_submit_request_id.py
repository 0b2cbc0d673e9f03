"""A submission sent again with its request id (its answer was lost) creates nothing
new: the scheduler answers with what the first one created, over a real socket, on
SQLite and PostgreSQL, across a restart and when both copies arrive at once; and
gandiva-submit sends it again by itself when the scheduler took it but the answer was lost."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def _spec(*command: str, gpus: int = 1, **kw: Any) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=list(command or ("python", "train.py")), gpus=gpus, **kw)


def _all_jobs(stub: scheduler_pb2_grpc.SchedulerStub) -> list[common_pb2.Job]:
    return list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs)


def test_a_submission_sent_again_with_its_request_id_creates_nothing_new(db_url: str, make_scheduler) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(db_url)
    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(name="a"), request_id="r-1")).job
        again = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(name="a"), request_id="r-1")).job
        assert again.id == first.id and again.spec.name == "a"
        # Without an id, or with another, each submission is a job of its own.
        other = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(name="a"), request_id="r-2")).job
        plain = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(name="a"))).job
        assert len({first.id, other.id, plain.id}) == 3

        # The same id for something else is refused, naming the job and what differs.
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec("python", "eval.py", name="a"),
                                                          request_id="r-1"))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert first.id in err.value.details() and "command" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(), request_id="bad id\n"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in err.value.details()

        sweep = [_spec(params={"lr": str(lr)}) for lr in (0.1, 0.01, 0.001)]
        mj = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=sweep, request_id="r-1"))
        mj_again = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=sweep, request_id="r-1"))
        assert mj_again.multi_job_id == mj.multi_job_id
        assert [j.id for j in mj_again.jobs] == [j.id for j in mj.jobs] and len(mj.jobs) == 3
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=sweep[:2], request_id="r-1"))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "number of jobs" in err.value.details()
        assert len(_all_jobs(stub)) == 3 + 3
    sched.stop()

    # Remembered across a restart: the id is kept with the job in the database.
    sched = make_scheduler(db_url)
    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        assert stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(name="a"), request_id="r-1")).job.id == first.id
        assert len(_all_jobs(stub)) == 6


def test_copies_of_one_submission_arriving_at_once_make_one_job(db_url: str, make_scheduler) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(db_url)
    ids: list[str] = []
    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        go = threading.Barrier(8)

        def send() -> None:
            go.wait()
            ids.append(stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(), request_id="same"),
                                      timeout=30).job.id)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(ids) == 8 and len(set(ids)) == 1, ids
        assert [j.id for j in _all_jobs(stub)] == ids[:1]


class _LoseFirstAnswer(grpc.aio.ServerInterceptor):
    """The first SubmitJob is done, and its answer replaced by a dropped connection."""

    def __init__(self) -> None:
        self.calls = 0

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.endswith("/SubmitJob"):
            return handler
        inner = handler.unary_unary

        async def call(request: Any, context: Any) -> Any:
            reply = await inner(request, context)
            self.calls += 1
            if self.calls == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Connection reset by peer")
            return reply

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def test_gandiva_submit_sends_a_submission_whose_answer_was_lost_again_and_makes_one_job(
        sqlite_url: str, make_scheduler, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from scheduler.cli.submit import main as submit_main

    lose = _LoseFirstAnswer()
    sched = make_scheduler(sqlite_url, interceptors=[lose])
    code = submit_main(["--scheduler", sched.address, "--no-wait", "--", "python", "t.py"])
    out, err = capsys.readouterr()
    assert code == 0 and lose.calls == 2, (out, err)
    assert "sending the submission again with its request id" in err and "nothing is submitted twice" in err
    with grpc.insecure_channel(sched.address) as channel:
        jobs = _all_jobs(scheduler_pb2_grpc.SchedulerStub(channel))
    assert len(jobs) == 1 and f"submitted job {jobs[0].id}" in out
