"""Hostile and bad requests to a real scheduler: a clear status naming the field, the
scheduler keeps serving, and the database stays consistent."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def test_the_loopback_warning_names_the_port_that_was_bound(make_scheduler: Any, sqlite_url: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """It named `127.0.0.1:0` (the port asked for), not the one picked."""
    with caplog.at_level(logging.WARNING, logger="scheduler.server"):
        sched = make_scheduler(sqlite_url, also_listen=("127.0.0.1:0",))
    warnings = [r.getMessage() for r in caplog.records if "listens on loopback" in r.getMessage()]
    assert len(warnings) == 2 and f"listens on loopback {sched.address} without" in warnings[0], warnings
    assert all(":0 " not in w for w in warnings), warnings


@pytest.mark.parametrize("key", ["a\nb", "a\x00", "\x1b[31mred"])
def test_a_bad_map_key_is_named_on_one_line(scheduler_server: Any, key: str) -> None:
    """The field named the key as it came: `spec.params[a<newline>b]` was a two-line error."""

    with grpc.insecure_channel(scheduler_server.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for field in ("params", "env_value"):
            spec = common_pb2.JobSpec(name="m", command=["python", "t.py"], gpus=1)
            if field == "params":
                spec.params[key] = "v"
            else:  # a value may hold newlines (a PEM key); its key is shown when the value is too long
                spec.env["A"] = "v" * (1 << 17)
            with pytest.raises(grpc.RpcError) as err:
                stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details() or ""
            assert details.isprintable() and details.startswith("spec.params[" if field == "params" else "spec.env[A]")
        assert list(stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs) == []


def test_events_of_a_job_no_one_has_are_not_found(scheduler_server: Any) -> None:
    """`gandiva get events --job <typo>` printed an empty table (exit 0), and a watch of it
    waited forever; a user's token already got NOT_FOUND, an operator's did not."""

    with grpc.insecure_channel(scheduler_server.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id="j-nope"), timeout=10)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "job 'j-nope' not found")
        with pytest.raises(grpc.RpcError) as err:
            next(stub.WatchEvents(scheduler_pb2.WatchEventsRequest(job_id="j-nope"), timeout=10))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert stub.ListEvents(scheduler_pb2.ListEventsRequest(), timeout=10) is not None


def test_a_job_an_operator_suspended_is_suspended_again_where_it_was_migrated(
        scheduler_server: Any, wait_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gandiva suspend J; gandiva migrate J --to S` left J RUNNING on S, still marked held,
    so the policy never time-sliced it: the operator's suspend was lost without a word."""
    from migration_protocol.fast_path import MigrationResult, Outcome
    from protos.gandiva.v1 import helper_pb2, helper_pb2_grpc, runtime_pb2
    from scheduler.engine import live_migration

    from .test_runtime_api import FakeShim

    plans: list = []

    async def migrated(plan, ports, timeouts=None):  # type: ignore[no-untyped-def]
        plans.append(plan)
        return MigrationResult(Outcome.MIGRATED, plan.dest.name, plan.dest_incarnation, step=42,
                               checkpoint_path="/ram/ckpt")

    monkeypatch.setattr(live_migration, "migrate", migrated)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        api, helper = scheduler_pb2_grpc.SchedulerStub(ch), helper_pb2_grpc.HelperStub(ch)
        helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=[common_pb2.Gpu(index=0)]))
        at_a = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="a"), timeout=60)
        job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["python", "t.py"], gpus=1))).job.id
        shims = [FakeShim(ch, job_id, next(at_a).launch.incarnation)]
        helper.Register(helper_pb2.RegisterServerRequest(name="b", gpus=[common_pb2.Gpu(index=0)]))
        try:
            assert api.SuspendJob(scheduler_pb2.JobActionRequest(id=job_id)).state == common_pb2.JOB_STATE_SUSPENDED
            api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server="b"))
            wait_for(lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state == common_pb2.JOB_STATE_RUNNING)
            shims.append(FakeShim(ch, job_id, plans[0].dest_incarnation))  # the destination's runtime connects
            job = wait_for(lambda: (j := api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))).state
                           == common_pb2.JOB_STATE_SUSPENDED and j)
            assert [p.server for p in job.placement] == ["b"]
            assert job.history[-1].reason.startswith("still suspended by operator (it was migrated meanwhile)")
            assert shims[1].received[-1].kind == runtime_pb2.COMMAND_KIND_SUSPEND
        finally:
            for shim in shims:
                shim.close()
            at_a.cancel()
