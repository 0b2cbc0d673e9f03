"""Limits on what a client sends, and listings that stay usable at any size,
over real gRPC (and the CLI that pages through them)."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler import validation as v


@pytest.fixture
def stub(scheduler_server):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(scheduler_server.address) as ch:
        yield scheduler_pb2_grpc.SchedulerStub(ch)


def spec(**kw: object) -> common_pb2.JobSpec:
    base: dict[str, object] = {"command": ["python", "train.py"], "gpus": 1}
    base.update(kw)
    return common_pb2.JobSpec(**base)  # type: ignore[arg-type]


BIG = "x" * (v.MAX_COMMAND_BYTES + 1)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (spec(command=["python", "x" * (10 << 20)]), "spec.command"),
        (spec(command=["python"] + ["a"] * v.MAX_ARGS), "spec.command"),
        (spec(command=["python", "a\x00b"]), "spec.command[1]"),
        (spec(name="n" * (v.MAX_NAME + 1)), "spec.name"),
        (spec(name="bad\nname"), "spec.name"),
        (spec(name="nul\x00"), "spec.name"),
        (spec(name="safe\u202egpj.exe"), "spec.name"),  # displays as "safeexe.jpg"
        (spec(name="csi\x9b31m"), "spec.name"),
        (spec(user="\u2066root\u2069"), "spec.user"),
        (spec(user="u" * (v.MAX_USER + 1)), "spec.user"),
        (spec(workdir="/" + "d" * v.MAX_WORKDIR), "spec.workdir"),
        (spec(env={f"V{i}": "1" for i in range(v.MAX_ENV_ENTRIES + 1)}), "spec.env"),
        (spec(env={"A": "x" * v.MAX_ENV_BYTES}), "spec.env"),
        (spec(env={"A": "nul\x00"}), "spec.env[A]"),
        (spec(params={f"p{i}": "1" for i in range(v.MAX_PARAMS + 1)}), "spec.params"),
        (spec(priority=v.MAX_PRIORITY + 1), "spec.priority"),
        (spec(index=-1), "spec.index"),
    ],
)
def test_oversized_or_unstorable_fields_are_refused_naming_the_field(
    stub, bad: common_pb2.JobSpec, field: str
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()
    assert list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []


def test_too_many_members_refused_before_anything_is_written(stub) -> None:  # type: ignore[no-untyped-def]
    jobs = [spec(index=i) for i in range(v.MAX_MEMBERS + 1)]
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="sweep", jobs=jobs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "jobs" in err.value.details()
    assert list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []


def test_a_request_over_the_receive_limit_is_refused(stub) -> None:  # type: ignore[no-untyped-def]
    jobs = [spec(command=["python", "x" * (100 << 10)]) for _ in range(200)]  # ~20 MiB
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="big", jobs=jobs))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_listings_of_large_jobs_stay_within_a_clients_message_limit(scheduler_server, stub) -> None:  # type: ignore[no-untyped-def]
    # 60 jobs with ~120 KiB commands: 7 MiB in all, more than a client takes in one message.
    big = "y" * (120 << 10)
    jobs = [spec(command=["python", big]) for _ in range(60)]
    stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="big", jobs=jobs))
    first = stub.ListJobs(scheduler_pb2.ListJobsRequest())
    assert 0 < len(first.jobs) < 60 and first.next_page_token
    out = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "get", "jobs", "-o", "json",
         "--scheduler", scheduler_server.address], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert len(listed) == 60 and len({j["id"] for j in listed}) == 60


def test_paging_is_complete_and_stable_while_jobs_arrive(stub) -> None:  # type: ignore[no-untyped-def]
    ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec())).job.id for _ in range(23)]
    seen: list[str] = []
    token = ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=5, page_token=token))
        assert len(page.jobs) <= 5
        seen += [j.id for j in page.jobs]
        if len(seen) == 10:  # a job submitted mid-listing shows up at the end, nothing is repeated
            ids.append(stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec())).job.id)
        token = page.next_page_token
        if not token:
            break
    assert seen == ids
    events = stub.ListEvents(scheduler_pb2.ListEventsRequest(page_size=7))
    assert len(events.events) == 7 and events.next_page_token
    rest = stub.ListEvents(scheduler_pb2.ListEventsRequest(page_size=1000, page_token=events.next_page_token))
    assert rest.events[0].id == events.events[-1].id + 1


def test_a_multi_jobs_members_are_listed_in_index_order_across_pages(stub) -> None:  # type: ignore[no-untyped-def]
    # Members share one submission time: they were listed by their random ids (arr-7,
    # arr-2, arr-11, ...) in `gandiva get jobs` and on the dashboard.
    jobs = [spec(index=i, name=f"arr-{i}") for i in range(12)]
    stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="arr", jobs=jobs))
    after = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(name="later"))).job.id
    names: list[str] = []
    token = ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=5, page_token=token))
        names += [j.spec.name for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert names == [f"arr-{i}" for i in range(12)] + ["later"]
    # A token of an older scheduler (submitted_at, id) still works: nothing is skipped.
    first = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=3))
    last = first.jobs[-1]
    old = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_token=_b64(json.dumps([last.submitted_at, last.id]))))
    assert [j.spec.name for j in old.jobs][-1:] == ["later"] and after == old.jobs[-1].id
    assert {j.spec.name for j in old.jobs} >= {f"arr-{i}" for i in range(3, 12)}


def _b64(text: str) -> str:
    import base64

    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


# Forged: an event id past int64 was INTERNAL (OverflowError, a traceback in the log); a job
# cursor at NaN or infinity listed nothing, silently; one whose job id was a lone surrogate
# was INTERNAL (UnicodeEncodeError), and one with a NUL too on PostgreSQL (DBAPIError).
@pytest.mark.parametrize("token", ["garbage!", "e30", "W10", "x" * 600, _b64(str(2**63)), _b64("-" + "9" * 300),
                                   _b64('[NaN, "j-1"]'), _b64('[Infinity, "j-1"]'), _b64("[" + "9" * 330 + ", \"j-1\"]"),
                                   _b64('[1.0, 4294967296, "j-1"]'), _b64('[1.0, true, "j-1"]'),
                                   _b64('[1.0, 0, "\\ud800"]'), _b64('[1.0, 0, "j\\u0000"]'), _b64('[1.0, "j\\u0000"]')])
def test_a_bad_page_token_is_invalid_argument(stub, token: str) -> None:  # type: ignore[no-untyped-def]
    for call in (lambda: stub.ListJobs(scheduler_pb2.ListJobsRequest(page_token=token)),
                 lambda: stub.ListEvents(scheduler_pb2.ListEventsRequest(page_token=token))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in err.value.details()


def test_cli_limit_and_user_filter(scheduler_server, stub) -> None:  # type: ignore[no-untyped-def]
    for user in ("ann", "ann", "ben"):
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(user=user)))

    def cli(*args: str) -> list[dict]:
        out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "get", "jobs", "-o", "json",
                              "--scheduler", scheduler_server.address, *args],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert [j["user"] for j in cli("--user", "ann")] == ["ann", "ann"]
    assert len(cli("--limit", "2")) == 2


def test_array_too_large_is_refused_without_allocating() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli.submit", "--array", "0-1000000000", "--dry-run",
         "--scheduler", "127.0.0.1:9", "--", "python", "t.py"],
        check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--array: more than 10000 members" in out.stderr
