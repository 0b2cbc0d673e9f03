"""The gRPC API over a real socket: submission, validation errors with their
status codes, health, reflection, and a helper-driven job life cycle."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


@pytest.fixture
def channel(scheduler_server):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(scheduler_server.address) as ch:
        yield ch


def spec(gpus: int = 1, **kw: object) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=["python", "train.py"], gpus=gpus, **kw)  # type: ignore[arg-type]


def test_submit_get_list(channel: grpc.Channel) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(2, name="resnet"))).job
    assert job.state == common_pb2.JOB_STATE_QUEUED and job.spec.name == "resnet"
    got = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert got.id == job.id and got.spec.gpus == 2
    assert [t.to_state for t in got.history] == [common_pb2.JOB_STATE_QUEUED]
    listed = stub.ListJobs(scheduler_pb2.ListJobsRequest(states=[common_pb2.JOB_STATE_QUEUED]))
    assert [j.id for j in listed.jobs] == [job.id]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (spec(0), "spec.gpus"),
        (spec(6), "spec.gpus"),
        (common_pb2.JobSpec(gpus=1), "spec.command"),
        (spec(1, priority=-2), "spec.priority"),
        (spec(1, workdir="relative/dir"), "spec.workdir"),
    ],
)
def test_invalid_submission_is_rejected_and_nothing_written(
    channel: grpc.Channel, bad: common_pb2.JobSpec, field: str
) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []
    assert list(stub.ListEvents(scheduler_pb2.ListEventsRequest()).events) == []


def test_unknown_job_is_not_found(channel: grpc.Channel) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    for call in (
        lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id="j-missing")),
        lambda: stub.KillJob(scheduler_pb2.JobActionRequest(id="j-missing")),
        lambda: stub.SetPriority(scheduler_pb2.SetPriorityRequest(id="j-missing", priority=1)),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_dry_run_writes_nothing(channel: grpc.Channel) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(4), dry_run=True))
    assert resp.job.spec.gpus == 4
    assert list(stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs) == []


def test_health_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="gandiva.v1.Scheduler")).status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    (resp,) = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for s in resp.list_services_response.service}
    assert {"gandiva.v1.Scheduler", "gandiva.v1.Runtime", "gandiva.v1.Helper", "grpc.health.v1.Health"} <= names




def test_helper_receives_launch_and_exit_completes_job(channel: grpc.Channel, wait_for) -> None:  # type: ignore[no-untyped-def]
    """A helper (here a plain gRPC client) registers; the policy places a job on it;
    the helper gets the launch command; the reported exit ends the job."""
    helper = helper_pb2_grpc.HelperStub(channel)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=i, model="virtual") for i in range(4)]
    helper.Register(helper_pb2.RegisterServerRequest(name="node-a", gpus=gpus, ramdisk="/dev/shm/x"))
    commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="node-a"))
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(2, name="mlp"))).job
    cmd = next(commands)
    assert cmd.WhichOneof("body") == "launch"
    assert cmd.launch.job_id == job.id and len(cmd.launch.gpu_indices) == 2
    helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="node-a", command_id=cmd.command_id, ok=True))
    running = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).state == common_pb2.JOB_STATE_RUNNING and j)
    assert {g.server for g in running.placement} == {"node-a"}
    servers = stub.ListServers(scheduler_pb2.ListServersRequest())
    (srv,) = servers.servers
    assert (srv.name, srv.gpus, srv.height, srv.affinity, srv.up) == ("node-a", 4, 1, 2, True)
    helper.ReportProcessExit(
        helper_pb2.ProcessExitRequest(server="node-a", job_id=job.id, incarnation=cmd.launch.incarnation, exit_code=0)
    )
    done = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED and list(done.placement) == []
    commands.cancel()


@pytest.mark.parametrize(("said", "recorded"), [(2**62, 2**53), (-5, 0)])
def test_an_exits_step_count_is_held_to_what_a_jobs_steps_may_be(  # type: ignore[no-untyped-def]
    channel: grpc.Channel, wait_for, said: int, recorded: int
) -> None:
    """The steps an exit carries (its runtime's count at the program's end) become the job's
    when larger than those heard, held as a progress report's are: a hostile or broken
    helper's 2^62 is 2^53 (what JSON carries exactly), a negative count none."""
    helper = helper_pb2_grpc.HelperStub(channel)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    helper.Register(helper_pb2.RegisterServerRequest(name="node-a", gpus=[common_pb2.Gpu(index=0, model="v")],
                                                     ramdisk="/dev/shm/x"))
    commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="node-a"))
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec(1))).job
    cmd = next(commands)
    helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="node-a", command_id=cmd.command_id, ok=True))
    wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_RUNNING)
    helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
        server="node-a", job_id=job.id, incarnation=cmd.launch.incarnation, exit_code=0, steps=said))
    done = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
    assert (done.state, done.steps) == (common_pb2.JOB_STATE_SUCCEEDED, recorded)
    commands.cancel()


def test_watch_events_streams_new_events(channel: grpc.Channel) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec())).job
    stream = stub.WatchEvents(scheduler_pb2.WatchEventsRequest(after_id=0))
    ev = next(stream)
    assert ev.kind == "job.submitted" and ev.job_id == first.id
    second = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec())).job
    kinds = []
    for ev in stream:
        kinds.append((ev.kind, ev.job_id))
        if ev.job_id == second.id:
            break
    assert ("job.submitted", second.id) in kinds
    stream.cancel()
