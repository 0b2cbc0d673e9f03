"""One user cannot flood the queue: --max-jobs-per-user bounds the jobs a user has not yet
ended (queued, running, suspended), over real gRPC. Past it a submission is refused with
RESOURCE_EXHAUSTED naming the limit, the count and what to do; other users and operators
go on; concurrent submissions cannot both pass at the limit minus one; a re-sent request id
still answers with its job."""

from __future__ import annotations

import threading

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.client import describe_rpc_error
from scheduler.core import Settings
from tests.scheduler.security.conftest import make_token


def _submit(stub: scheduler_pb2_grpc.SchedulerStub, request_id: str = "", user: str = "") -> common_pb2.Job:
    spec = common_pb2.JobSpec(command=["python", "train.py"], gpus=1, user=user)
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec, request_id=request_id)).job


def test_a_user_past_max_jobs_per_user_is_refused_and_others_are_not(make_scheduler, sqlite_url, connect) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token", settings=Settings(max_jobs_per_user=5))
    alice = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, make_token(sqlite_url, "alice")))
    bob = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, make_token(sqlite_url, "bob")))
    root = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, make_token(sqlite_url, "root", "operator")))

    first = _submit(alice, request_id="r-1")
    for _ in range(4):
        _submit(alice)
    with pytest.raises(grpc.RpcError) as err:
        _submit(alice)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    said = err.value.details()
    assert "'alice' has 5 jobs not yet ended" in said and "at most 5 per user" in said
    assert "--max-jobs-per-user" in said and "wait for some to end" in said
    # A sweep that would pass the limit is refused whole.
    sweep = [common_pb2.JobSpec(command=["python", "t.py"], gpus=1)] * 2
    with pytest.raises(grpc.RpcError) as err:
        alice.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=sweep))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # Her answer lost, she sends the first submission again: its job, not a refusal.
    assert _submit(alice, request_id="r-1").id == first.id
    # Others are not held back by her jobs, nor is an operator.
    _submit(bob)
    for _ in range(6):
        _submit(root)
    # A job that ends frees a place.
    alice.KillJob(scheduler_pb2.JobActionRequest(id=first.id))
    _submit(alice)
    mine = alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs
    assert len(mine) == 6  # five unfinished and the killed one


def test_concurrent_submissions_cannot_both_pass_at_the_limit_minus_one(make_scheduler, db_url, connect) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(db_url, tick_s=0.2, auth="token", settings=Settings(max_jobs_per_user=5))
    token = make_token(db_url, "alice")
    stubs = [scheduler_pb2_grpc.SchedulerStub(connect(sched.address, token)) for _ in range(4)]
    for _ in range(4):
        _submit(stubs[0])
    outcomes: list[str] = []
    start = threading.Barrier(16)

    def one(i: int) -> None:
        start.wait()
        try:
            _submit(stubs[i % 4])
            outcomes.append("ok")
        except grpc.RpcError as err:
            outcomes.append(err.code().name)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["RESOURCE_EXHAUSTED"] * 15 + ["ok"]
    assert len(stubs[0].ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == 5


def test_without_auth_each_user_name_is_counted_and_0_is_no_limit(make_scheduler, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(max_jobs_per_user=2))
    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        _submit(stub, user="ann")
        _submit(stub, user="ann")
        with pytest.raises(grpc.RpcError) as err:
            _submit(stub, user="ann")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "'ann' has 2 jobs" in err.value.details()
        # What gandiva / gandiva-submit print (not "too large: ...", gRPC's size limit).
        assert describe_rpc_error(err.value, sched.address).startswith("refused: user 'ann' has 2 jobs not yet ended")
        _submit(stub, user="ben")
    sched.stop()
    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(max_jobs_per_user=0))
    with grpc.insecure_channel(sched.address) as channel:
        _submit(scheduler_pb2_grpc.SchedulerStub(channel), user="ann")
    with pytest.raises(Exception, match="max_jobs_per_user"):
        Settings(max_jobs_per_user=-1)


def test_a_multi_job_past_the_limit_is_refused_before_its_members_are_checked(make_scheduler, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Each member of a refused multi-job was checked and built first: 10,000 members (a
    380 KB request) held the event loop 2-3 s before the refusal, and four clients sending
    them again and again kept another client's GetJob waiting 6-8 s (load average 11). So
    a member the limit never lets in (here the last asks 3 GPUs) is never looked at; a
    request taken before and sent again still answers with what it made."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(max_jobs_per_user=5))
    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        member = common_pb2.JobSpec(command=["python", "t.py"], gpus=1, user="ann")
        taken = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=[member] * 3, request_id="s-1"))
        huge = [*[member] * 9_999, common_pb2.JobSpec(command=["python", "t.py"], gpus=3, user="ann")]
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=huge), timeout=60)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        assert "'ann' has 3 jobs not yet ended" in err.value.details() and "these 10000 would make 10003" in err.value.details()
        _submit(stub, user="ann")
        _submit(stub, user="ann")
        again = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="s", jobs=[member] * 3, request_id="s-1"))
        assert again.multi_job_id == taken.multi_job_id
        assert len(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == 5
