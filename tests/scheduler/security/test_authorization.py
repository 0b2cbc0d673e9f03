"""Authentication and authorization over real gRPC: one test per rule of
docs/security.md. Tokens are made as `gandiva token create` makes them."""

from __future__ import annotations

import collections
import concurrent.futures
import time

import grpc
import pytest

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import auth

from .conftest import make_token, revoke


def _spec(user: str = "") -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=["python", "t.py"], gpus=1, user=user,
                              env={"SECRET": "hunter2"})


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


@pytest.fixture
def users(secured, connect):  # type: ignore[no-untyped-def]
    """Stubs for alice, bob (users) and root (operator), and alice's first job."""
    stubs = {
        name: scheduler_pb2_grpc.SchedulerStub(
            connect(secured.address, make_token(secured.db_url, name, role)))
        for name, role in (("alice", "user"), ("bob", "user"), ("root", "operator"))
    }
    job = stubs["alice"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec())).job
    return stubs, job


def test_a_call_without_a_token_is_unauthenticated(secured, connect) -> None:  # type: ignore[no-untyped-def]
    stub = scheduler_pb2_grpc.SchedulerStub(connect(secured.address))
    assert _code(lambda: stub.ListJobs(scheduler_pb2.ListJobsRequest())) == grpc.StatusCode.UNAUTHENTICATED


def test_a_call_without_a_valid_token_is_refused_before_its_request_is_received(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, connect) -> None:
    """gRPC receives a unary request whole before the handler runs, and the token was
    checked in the handler: a call without a valid token cost the scheduler its request
    first (64 such 14 MiB SubmitJobs at once took it from 95 to 690-850 MB). Now the
    refusal comes from the call's metadata alone: a client whose request never arrives
    is refused at once (it used to wait for its deadline), and large requests sent at
    once without a token are each UNAUTHENTICATED, not an internal error, and counted
    in /metrics as before."""
    import threading

    secured = make_scheduler(sqlite_url, tick_s=0.2, auth="token", http_listen="127.0.0.1:0")
    never = threading.Event()

    def body_never_sent():  # type: ignore[no-untyped-def]
        never.wait(30)
        yield from ()

    for token in ("", "gdv.alice.forged"):
        submit = connect(secured.address, token).stream_unary(
            "/gandiva.v1.Scheduler/SubmitJob", request_serializer=scheduler_pb2.SubmitJobRequest.SerializeToString,
            response_deserializer=scheduler_pb2.SubmitJobResponse.FromString)
        assert _code(lambda s=submit: s(body_never_sent(), timeout=20)) == grpc.StatusCode.UNAUTHENTICATED
    never.set()

    big = scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="big", gpus=1, command=["python", *["x" * 100] * 140_000]))  # 14 MiB
    stub = scheduler_pb2_grpc.SchedulerStub(connect(secured.address))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: _code(lambda: stub.SubmitJob(big, timeout=60)), range(8)))
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
    alice = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "alice")))
    assert alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs == [], "still serving; nothing submitted"
    status, metrics = _http_get(secured.server.http_address, "/metrics", make_token(secured.db_url, "root", "operator"))
    assert status == 200
    assert ('gandiva_rpc_seconds_count{code="UNAUTHENTICATED",method="/gandiva.v1.Scheduler/SubmitJob"} 10.0'
            in metrics.decode()), [x for x in metrics.decode().splitlines() if "rpc_seconds_count" in x]


def test_an_unknown_or_forged_token_is_unauthenticated(secured, connect) -> None:  # type: ignore[no-untyped-def]
    real = make_token(secured.db_url, "alice")
    for bad in ("nonsense", "gdv.alice.wrong", real[:-2] + "xx", "gdv.nobody." + real.split(".")[2]):
        stub = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, bad))
        assert _code(lambda s=stub: s.ListJobs(scheduler_pb2.ListJobsRequest())) == grpc.StatusCode.UNAUTHENTICATED


def test_a_revoked_token_is_refused_within_seconds(secured, connect, wait_for) -> None:  # type: ignore[no-untyped-def]
    """Its new calls are refused, and a stream it opened before is ended: a revoked user's
    WatchEvents went on receiving their jobs' events (one came 5 s after the revocation)."""
    stub = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "alice")))
    stub.ListJobs(scheduler_pb2.ListJobsRequest())
    watch = stub.WatchEvents(scheduler_pb2.WatchEventsRequest())
    stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()))
    assert next(watch).kind == "job.submitted"
    revoke(secured.db_url, "alice")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        after = pool.submit(lambda: [e.kind for e in watch])  # until the stream ends
        try:
            with pytest.raises(grpc.RpcError) as ended:
                after.result(timeout=2 * auth.CACHE_S + 20)
        finally:
            watch.cancel()
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
    assert "revoked" in ended.value.details()

    def refused() -> bool:
        try:
            stub.ListJobs(scheduler_pb2.ListJobsRequest())
            return False
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.UNAUTHENTICATED

    wait_for(refused, timeout=auth.CACHE_S + 10)


def test_health_needs_no_token(secured, connect) -> None:  # type: ignore[no-untyped-def]
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    reply = health_pb2_grpc.HealthStub(connect(secured.address)).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_user_comes_from_the_credential_not_the_request(users) -> None:  # type: ignore[no-untyped-def]
    stubs, job = users
    assert job.spec.user == "alice"
    forged = stubs["bob"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(user="alice"))).job
    assert forged.spec.user == "bob"


def test_a_user_cannot_see_anothers_job(users) -> None:  # type: ignore[no-untyped-def]
    stubs, job = users
    bob = stubs["bob"]
    assert _code(lambda: bob.GetJob(scheduler_pb2.GetJobRequest(id=job.id))) == grpc.StatusCode.PERMISSION_DENIED
    assert list(bob.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []
    assert _code(lambda: bob.ListJobs(scheduler_pb2.ListJobsRequest(user="alice"))) == grpc.StatusCode.PERMISSION_DENIED
    assert list(bob.ListEvents(scheduler_pb2.ListEventsRequest()).events) == []
    assert _code(lambda: bob.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id))) == grpc.StatusCode.PERMISSION_DENIED
    # Accounting (gandiva get usage, session 48): bob's own, none of alice's.
    since = time.time() - 3600
    assert bob.GetUsage(scheduler_pb2.GetUsageRequest(since=since, by_job=True)).total.jobs == 0
    assert _code(lambda: bob.GetUsage(scheduler_pb2.GetUsageRequest(since=since, user="alice"))) == \
        grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("method", ["KillJob", "SuspendJob", "ResumeJob", "SetPriority", "MigrateJob"])
def test_a_user_cannot_act_on_anothers_job(users, method: str) -> None:  # type: ignore[no-untyped-def]
    stubs, job = users
    request = {
        "SetPriority": scheduler_pb2.SetPriorityRequest(id=job.id, priority=3),
        "MigrateJob": scheduler_pb2.MigrateJobRequest(id=job.id, to_server="s1"),
    }.get(method, scheduler_pb2.JobActionRequest(id=job.id))
    assert _code(lambda: getattr(stubs["bob"], method)(request)) == grpc.StatusCode.PERMISSION_DENIED
    after = stubs["alice"].GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert after.state == common_pb2.JOB_STATE_QUEUED and after.spec.priority == job.spec.priority


def test_owner_sees_env_and_acts_on_own_job(users) -> None:  # type: ignore[no-untyped-def]
    stubs, job = users
    alice = stubs["alice"]
    assert alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).spec.env["SECRET"] == "hunter2"
    assert [j.id for j in alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs] == [job.id]
    assert alice.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=5)).spec.priority == 5
    assert alice.KillJob(scheduler_pb2.JobActionRequest(id=job.id)).state == common_pb2.JOB_STATE_KILLED


def test_an_operator_sees_and_acts_on_every_job(users) -> None:  # type: ignore[no-untyped-def]
    stubs, job = users
    stubs["bob"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()))
    root = stubs["root"]
    assert {j.spec.user for j in root.ListJobs(scheduler_pb2.ListJobsRequest()).jobs} == {"alice", "bob"}
    assert [j.spec.user for j in root.ListJobs(scheduler_pb2.ListJobsRequest(user="bob")).jobs] == ["bob"]
    usage = root.GetUsage(scheduler_pb2.GetUsageRequest(since=time.time() - 3600))
    assert sorted((u.user, u.jobs) for u in usage.users) == [("alice", 1), ("bob", 1)]
    assert root.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).spec.env["SECRET"] == "hunter2"
    assert root.KillJob(scheduler_pb2.JobActionRequest(id=job.id)).state == common_pb2.JOB_STATE_KILLED


def test_a_user_may_give_their_own_jobs_a_priority_up_to_a_cap(users) -> None:  # type: ignore[no-untyped-def]
    """Any user could set 1,000,000 on their jobs: first in the queue, and a time slice of
    60 s x 1,000,000 on a GPU shared with another user's job. Operators may still."""
    stubs, job = users
    alice, root = stubs["alice"], stubs["root"]
    cap = auth.USER_MAX_PRIORITY
    assert alice.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=cap)).spec.priority == cap
    with pytest.raises(grpc.RpcError) as err:
        alice.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=1_000_000))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details().startswith(f"priority: 1000000 is above {cap}, the most a user may give"), err.value
    high = common_pb2.JobSpec(command=["t"], gpus=1, priority=cap + 1)
    for submit in (lambda: alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=high)),
                   lambda: alice.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="m", jobs=[high]))):
        assert _code(submit) == grpc.StatusCode.PERMISSION_DENIED
    assert [j.id for j in alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs] == [job.id], "nothing submitted"
    assert alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).spec.priority == cap
    assert root.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=1_000_000)).spec.priority == 1_000_000


def test_users_cannot_call_the_helper_or_runtime_services(secured, connect) -> None:  # type: ignore[no-untyped-def]
    ch = connect(secured.address, make_token(secured.db_url, "root", "operator"))
    helper = helper_pb2_grpc.HelperStub(ch)
    assert _code(lambda: helper.Heartbeat(helper_pb2.HeartbeatRequest(name="s1"))) == grpc.StatusCode.PERMISSION_DENIED


def _register(stub, name: str) -> None:  # type: ignore[no-untyped-def]
    stub.Register(helper_pb2.RegisterServerRequest(
        name=name, address="127.0.0.1:1", gpus=[common_pb2.Gpu(index=0, memory_total_bytes=1 << 30)]))


def test_a_helper_acts_only_as_its_own_server(secured, connect) -> None:  # type: ignore[no-untyped-def]
    helper = helper_pb2_grpc.HelperStub(connect(secured.address, make_token(secured.db_url, "s1", "helper")))
    _register(helper, "s1")
    assert helper.Heartbeat(helper_pb2.HeartbeatRequest(name="s1")).known
    assert _code(lambda: _register(helper, "s2")) == grpc.StatusCode.PERMISSION_DENIED
    for call in (
        lambda: helper.Heartbeat(helper_pb2.HeartbeatRequest(name="s2")),
        lambda: helper.ReportProcessExit(helper_pb2.ProcessExitRequest(server="s2", job_id="j-1")),
        lambda: helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="s2", command_id="c")),
        lambda: helper.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="s2")),
        lambda: next(iter(helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="s2")))),
    ):
        assert _code(call) == grpc.StatusCode.PERMISSION_DENIED
    # A helper is not a user either.
    sched = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "s3", "helper")))
    assert _code(lambda: sched.ListJobs(scheduler_pb2.ListJobsRequest())) == grpc.StatusCode.PERMISSION_DENIED


def _hello(stub, job_id: str, incarnation: str) -> grpc.StatusCode | None:  # type: ignore[no-untyped-def]
    msgs = iter([runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job_id, incarnation=incarnation))])
    call = stub.Connect(msgs, timeout=3)
    try:
        for _ in call:
            pass
    except grpc.RpcError as err:
        return err.code()
    return None


def test_a_helper_cannot_take_another_servers_agent_address(secured, connect) -> None:  # type: ignore[no-untyped-def]
    """The scheduler finds a checkpoint's destination, and makes its ticket, by the agent
    address: a helper registering another server's address (its own token, a copied config)
    made checkpoints meant for that server carry a ticket for the wrong one, refused
    there. Now the second registration is refused, naming the server that has it."""
    first = helper_pb2_grpc.HelperStub(connect(secured.address, make_token(secured.db_url, "s1", "helper")))
    other = helper_pb2_grpc.HelperStub(connect(secured.address, make_token(secured.db_url, "s2", "helper")))
    gpus = [common_pb2.Gpu(index=0, memory_total_bytes=1 << 30)]
    first.Register(helper_pb2.RegisterServerRequest(name="s1", address="127.0.0.1:7301", gpus=gpus))
    with pytest.raises(grpc.RpcError) as err:
        other.Register(helper_pb2.RegisterServerRequest(name="s2", address="127.0.0.1:7301", gpus=gpus))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "agent address 127.0.0.1:7301 is that of server s1, which is up" in err.value.details()
    other.Register(helper_pb2.RegisterServerRequest(name="s2", address="127.0.0.1:7302", gpus=gpus))
    root = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "root", "operator")))
    servers = {s.name: s.address for s in root.ListServers(scheduler_pb2.ListServersRequest()).servers}
    assert servers == {"s1": "127.0.0.1:7301", "s2": "127.0.0.1:7302"}


def test_a_runtime_speaks_only_for_its_own_job_and_launch(users, secured, connect) -> None:  # type: ignore[no-untyped-def]
    _, job = users
    helper_token = make_token(secured.db_url, "s1", "helper")
    token = auth.runtime_token(helper_token, job.id, "inc1")
    stub = runtime_pb2_grpc.RuntimeStub(connect(secured.address, token))
    # Its own job and launch: accepted (the stream stays open until the deadline).
    assert _hello(stub, job.id, "inc1") in (None, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert _hello(stub, job.id, "inc2") == grpc.StatusCode.PERMISSION_DENIED
    assert _hello(stub, "j-other", "inc1") == grpc.StatusCode.PERMISSION_DENIED
    # Minted with a key that is not a registered helper's: refused.
    forged = runtime_pb2_grpc.RuntimeStub(connect(secured.address, auth.runtime_token("gdv.s1.guess", job.id, "inc1")))
    assert _hello(forged, job.id, "inc1") == grpc.StatusCode.UNAUTHENTICATED
    # A runtime credential is not a user's.
    sched = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, token))
    assert _code(lambda: sched.ListJobs(scheduler_pb2.ListJobsRequest())) == grpc.StatusCode.PERMISSION_DENIED


def test_a_replayed_runtime_token_of_a_stale_launch_changes_nothing(users, secured, connect) -> None:  # type: ignore[no-untyped-def]
    """A runtime token is good for its launch for ever (until its helper's token is revoked):
    the token of a launch the job no longer runs (here: the job waits in the queue, so every
    launch is stale), replayed or held by the old process, connected, was told to exit, and
    meanwhile its reports were taken: "not migratable" made the job never migrate, a tower
    report turned grow-shrink off for good, progress was counted. Now such a stream's reports
    are dropped; it still gets its exit command."""
    stubs, job = users
    token = auth.runtime_token(make_token(secured.db_url, "s1", "helper"), job.id, "inc-old")
    runtime = runtime_pb2_grpc.RuntimeStub(connect(secured.address, token))
    sent = [runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job.id, incarnation="inc-old")),
            runtime_pb2.RuntimeMessage(migratability=runtime_pb2.MigratabilityReport(migratable=False, reason="x")),
            runtime_pb2.RuntimeMessage(towers=runtime_pb2.TowerReport(towers=2, checkpoint_towers=1, devices=2)),
            runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(steps=500, rate=9.0))]
    # The stream ends once the scheduler has read everything sent (the client closes its side).
    told = [c for c in runtime.Connect(iter(sent), timeout=20)]
    assert [c.kind for c in told] == [runtime_pb2.COMMAND_KIND_KILL], told
    alice = stubs["alice"]
    kinds = [e.kind for e in alice.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id)).events]
    assert "job.migratable" not in kinds and "job.grow_shrink" not in kinds, kinds
    got = alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert got.state == common_pb2.JOB_STATE_QUEUED and got.steps == 0


def test_a_launch_told_to_exit_while_connected_changes_nothing_after(  # type: ignore[no-untyped-def]
        secured, connect, wait_for) -> None:
    """Whether a launch's reports were taken was decided once, at its hello: one told to exit
    while connected (its job killed, its server marked down, the job moved on) went on
    counting until it exited. Probed: a re-queued job's old copy set its total to 3 and its
    steps past its restart; here a killed job's total and migratability still changed."""
    import queue

    helper_token = make_token(secured.db_url, "n1", "helper")
    helper = helper_pb2_grpc.HelperStub(connect(secured.address, helper_token))
    helper.Register(helper_pb2.RegisterServerRequest(
        name="n1", gpus=[common_pb2.Gpu(index=0, memory_total_bytes=16 << 30)]))
    commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
    alice = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "alice")))
    job = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        command=["python", "t.py"], gpus=1, steps=1000))).job
    launch = next(commands).launch
    sent: queue.Queue = queue.Queue()
    sent.put(runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job.id, incarnation=launch.incarnation)))
    stream = runtime_pb2_grpc.RuntimeStub(connect(secured.address, auth.runtime_token(
        helper_token, job.id, launch.incarnation))).Connect(iter(sent.get, None), timeout=60)
    try:
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_RUNNING)
        alice.KillJob(scheduler_pb2.JobActionRequest(id=job.id))
        assert any(c.kind == runtime_pb2.COMMAND_KIND_KILL for c in stream), "told to exit"
        sent.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(steps=500, rate=9.0, total_steps=700)))
        sent.put(runtime_pb2.RuntimeMessage(migratability=runtime_pb2.MigratabilityReport(migratable=False, reason="x")))
        sent.put(None)
        list(stream)  # it ends once the scheduler has read (and written) all that was sent
    finally:
        stream.cancel()
        commands.cancel()
    got = alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert (got.state, got.total_steps, got.migratable) == (common_pb2.JOB_STATE_KILLED, 1000, True), got
    said = [e.message for e in alice.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id)).events]
    assert not [m for m in said if "700" in m or "not migratable" in m], said


def _http_get(address: str, path: str, token: str = "") -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{address}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_dashboards_data_is_an_operators_with_tokens(make_scheduler, sqlite_url: str,  # type: ignore[no-untyped-def]
                                                         connect, capsys: pytest.CaptureFixture[str]) -> None:
    """With --auth token, /api/state, the timeline, the decisions and /metrics (every user's job
    names, users, GPU time, messages) were served to anyone who reached --http-listen, while
    each user's token shows only their own jobs; now they need an operator's token."""
    import shutil
    import subprocess
    import tempfile

    from gandiva_cli import main as gandiva_main

    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token", http_listen="127.0.0.1:0")
    address = sched.server.http_address
    alice, root = make_token(sched.db_url, "alice"), make_token(sched.db_url, "root", "operator")
    job = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, alice)).SubmitJob(scheduler_pb2.SubmitJobRequest(
        spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1, name="alice-secret-project"))).job
    for path in ("/api/state", "/api/timeline", "/api/decisions", "/api/usage", "/metrics", f"/api/job?id={job.id}"):
        for token, status in (("", 401), ("gdv.alice.forged", 401), (alice, 403)):
            got, body = _http_get(address, path, token)
            assert (got, b"alice-secret-project" in body) == (status, False), (path, token[:9], body)
        assert _http_get(address, path, root)[0] == 200, path
    refused = _http_get(address, "/api/state", alice)[1].decode()
    assert "only an operator's token may read it (this one is user alice's" in refused
    assert b"alice-secret-project" in _http_get(address, "/api/state", root)[1]
    assert _http_get(address, "/", "")[0] == 200  # the page itself holds no data; it asks for a token

    # gandiva top passes --token (or GANDIVA_TOKEN), and says why it is refused.
    assert gandiva_main.main(["top", "--once", "--http", address, "--token", root]) == 0
    assert "alice-secret-project" in capsys.readouterr().out
    assert gandiva_main.main(["top", "--once", "--http", address, "--token", alice]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gandiva top: http://{address}/api/state: /api/state shows every user's jobs") and err.count("\n") == 1

    # The page in a real browser: given the token as #token=..., it shows the cluster.
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return

    def page(fragment: str) -> str:
        profile = tempfile.mkdtemp(prefix="gandiva-chromium-")
        try:
            return subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
                 "--virtual-time-budget=4000", "--dump-dom", f"http://{address}/{fragment}"],
                capture_output=True, text=True, timeout=90, check=True).stdout
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    dom = page(f"#token={root}")
    assert "alice-secret-project" in dom and '<div id="error" class="bad"></div>' in dom, dom
    # A mistyped link (a lone %) stopped the page's script at decodeURIComponent: it stayed at
    # "connecting..." with no word of why; now it asks for the token and says what was refused.
    dom = page(f"#token={root[:-1]}%")
    assert "the token is unknown or revoked" in dom and '<form id="login">' in dom, dom


def test_a_user_sees_gpus_taken_but_not_other_users_job_ids_in_list_servers(  # type: ignore[no-untyped-def]
        secured, connect, wait_for, capsys: pytest.CaptureFixture[str]) -> None:
    """`gandiva get servers -o json` listed every job id on each GPU, other users' included,
    while ListJobs hides them; now a user sees their own ids and `hidden-N` for the others."""
    import json

    from gandiva_cli import main as gandiva_main

    from ..cli.conftest import ScriptedHelper

    tokens = {n: make_token(secured.db_url, n, r) for n, r in (("alice", "user"), ("bob", "user"),
                                                                ("root", "operator"))}
    helper = ScriptedHelper(secured.address, wait_for, name="n1", gpus=4,
                            token=make_token(secured.db_url, "n1", "helper"))
    try:
        stubs = {n: scheduler_pb2_grpc.SchedulerStub(connect(secured.address, t)) for n, t in tokens.items()}
        ids = {n: stubs[n].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec())).job.id for n in ("alice", "bob")}
        two = {stubs["alice"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["python", "t.py"], gpus=2))).job.id}

        def placed(name: str) -> list[list[str]]:
            servers = stubs[name].ListServers(scheduler_pb2.ListServersRequest()).servers
            return [list(g.jobs) for s in servers for g in s.gpu_list]

        wait_for(lambda: sum(map(len, placed("root"))) == 4, 30)  # two 1-GPU jobs, one 2-GPU job
        assert {j for gpu in placed("root") for j in gpu} == set(ids.values()) | two
        bob = placed("bob")
        assert {j for gpu in bob for j in gpu} == {ids["bob"], "hidden-1", "hidden-2"}, bob
        assert sum(map(len, bob)) == 4  # the occupancy is all there; alice's 2-GPU job counts once
        assert gandiva_main.main(["get", "servers", "-o", "json", "--scheduler", secured.address,
                                  "--token", tokens["bob"]]) == 0
        out = capsys.readouterr().out
        assert ids["bob"] in out and ids["alice"] not in out and not two & set(out.split('"'))
        assert json.loads(out)[0]["gpu_list"][0]["jobs"]
        # Who held the GPUs when (ListPlacements, session 49): the same, over time; alice's
        # job asked by name is refused to bob as GetJob refuses it.
        now = time.time()
        held = stubs["bob"].ListPlacements(scheduler_pb2.ListPlacementsRequest(since=now, until=now)).placements
        assert [(p.job_id, p.user) for p in held if not p.job_id.startswith("hidden-")] == [(ids["bob"], "bob")], held
        hidden = collections.Counter((p.job_id, p.name, p.user) for p in held if p.job_id.startswith("hidden-"))
        assert sorted(hidden.values()) == [1, 2] and {k[1:] for k in hidden} == {("", "")}, held  # 1 and 2 GPUs
        assert all(p.state_at == "running" for p in held), held
        assert _code(lambda: stubs["bob"].ListPlacements(scheduler_pb2.ListPlacementsRequest(
            since=now - 60, job_id=ids["alice"]))) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        helper.close()


def test_one_caller_cannot_hold_open_event_watches_without_bound(users, wait_for) -> None:  # type: ignore[no-untyped-def]
    """One client opened 3,000 WatchEvents streams in 6 s (100 MB held, more than half a
    core busy with nothing happening); now a caller holds at most MAX_WATCHES, the next is
    RESOURCE_EXHAUSTED saying so, other users are not affected, and a closed one frees its place."""
    from scheduler.api.scheduler_api import MAX_WATCHES

    stubs, _job = users
    stubs["bob"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()))

    def watch(name: str):  # type: ignore[no-untyped-def]
        call = stubs[name].WatchEvents(scheduler_pb2.WatchEventsRequest(after_id=0), timeout=60)
        assert next(call).kind == "job.submitted"  # open, and counted
        return call

    held = [watch("alice") for _ in range(MAX_WATCHES)]
    try:
        with pytest.raises(grpc.RpcError) as err:
            watch("alice")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{MAX_WATCHES} event watches are open already for user alice" in err.value.details()
        watch("bob").cancel()
        held.pop().cancel()

        def reopened() -> bool:
            try:
                held.append(watch("alice"))
                return True
            except grpc.RpcError:
                return False

        wait_for(reopened, 10)
    finally:
        for call in held:
            call.cancel()


def test_texts_about_a_users_job_do_not_name_other_users_jobs(users, secured) -> None:  # type: ignore[no-untyped-def]
    """A packing verdict on Alice's job named Bob's job by id (`packing trial with j-...`), and so
    did reasons such as `make room for job j-...` and `packed beside j-...`; ListJobs hides Bob's
    jobs from Alice. Now Alice reads "another user's job" there (her own ids stay); an operator
    reads the ids."""
    import sqlite3
    import time

    stubs, job = users
    bob = stubs["bob"].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec())).job.id
    # The scheduler writes a queued job's reason ("needs 1 GPUs, ...") once, when it changes:
    # written after the message set below, it replaced it (a flake). Wait for it first.
    deadline = time.monotonic() + 30
    while not stubs["root"].GetJob(scheduler_pb2.GetJobRequest(id=job.id)).message.startswith("needs "):
        assert time.monotonic() < deadline, "the scheduler never wrote the queued job's reason"
        time.sleep(0.1)
    verdict = f"packing trial with {bob}: {job.id} 1.0 packed vs 2.0 alone, {bob} 0.5 vs 1.0 mini-batches/s"
    with sqlite3.connect(secured.db_url.split("///", 1)[1]) as db:
        db.execute("INSERT INTO events (at, kind, job_id, server, message) VALUES (?, 'job.pack', ?, 'n1', ?)",
                   (time.time(), job.id, verdict))
        db.execute("INSERT INTO transitions (job_id, from_state, to_state, at, reason) VALUES (?, 'QUEUED', "
                   "'RUNNING', ?, ?)", (job.id, time.time(), f"trial: packed beside {bob}, utilization 0.3"))
        db.execute("UPDATE jobs SET message = ? WHERE id = ?", (f"make room for job {bob}: empty n1", job.id))
    alice, root = stubs["alice"], stubs["root"]
    hidden = "packing trial with another user's job: " + f"{job.id} 1.0 packed vs 2.0 alone, another user's job 0.5"
    events = alice.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id)).events
    assert [e.message for e in events if e.kind == "job.pack"] == [hidden + " vs 1.0 mini-batches/s"]
    watched = alice.WatchEvents(scheduler_pb2.WatchEventsRequest(after_id=0), timeout=10)
    assert next(e for e in watched if e.kind == "job.pack").message.startswith(hidden)
    watched.cancel()
    for got in (alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id)),
                alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs[0],
                alice.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=2))):
        assert got.message == "make room for another user's job: empty n1", got.message
        assert [t.reason for t in got.history][-1:] in ([], ["trial: packed beside another user's job, utilization 0.3"])
        assert bob not in str(got)
    got = alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert got.history[-1].reason == "trial: packed beside another user's job, utilization 0.3"
    seen = root.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert seen.message == f"make room for job {bob}: empty n1"
    # A queued job's place names the jobs ahead of it (s46): Bob reads that Alice's is, not its id.
    deadline = time.monotonic() + 30
    while job.id not in (ahead := root.GetJob(scheduler_pb2.GetJobRequest(id=bob)).wait):
        assert time.monotonic() < deadline, f"no place naming Alice's job ahead of Bob's: {ahead!r}"
        time.sleep(0.1)
    bobs = stubs["bob"].GetJob(scheduler_pb2.GetJobRequest(id=bob)).wait
    assert "ahead of it: another user's job" in bobs and job.id not in bobs, bobs
    assert [e.message for e in root.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job.id)).events
            if e.kind == "job.pack"] == [verdict]


def test_which_placed_jobs_are_a_users_is_read_for_any_number(db_url: str) -> None:
    """ListServers asks which placed jobs are the caller's; with more than 32,767 of them in one
    statement PostgreSQL (asyncpg) refused the query, and `get servers` failed for every user."""
    import asyncio

    from scheduler.state import migrate, repo
    from scheduler.state.db import make_engine, make_sessionmaker

    async def go() -> set[str]:
        engine = make_engine(db_url)
        try:
            await migrate.upgrade(engine)
            async with make_sessionmaker(engine)() as s:
                return await repo.own_jobs(s, "alice", (f"j-{i:010x}" for i in range(40_000)))
        finally:
            await engine.dispose()

    assert asyncio.run(go()) == set()
