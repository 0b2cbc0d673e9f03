"""`gandiva migrate` of a job whose runtime is reconnecting: the scheduler waits up to
OPERATOR_CONNECT_WAIT_S (10 s) for it before the move begins (fbdd1941). The CLI gave the
call its ordinary 15 s, so a runtime back late in that wait left a loaded scheduler a third
of the margin every other call has to answer; the CLI now adds the wait to the deadline."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, helper_pb2, helper_pb2_grpc, scheduler_pb2
from scheduler.cli import client
from scheduler.engine import live_migration
from tests.scheduler.api.test_runtime_api import FakeShim, _launched

# Stands in for the margin a loaded scheduler takes to answer once its wait is over; the
# runtime comes back RECONNECT_AFTER_S into the wait, well within it.
ANSWER_S = 1.0
RECONNECT_AFTER_S = 3.0


def test_migrate_waits_for_the_schedulers_wait_for_a_reconnecting_runtime(
        gandiva: Any, scheduler_server: Any, wait_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's wait covers the scheduler's (the two are separate programs' constants).
    assert client.CONNECT_WAIT_S["MigrateJob"] >= live_migration.OPERATOR_CONNECT_WAIT_S
    monkeypatch.setattr(client, "CALL_TIMEOUT_S", ANSWER_S)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, _, commands, job, launch = _launched(ch)
        helper = helper_pb2_grpc.HelperStub(ch)
        helper.Register(helper_pb2.RegisterServerRequest(name="n2", gpus=[common_pb2.Gpu(index=0)]))
        at_n2 = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n2"))
        shims: list[FakeShim] = []
        back = threading.Timer(RECONNECT_AFTER_S, lambda: shims.append(FakeShim(ch, job.id, launch.incarnation)))
        back.start()
        try:
            r = gandiva("migrate", "--scheduler", scheduler_server.address, job.id, "--to", "n2")
            assert r.code == 0, r  # before: exit 2, the scheduler "did not answer" within the call's deadline
            assert "migrating to n2" in r.out, r
            moving = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
            assert any("n1 -> n2" in t.reason for t in moving.history), [t.reason for t in moving.history]
        finally:
            back.cancel()
            back.join()
            for shim in shims:
                shim.close()
            at_n2.cancel()
            commands.cancel()
