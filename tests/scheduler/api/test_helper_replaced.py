"""A host rebooted, or its helper restarted (its jobs gone with it), whose new helper
registers under the same name the moment the old one has been silent the heartbeat
timeout, before a scheduling round has called the server down. Over the real Helper API
(a real scheduler, gRPC and SQLite; the test answers for the helpers)."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

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
