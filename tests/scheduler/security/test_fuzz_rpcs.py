"""Property tests over real gRPC: every RPC of the Scheduler, Helper and Runtime
services (and the helpers' HelperAgent) gets generated messages, valid and not
(NUL, control characters, huge strings, NaN, extreme integers). The server never
crashes, answers every call with a clear status (never UNKNOWN or INTERNAL), and a
refused submission writes nothing. Bounded for CI: a few dozen examples per RPC."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

from .messages import message_dict, messages, nasty_text

# What a client may hear for a bad or unlucky request: all say what is wrong.
CLEAR = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a stream that stayed open, as it should
}
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def _check(call: Any) -> Any:
    try:
        return call()
    except grpc.RpcError as err:
        assert err.code() in CLEAR, f"{err.code()}: {err.details()}"
        assert err.details(), "a status without a message"
        return None


def _alive(channel: grpc.Channel) -> int:
    """The server still serves; returns how many jobs it holds."""
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    total, token = 0, ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_token=token), timeout=10)
        total += len(page.jobs)
        token = page.next_page_token
        if not token:
            return total


# Mostly-valid specs too, so that the success paths and their writes are exercised.
valid_spec = st.builds(
    common_pb2.JobSpec,
    name=st.text(max_size=30), command=st.lists(st.text(max_size=30), min_size=1, max_size=4).map(lambda c: ["python", *c]),
    gpus=st.sampled_from([1, 2, 4, 3, 0, 2048]), priority=st.integers(-1, 5),
    env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=20), max_size=3),
    params=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)
any_spec = st.one_of(valid_spec, messages(common_pb2.JobSpec))

SCHEDULER_RPCS: dict[str, st.SearchStrategy[Any]] = {
    "SubmitJob": st.builds(scheduler_pb2.SubmitJobRequest, spec=any_spec, dry_run=st.booleans()),
    "SubmitMultiJob": st.builds(scheduler_pb2.SubmitMultiJobRequest, name=nasty_text,
                                jobs=st.lists(any_spec, max_size=4), dry_run=st.booleans()),
    **{name: messages(getattr(scheduler_pb2, req)) for name, req in (
        ("GetJob", "GetJobRequest"), ("ListJobs", "ListJobsRequest"), ("KillJob", "JobActionRequest"),
        ("SetPriority", "SetPriorityRequest"), ("SuspendJob", "JobActionRequest"),
        ("ResumeJob", "JobActionRequest"), ("MigrateJob", "MigrateJobRequest"),
        ("ListServers", "ListServersRequest"), ("ListEvents", "ListEventsRequest"),
        ("ReadJobLog", "ReadJobLogRequest"), ("CordonServer", "CordonServerRequest"),
        ("UncordonServer", "CordonServerRequest"), ("DrainServer", "CordonServerRequest"),
        ("ListProblems", "ListProblemsRequest"), ("GetUsage", "GetUsageRequest"),
        ("ListPlacements", "ListPlacementsRequest"))},
}
HELPER_RPCS = {
    "Register": helper_pb2.RegisterServerRequest, "Heartbeat": helper_pb2.HeartbeatRequest,
    "ReportGpuSamples": helper_pb2.GpuSamplesRequest, "ReportProcessExit": helper_pb2.ProcessExitRequest,
    "ReportCommandResult": helper_pb2.HelperCommandResult,
}


@pytest.fixture
def fuzz_server(db_url: str, make_scheduler):  # type: ignore[no-untyped-def]
    # db_url first: fixtures end in reverse order, so the scheduler stops (and
    # flushes its last progress) before a PostgreSQL test database is dropped.
    sched = make_scheduler(db_url, tick_s=0.5)
    with grpc.insecure_channel(sched.address) as ch:
        yield ch


def test_every_scheduler_rpc_is_fuzzed() -> None:
    methods = set(scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].methods_by_name)
    assert methods - {"WatchEvents"} == set(SCHEDULER_RPCS), "a new RPC needs a strategy here"


@pytest.mark.parametrize("method", sorted(SCHEDULER_RPCS))
def test_scheduler_rpcs(fuzz_server: grpc.Channel, method: str) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(fuzz_server)

    @FUZZ
    @given(request=SCHEDULER_RPCS[method])
    def prop(request: Any) -> None:
        before = _alive(fuzz_server)
        reply = _check(lambda: getattr(stub, method)(request, timeout=10))
        after = _alive(fuzz_server)
        if method.startswith("Submit"):
            written = 0 if reply is None or request.dry_run else (1 if method == "SubmitJob" else len(request.jobs))
            assert after == before + written  # all or nothing
        else:
            assert after == before

    prop()


@pytest.mark.parametrize("method", sorted(HELPER_RPCS))
def test_helper_rpcs(fuzz_server: grpc.Channel, method: str) -> None:
    stub = helper_pb2_grpc.HelperStub(fuzz_server)

    @FUZZ
    @given(request=messages(HELPER_RPCS[method]))
    def prop(request: Any) -> None:
        _check(lambda: getattr(stub, method)(request, timeout=10))
        _alive(fuzz_server)

    prop()


def test_an_exit_reported_under_a_name_never_registered_is_refused_and_writes_nothing(
        fuzz_server: grpc.Channel) -> None:
    """It was taken: the job's events then said `job.stale_exit  ghost  old launch i exited`,
    from a "server" the scheduler never knew (one event per call, as many as sent)."""
    sched = scheduler_pb2_grpc.SchedulerStub(fuzz_server)
    job = sched.SubmitJob(scheduler_pb2.SubmitJobRequest(
        spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1)), timeout=10).job
    events = list(sched.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id), timeout=10).events)
    with pytest.raises(grpc.RpcError) as err:
        helper_pb2_grpc.HelperStub(fuzz_server).ReportProcessExit(helper_pb2.ProcessExitRequest(
            server="ghost", job_id=job.id, incarnation="i", exit_code=1), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "server 'ghost' not found" in err.value.details()
    assert list(sched.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id), timeout=10).events) == events
    assert sched.GetJob(scheduler_pb2.GetJobRequest(id=job.id), timeout=10).state == common_pb2.JOB_STATE_QUEUED


def test_streaming_rpcs(fuzz_server: grpc.Channel) -> None:
    sched = scheduler_pb2_grpc.SchedulerStub(fuzz_server)
    helper = helper_pb2_grpc.HelperStub(fuzz_server)
    runtime = runtime_pb2_grpc.RuntimeStub(fuzz_server)

    def drain(call: Any) -> None:
        _check(lambda: list(itertools.islice(call, 50)))

    @FUZZ
    @given(watch=messages(scheduler_pb2.WatchEventsRequest),
           commands=messages(helper_pb2.ReceiveCommandsRequest),
           session=st.lists(messages(runtime_pb2.RuntimeMessage), max_size=5))
    def prop(watch: Any, commands: Any, session: list[Any]) -> None:
        # The three open at once, each with its own deadline: a stream that stays open (as
        # it should) is waited for alongside the others, not after them.
        calls = [sched.WatchEvents(watch, timeout=0.5), helper.ReceiveCommands(commands, timeout=0.5),
                 runtime.Connect(iter(session), timeout=1.0)]
        for call in calls:
            drain(call)
        _alive(fuzz_server)

    prop()


def test_runtime_reports_of_a_real_job_are_stored_or_cleaned(fuzz_server: grpc.Channel) -> None:
    """A connected runtime sends any progress (NaN, huge metrics), migratability (NUL in
    the reason) and acks: the job's row stays readable and storable."""
    sched = scheduler_pb2_grpc.SchedulerStub(fuzz_server)
    job = sched.SubmitJob(scheduler_pb2.SubmitJobRequest(
        spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job
    runtime = runtime_pb2_grpc.RuntimeStub(fuzz_server)
    hello = runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job.id))

    report = st.one_of(
        message_dict(runtime_pb2.ProgressReport.DESCRIPTOR).map(
            lambda p: runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(**p))),
        messages(runtime_pb2.MigratabilityReport).map(lambda m: runtime_pb2.RuntimeMessage(migratability=m)),
        messages(runtime_pb2.CommandAck).map(lambda a: runtime_pb2.RuntimeMessage(ack=a)),
    )

    @FUZZ
    @given(reports=st.lists(report, min_size=1, max_size=4))
    def prop(reports: list[Any]) -> None:
        msgs = [hello, *reports]
        call = runtime.Connect(iter(msgs), timeout=1.0)
        _check(lambda: list(call))
        got = sched.GetJob(scheduler_pb2.GetJobRequest(id=job.id), timeout=10)
        assert got.id == job.id and got.steps >= 0

    prop()


@contextlib.contextmanager
def _agent(root: Any, token: str = "") -> Iterator[tuple[Any, Any, grpc.Channel]]:
    """A real HelperAgent (with ``token``: a helper's, which takes only ticketed streams)
    on its own event loop in a thread, over a small ramdisk ``root/rd``."""
    import asyncio
    import threading

    from migration_helper.agent import agent_server
    from migration_helper.ramdisk import Ramdisk

    ramdisk = Ramdisk(root / "rd", max_bytes=1 << 20)
    ramdisk.prepare()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = agent_server(ramdisk, token)  # as the helper serves it
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield ramdisk, helper_pb2_grpc.HelperAgentStub(ch), ch
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def agent(tmp_path):  # type: ignore[no-untyped-def]
    with _agent(tmp_path) as served:
        yield served


def test_a_checkpoint_stream_of_bytes_that_are_not_chunks_is_invalid_argument(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A peer's stream that does not parse was UNKNOWN with gRPC's exception text."""
    ramdisk, _, channel = agent
    put = channel.stream_unary("/gandiva.v1.HelperAgent/PutCheckpoint")  # raw bytes, no stub codec
    for stream in ([b"\xff\xff\xff\xff"], [helper_pb2.CheckpointChunk(job_id="j-1").SerializeToString(), b"\xff"]):
        try:
            put(iter(stream), timeout=10)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert "PutCheckpoint: the request is not a gandiva.v1.CheckpointChunk message" in err.details()
        else:
            raise AssertionError("a malformed stream was taken")
        # The half-written copy is removed as the server's handler unwinds, which may end just
        # after the client has its answer: nothing may be left once it has.
        deadline = time.monotonic() + 10
        while _incoming(ramdisk.root) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {p.name for p in tmp_path.iterdir()} == {"rd"} and not _incoming(ramdisk.root)


def _incoming(root: Any) -> list[Any]:
    """The half-written copies under ``root``; one that vanishes while the walk reads it
    (the handler removing it that moment) counts as still there: look again."""
    try:
        return list(root.rglob(".incoming-*"))
    except FileNotFoundError:
        return [None]


def test_helper_agent_put_checkpoint(agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    ramdisk, stub, _ = agent

    @FUZZ
    @given(chunks=st.lists(messages(helper_pb2.CheckpointChunk), max_size=6))
    def prop(chunks: list[Any]) -> None:
        reply = _check(lambda: stub.PutCheckpoint(iter(chunks), timeout=10))
        if reply is not None:
            assert ramdisk.root in Path(reply.path).parents
        # Nothing half-written stays, and nothing outside the ramdisk is touched.
        assert not _incoming(ramdisk.root)
        assert {p.name for p in tmp_path.iterdir()} == {"rd"}

    prop()


AGENT_TOKEN = "gdv.gpu2.secret-of-gpu2"


def _stream(job_id: str, name: str, files: list[tuple[str, bytes]]) -> list[Any]:
    """The chunks a sender makes of ``files`` (as checkpoint_chunks does)."""
    import hashlib

    digest = hashlib.sha256()
    chunks = []
    for i, (file, data) in enumerate(files):
        digest.update(data)
        chunks.append(helper_pb2.CheckpointChunk(name=file, data=data, **(
            {"job_id": job_id, "checkpoint_name": name} if i == 0 else {})))
    return [*chunks, helper_pb2.CheckpointChunk(last=True, sha256=digest.hexdigest())]


plain = st.text(alphabet="abcXYZ019._=-", min_size=1, max_size=12).filter(lambda n: not n.startswith("."))
well_formed = st.builds(_stream, st.one_of(plain, nasty_text), st.one_of(plain, nasty_text),
                        st.lists(st.tuples(plain, st.binary(max_size=3000)), min_size=1, max_size=3,
                                 unique_by=lambda f: f[0]))


def test_helper_agent_put_checkpoint_with_tickets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A helper with a token: random and well-formed streams with the scheduler's ticket for
    them, one for another checkpoint, garbage or none. The agent stays up, answers each with
    a clear status, writes only a ticketed stream and only as <ramdisk>/<job>/<name>, and
    refuses the same ticket once its checkpoint has landed."""
    from pathlib import Path

    from scheduler import auth

    refusals = CLEAR | {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}

    def put(stub: Any, chunks: list[Any], ticket: str) -> tuple[Any, Any]:
        try:
            return stub.PutCheckpoint(iter(chunks), timeout=10, metadata=(
                (auth.TICKET_HEADER, ticket),) if ticket else None), None
        except grpc.RpcError as err:
            assert err.code() in refusals and err.details(), f"{err.code()}: {err.details()}"
            return None, err.code()

    with _agent(tmp_path, AGENT_TOKEN) as (ramdisk, stub, _):
        @FUZZ
        @given(chunks=st.one_of(well_formed, st.lists(messages(helper_pb2.CheckpointChunk), min_size=1, max_size=6)),
               kind=st.sampled_from(["scheduler's", "other name", "garbage", "none"]),
               garbage=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=80))
        def prop(chunks: list[Any], kind: str, garbage: str) -> None:
            first = chunks[0]
            before = sorted(ramdisk.root.rglob("*"))
            ticket = {"scheduler's": auth.transfer_ticket(auth.digest(AGENT_TOKEN), "gpu2", first.job_id,
                                                          first.checkpoint_name, time.time() + 600),
                      "other name": auth.transfer_ticket(auth.digest(AGENT_TOKEN), "gpu2", first.job_id,
                                                         first.checkpoint_name + "2", time.time() + 600),
                      "garbage": garbage, "none": ""}[kind]
            reply, code = put(stub, chunks, ticket)
            if kind != "scheduler's":
                assert reply is None and code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
            if reply is None:
                deadline = time.monotonic() + 10  # a refused copy goes as the handler unwinds
                while sorted(ramdisk.root.rglob("*")) != before and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert sorted(ramdisk.root.rglob("*")) == before, "a refused stream wrote something"
            else:
                assert Path(reply.path) == (ramdisk.root / first.job_id / first.checkpoint_name).resolve()
                assert put(stub, chunks, ticket) == (None, grpc.StatusCode.PERMISSION_DENIED), "a spent ticket"
            assert {p.name for p in tmp_path.iterdir()} == {"rd"}

        prop()
