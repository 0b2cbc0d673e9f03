"""A host rebooted, or its helper restarted (its jobs gone with it), whose new helper
registers under the same name the moment the old one has been silent the heartbeat
timeout, before a scheduling round has called the server down. Over the real Helper API
(a real scheduler, gRPC and SQLite; the test answers for the helpers)."""

from __future__ import annotations

import threading
import time
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
from scheduler.core import Settings

SETTINGS = Settings(heartbeat_interval_s=0.2, down_after_s=2.0, command_timeout_s=5.0)


def test_a_helper_replaced_before_its_server_was_called_down_requeues_its_jobs_at_once(
    make_scheduler: Any, sqlite_url: str, wait_for: Any
) -> None:
    """The job resumes at once ("its helper was replaced"), is launched once on the new
    helper, and the old helper's unanswered command is not sent to the new one. Before,
    the server stayed up with the job RUNNING there, processless, until the new helper's
    heartbeats had lacked it for a heartbeat timeout (10 s by default): "its process on a
    was lost"."""
    # Rounds every 30 s (and when something happens): none looks at the silent server
    # between its timeout and the new helper's registration, as when the helper's retry
    # (every 2 s) lands before the next round (every 1 s) once the name is free.
    sched = make_scheduler(sqlite_url, tick_s=30.0, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)

    def register(instance: str) -> Any:
        helper.Register(helper_pb2.RegisterServerRequest(
            name="a", gpus=[common_pb2.Gpu(index=0)], ramdisk="/ram/a", instance=instance))
        return helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="a"), timeout=30)

    def job() -> common_pb2.Job:
        return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))

    old_stream = register("old")
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1, steps=1000)
    job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    launch = next(c for c in old_stream if c.WhichOneof("body") == "launch")
    helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="a", command_id=launch.command_id, ok=True))
    pair = helper_pb2.JobIncarnation(job_id=job_id, incarnation=launch.launch.incarnation)
    assert helper.Heartbeat(helper_pb2.HeartbeatRequest(name="a", instance="old", running=[pair])).known
    wait_for(lambda: job().state == common_pb2.JOB_STATE_RUNNING, 10)
    # The host goes (its job with it); its new helper registers once the name is free.
    time.sleep(SETTINGS.down_after_s + 0.3)
    servers = {s.name: s.up for s in api.ListServers(scheduler_pb2.ListServersRequest()).servers}
    assert servers == {"a": True}, "a round called the server down first: this test needs the other order"
    new_stream = register("new")
    registered = time.monotonic()
    stop = threading.Event()

    def beat() -> None:  # the new helper's heartbeats: it runs nothing
        while not stop.wait(0.1):
            try:
                helper.Heartbeat(helper_pb2.HeartbeatRequest(name="a", instance="new"), timeout=5)
            except grpc.RpcError:
                return
    threading.Thread(target=beat, daemon=True).start()
    try:
        again = next(c for c in new_stream if c.WhichOneof("body") == "launch")
        print(f"\nlaunched again {time.monotonic() - registered:.2f}s after the new helper registered")
        history = [t.reason for t in job().history]
        downs = [e.message for e in api.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["server.down"])).events]
    finally:
        stop.set()
        channel.close()
    assert again.launch.job_id == job_id and again.launch.incarnation != launch.launch.incarnation
    assert any(r.startswith("its server a restarted its helper") for r in history), history
    assert len(downs) == 1 and downs[0].startswith("its helper was replaced: instance old"), downs


def _running_on_a(helper: Any, api: Any, wait_for: Any, gpus: list[common_pb2.Gpu], address: str = "") -> Any:
    """(job id, its launch command): a job RUNNING on server a, whose helper (instance
    "old") registered and said it runs it."""
    helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="old", address=address))
    stream = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="a"), timeout=30)
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1, steps=1000)
    job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    launch = next(c for c in stream if c.WhichOneof("body") == "launch")
    helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="a", command_id=launch.command_id, ok=True))
    pair = helper_pb2.JobIncarnation(job_id=job_id, incarnation=launch.launch.incarnation)
    assert helper.Heartbeat(helper_pb2.HeartbeatRequest(name="a", instance="old", running=[pair])).known
    wait_for(lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state == common_pb2.JOB_STATE_RUNNING, 10)
    return job_id, launch


def test_a_helper_restarted_after_a_crash_is_not_outrun_by_its_server_called_down(
    make_scheduler: Any, sqlite_url: str, wait_for: Any
) -> None:
    """A helper killed -9 (a crash) is started again at once (systemd's Restart=) with the
    exit of a job that had just finished, kept on its disk: it is refused the name until the
    old one has been silent the heartbeat timeout, and tries again meanwhile. Its tries now
    count as the server heard from, so a round does not call the server down (re-queueing
    the finished job) in the moment before its registration, with that exit, gets through:
    the job is SUCCEEDED and launched once. Before, the round came first ("no heartbeat for
    2s") and the job was placed again."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=0)]
    job_id, launch = _running_on_a(helper, api, wait_for, gpus)
    # The job ends, the old helper is killed before it could say so; the new one starts.
    finished = helper_pb2.ProcessExitRequest(server="a", job_id=job_id, incarnation=launch.launch.incarnation,
                                             exit_code=0, reason="finished")
    new = helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="new", exits=[finished])
    silent_since = time.monotonic()
    refusals = 0
    while time.monotonic() - silent_since < SETTINGS.down_after_s - 0.3:  # tries while refused
        with pytest.raises(grpc.RpcError) as refused:
            helper.Register(new, timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
        refusals += 1
        time.sleep(0.5)  # (the helper's own back-off: up to 2 s, under the 10-s default timeout)
    # Its next try comes a little after the name is free, as a round may look at the server.
    time.sleep(max(0.0, silent_since + SETTINGS.down_after_s + 0.4 - time.monotonic()))
    helper.Register(new, timeout=5)
    job = api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
    downs = [e.message for e in api.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["server.down"])).events]
    channel.close()
    assert refusals >= 2
    assert job.state == common_pb2.JOB_STATE_SUCCEEDED, [t.reason for t in job.history]
    assert [t.to_state for t in job.history].count(common_pb2.JOB_STATE_RUNNING) == 1
    assert len(downs) == 1 and downs[0].startswith("its helper was replaced: instance old"), downs


def test_a_helper_refused_for_another_servers_address_does_not_keep_its_server_up(
    make_scheduler: Any, sqlite_url: str, wait_for: Any
) -> None:
    """Host a's helper dies; a new one for a is started with b's agent address (a copied
    config) and is refused at every try, b being up. Its tries counted as a heard from, so
    a never went down: its job stayed RUNNING there, processless, for good. Now only a
    registration that goes through (or one refused for a name still held) counts: a goes
    down the heartbeat timeout after its old helper's last heartbeat, its job re-queued."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=0)]
    job_id, _ = _running_on_a(helper, api, wait_for, gpus, address="ha:7000")
    helper.Register(helper_pb2.RegisterServerRequest(name="b", gpus=gpus, instance="b", address="hb:7000"))
    stop = threading.Event()

    def beat_b() -> None:  # b stays up (its address stays taken)
        while not stop.wait(0.2):
            try:
                helper.Heartbeat(helper_pb2.HeartbeatRequest(name="b", instance="b"), timeout=5)
            except grpc.RpcError:
                return
    threading.Thread(target=beat_b, daemon=True).start()
    new = helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="new", address="hb:7000")
    silent_since = time.monotonic()
    try:
        while time.monotonic() - silent_since < SETTINGS.down_after_s + 2.0:
            with pytest.raises(grpc.RpcError) as refused:
                helper.Register(new, timeout=5)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
            time.sleep(0.3)
        servers = {s.name: s.up for s in api.ListServers(scheduler_pb2.ListServersRequest()).servers}
        history = [t.reason for t in api.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).history]
    finally:
        stop.set()
        channel.close()
    assert servers == {"a": False, "b": True}, (servers, history)
    assert any("its server a" in why for why in history), history


# "new": its helper killed meanwhile and started again (the exit kept on its disk), only
# after the server was called down (docs/migration_helper.md); `full`, the same path.
@pytest.mark.parametrize("instance", ["old", pytest.param("new", marks=pytest.mark.full)])
def test_a_job_that_ended_while_its_server_was_taken_for_lost_is_settled_by_its_late_exit(
    make_scheduler: Any, sqlite_url: str, wait_for: Any, instance: str
) -> None:
    """Its host cut off past the heartbeat timeout, the job's program ended before the lease
    froze it: the server was called down, the job re-queued. Back, the same helper registers
    again with the exit its outbox still holds: the job is SUCCEEDED, launched once. Before,
    that exit was passed over ("already re-queued") and the job ran a second time (from step
    0 here: it had no checkpoint). tests/multihost/test_ended_while_cut.py (`full`) shows it
    with real processes and a real cut."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=0)]
    job_id, launch = _running_on_a(helper, api, wait_for, gpus)

    def job() -> common_pb2.Job:
        return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))

    wait_for(lambda: job().state == common_pb2.JOB_STATE_QUEUED, 30)  # the cut: no heartbeat
    finished = helper_pb2.ProcessExitRequest(server="a", job_id=job_id, incarnation=launch.launch.incarnation,
                                             exit_code=0, reason="finished", steps=1000)
    helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance=instance, exits=[finished]))
    try:
        done = job()
        history = [t.reason for t in done.history]
        assert done.state == common_pb2.JOB_STATE_SUCCEEDED, history
        assert done.steps == 1000
        assert [common_pb2.JobState.Name(t.to_state) for t in done.history].count("JOB_STATE_RUNNING") == 1, history
        assert history[-1].startswith("finished; its exit came from a after the server was taken for lost"), history
        # The same exit again from the outbox after the registration changes nothing.
        helper.ReportProcessExit(finished)
        assert job().history[-1].reason == history[-1]
    finally:
        channel.close()


def test_a_late_exit_of_a_launch_told_to_exit_as_lost_leaves_its_job_queued(
    make_scheduler: Any, sqlite_url: str, wait_for: Any
) -> None:
    """As above, but the job's program had not ended: back from the cut, its runtime was
    told to exit (the launch taken for lost: RuntimeHub.kill_stale) and did, status 143
    (tf_runtime.EXIT_KILLED, "killed"). That exit is the scheduler's own doing, not the
    program's end: the job stays queued, to resume from its restore point. Before, it
    settled the job FAILED ("killed; its exit came from a after the server was taken for
    lost")."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=0)]
    job_id, launch = _running_on_a(helper, api, wait_for, gpus)
    try:
        wait_for(lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state == common_pb2.JOB_STATE_QUEUED, 30)
        told = helper_pb2.ProcessExitRequest(server="a", job_id=job_id, incarnation=launch.launch.incarnation,
                                             exit_code=143, reason="killed", steps=10)
        helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="old", exits=[told]))
        done = api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
        assert done.state in (common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING), \
            [t.reason for t in done.history]
    finally:
        channel.close()


def test_after_a_scheduler_restart_a_second_helper_of_the_same_name_does_not_take_it_from_the_live_one(
    make_scheduler: Any, sqlite_url: str, wait_for: Any
) -> None:
    """Two helpers started with --server-name a on two hosts: the second is refused while
    the scheduler runs. The scheduler restarts (the name's holder was in memory only) and
    the second helper's retry comes first. Before, it took the name: the live helper was
    refused, its job taken for lost ("its process on a was lost") and placed again on the
    second helper's host (its checkpoints on the first's). Now the name is kept for the
    helper at the address the database records for the up server, for the heartbeat
    timeout after the restart: the second is refused saying so, the first registers again
    and its job runs on in its process."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    gpus = [common_pb2.Gpu(index=0)]
    job_id, launch = _running_on_a(helper, api, wait_for, gpus, address="10.0.0.1:4000")
    channel.close()
    sched.stop(grace=0.5)
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    channel = grpc.insecure_channel(sched.address)
    helper, api = helper_pb2_grpc.HelperStub(channel), scheduler_pb2_grpc.SchedulerStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="second",
                                                             address="10.0.0.2:4000"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
        assert "held by the helper at 10.0.0.1:4000" in (refused.value.details() or ""), refused.value.details()
        helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="old", address="10.0.0.1:4000"))
        pair = helper_pb2.JobIncarnation(job_id=job_id, incarnation=launch.launch.incarnation)
        for _ in range(int(2 * SETTINGS.down_after_s / SETTINGS.heartbeat_interval_s)):  # past the timeout
            assert helper.Heartbeat(helper_pb2.HeartbeatRequest(name="a", instance="old", running=[pair])).known
            with pytest.raises(grpc.RpcError):  # the second keeps trying; the live one holds the name
                helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=gpus, instance="second",
                                                                 address="10.0.0.2:4000"))
            time.sleep(SETTINGS.heartbeat_interval_s)
        job = api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
    finally:
        channel.close()
    assert job.state == common_pb2.JOB_STATE_RUNNING and len(job.history) == 2, [t.reason for t in job.history]
