"""Cordon and uncordon over the real API and CLI: a cordoned server gets no job while it
is cordoned and one again once uncordoned; the mark survives its helper registering again
and the scheduler restarting; operators only; an unknown server is named as such."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import transport
from scheduler.core import Settings

from ...in_process import run_gandiva
from ..security.conftest import make_token

GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]
QUEUED = common_pb2.JOB_STATE_QUEUED


def _register(channel: grpc.Channel, name: str) -> helper_pb2_grpc.HelperStub:
    helper = helper_pb2_grpc.HelperStub(channel)
    gpus = [common_pb2.Gpu(index=i, model="virtual") for i in range(2)]
    helper.Register(helper_pb2.RegisterServerRequest(name=name, gpus=gpus, ramdisk="/dev/shm/x"), timeout=10)
    return helper


def _server(stub: scheduler_pb2_grpc.SchedulerStub, name: str) -> common_pb2.Server:
    return next(s for s in stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=10).servers if s.name == name)


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GANDIVA, *args, "--scheduler", address], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`gandiva ARGS... --scheduler ADDRESS` through its entry function in this process,
    output captured: the CLI's own code, without a Python start per command."""

    return lambda address, *args: run_gandiva(capsys, *args, "--scheduler", address)


def test_a_cordoned_server_gets_no_job_until_uncordoned(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, cli: Any) -> None:
    # The test's helper sends no heartbeats: a server silent for down_after_s is marked
    # down and its command stream ended, and the launch below never came (seen on a loaded
    # machine, where the test's commands took over the default 10 s). Long enough here.
    scheduler_server = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(down_after_s=600.0))
    with grpc.insecure_channel(scheduler_server.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        helper = _register(channel, "node-a")
        commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="node-a"))
        done = cli(scheduler_server.address, "cordon", "node-a", "--reason", "swap a fan")
        assert done.returncode == 0 and "server node-a cordoned" in done.stdout, done.stderr
        srv = _server(stub, "node-a")
        assert (srv.cordoned, srv.draining, srv.cordon_reason, srv.cordoned_at > 0) == (True, False, "swap a fan", True)
        spec = common_pb2.JobSpec(name="j", command=["python", "train.py"], gpus=1)
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
        # The policy looked at it (it writes why it waits, in place of the submission's "waiting
        # for a placement") and left it queued: no GPU of the cluster's only server is free to
        # it. (Waiting for any message passed at once, on the submission's: the test relied on
        # its slow CLI commands to give the policy a round, and passed with the cordon ignored
        # when they were quick.) Its helper registering again (a restart) keeps the cordon.
        job = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id))).message
                       not in ("", "waiting for a placement") and j, 30)
        assert job.state == QUEUED and not job.placement, job
        _register(channel, "node-a")
        assert _server(stub, "node-a").cordoned
        table = cli(scheduler_server.address, "get", "servers")
        assert table.stdout.splitlines()[0].split()[-1] == "STATUS" and table.stdout.splitlines()[1].split()[-1] == "cordoned"
        described = cli(scheduler_server.address, "describe", "server", "node-a").stdout
        assert "Status:       cordoned" in described and "Reason:       swap a fan" in described, described
        assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state == QUEUED
        # Uncordoned, it takes the job.
        assert cli(scheduler_server.address, "uncordon", "node-a").returncode == 0
        cmd = next(commands)
        assert cmd.WhichOneof("body") == "launch" and cmd.launch.job_id == job_id
        commands.cancel()
        assert not _server(stub, "node-a").cordoned
        kinds = [(e.kind, e.server) for e in stub.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["server"])).events
                 if e.kind in ("server.cordon", "server.uncordon")]
        assert kinds == [("server.cordon", "node-a"), ("server.uncordon", "node-a")]


def test_cordon_survives_a_scheduler_restart(make_scheduler: Any, sqlite_url: str) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.2)
    with grpc.insecure_channel(sched.address) as channel:
        _register(channel, "node-b")
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stub.CordonServer(scheduler_pb2.CordonServerRequest(server="node-b", reason="disk"), timeout=10)
    sched.stop()
    again = make_scheduler(sqlite_url, tick_s=0.2)
    with grpc.insecure_channel(again.address) as channel:
        srv = _server(scheduler_pb2_grpc.SchedulerStub(channel), "node-b")
        assert (srv.cordoned, srv.cordon_reason) == (True, "disk")


def test_unknown_server_is_named_and_bad_names_refused(scheduler_server: Any) -> None:
    with grpc.insecure_channel(scheduler_server.address) as channel:
        _register(channel, "node-c")
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for method in (stub.CordonServer, stub.UncordonServer, stub.DrainServer):
            with pytest.raises(grpc.RpcError) as err:
                method(scheduler_pb2.CordonServerRequest(server="node-x"), timeout=10)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "'node-x' not found" in err.value.details() and "node-c" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.CordonServer(scheduler_pb2.CordonServerRequest(server=""), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "server" in err.value.details()
    done = _cli(scheduler_server.address, "drain", "node-x")
    assert done.returncode == 2 and "node-x" in done.stderr and "node-c" in done.stderr, done.stderr


def test_only_operators_cordon_uncordon_or_drain(make_scheduler: Any, sqlite_url: str) -> None:
    user, operator, helper = (make_token(sqlite_url, "ann"), make_token(sqlite_url, "root", "operator"),
                              make_token(sqlite_url, "node-d", "helper"))
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token")

    def connect(address: str, token: str) -> grpc.Channel:
        return transport.channel(address, transport.ClientSecurity(token, "", "", ""))

    _register(connect(sched.address, helper), "node-d")
    as_user = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, user))
    for method in (as_user.CordonServer, as_user.UncordonServer, as_user.DrainServer):
        with pytest.raises(grpc.RpcError) as err:
            method(scheduler_pb2.CordonServerRequest(server="node-d"), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "operators only" in err.value.details()
    assert not _server(as_user, "node-d").cordoned
    # `gandiva get problems` names every user's jobs and the servers' state: an operator's view too.
    with pytest.raises(grpc.RpcError) as err:
        as_user.ListProblems(scheduler_pb2.ListProblemsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "operators only" in err.value.details()
    as_operator = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, operator))
    assert list(as_operator.ListProblems(scheduler_pb2.ListProblemsRequest(), timeout=10).problems) == []
    assert as_operator.CordonServer(scheduler_pb2.CordonServerRequest(server="node-d"), timeout=10).cordoned


def test_cordon_shows_in_the_dashboard_state_metrics_and_top(make_scheduler: Any, sqlite_url: str) -> None:
    """What `gandiva top` and the dashboard read (/api/state) and the Prometheus gauge say."""
    import json
    import urllib.request

    from rich.console import Console

    from scheduler.cli import top

    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0")
    with grpc.insecure_channel(sched.address) as channel:
        _register(channel, "node-e")
        _register(channel, "node-f")
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stub.CordonServer(scheduler_pb2.CordonServerRequest(server="node-e", reason="bios"), timeout=10)
        stub.DrainServer(scheduler_pb2.CordonServerRequest(server="node-f"), timeout=30)

    def get(path: str) -> bytes:
        with urllib.request.urlopen(f"http://{sched.server.http_address}{path}", timeout=10) as r:
            return bytes(r.read())

    state = json.loads(get("/api/state"))
    marks = {s["name"]: (s["cordoned"], s["draining"], s["cordon_reason"]) for s in state["servers"]}
    assert marks == {"node-e": (True, False, "bios"), "node-f": (True, True, "")}
    metrics = get("/metrics").decode()
    assert 'gandiva_server_cordoned{server="node-e"} 1.0' in metrics
    assert 'gandiva_server_cordoned{server="node-f"} 2.0' in metrics
    console = Console(width=160, record=True)
    console.print(top.render(state))
    shown = console.export_text()
    assert "node-e (cordoned)" in shown and "node-f (draining)" in shown, shown
    # `cordon` does not stop a drain, and says so.
    again = _cli(sched.address, "cordon", "node-f")
    assert again.returncode == 0 and "being drained still" in again.stdout, again
