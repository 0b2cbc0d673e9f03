"""A job's runtime lives in the user's own process: one that trains on through every
suspend, never answering it, kept its GPU while the job time-sliced with it (another
user's) never ran. A real scheduler over a real socket, a scripted helper with one GPU,
two runtimes on real Runtime streams."""

from __future__ import annotations

import threading

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
from scheduler.policy.types import PolicyConfig

from .scripted_runtime import ScriptedRuntime


class Helper:
    """Server n1 (one GPU): takes every command, heartbeats its launches."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.stub = helper_pb2_grpc.HelperStub(channel)
        self.stub.Register(helper_pb2.RegisterServerRequest(
            name="n1", gpus=[common_pb2.Gpu(index=0, memory_total_bytes=16 << 30)]))
        self.launched: dict[str, str] = {}
        self.stopped: list[str] = []
        self.done = threading.Event()
        self.commands = self.stub.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
        threading.Thread(target=self._obey, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _obey(self) -> None:
        try:
            for cmd in self.commands:
                if cmd.WhichOneof("body") == "launch":
                    self.launched[cmd.launch.job_id] = cmd.launch.incarnation
                elif cmd.WhichOneof("body") == "stop":
                    self.stopped.append(cmd.stop.incarnation)
                self.stub.ReportCommandResult(helper_pb2.HelperCommandResult(
                    server="n1", command_id=cmd.command_id, ok=True))
        except (grpc.RpcError, ValueError):
            pass  # the stream ends with the test

    def _beat(self) -> None:
        while not self.done.wait(0.5):
            running = [helper_pb2.JobIncarnation(job_id=j, incarnation=i) for j, i in list(self.launched.items())
                       if i not in self.stopped]
            try:
                self.stub.Heartbeat(helper_pb2.HeartbeatRequest(
                    name="n1", running=running, running_jobs=[r.job_id for r in running]))
            except grpc.RpcError:
                pass


def _liar_and_victim(ch: grpc.Channel, stub: scheduler_pb2_grpc.SchedulerStub, helper: Helper, wait_for,  # type: ignore[no-untyped-def]
                     lie: str, runtimes: list[ScriptedRuntime]) -> tuple[str, str]:
    """Two jobs of two users on n1's one GPU, each launched with its runtime connected
    (added to ``runtimes``): the first tells ``lie``. Returns their ids."""
    ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        command=["python", "t.py"], gpus=1, name=name, user=name))).job.id for name in (lie, "victim")]
    for job_id in ids:
        incarnation = wait_for(lambda j=job_id: helper.launched.get(j))
        runtimes.append(ScriptedRuntime(ch, job_id, incarnation, lie if job_id == ids[0] else ""))
    return ids[0], ids[1]


@pytest.mark.parametrize("lie", ["deaf", "ack"])
def test_a_job_that_trains_on_through_a_suspend_is_stopped_and_queued_again(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, wait_for, lie: str) -> None:
    """Probed with 60 s commands: the job time-sliced with one that ignored its suspends ran
    0 of 90 s; beside one that acked them and trained on, at half its rate all the time. Now
    a launch whose reports bring new mini-batches five times while a suspend goes unanswered,
    or that reports more mini-batches between its suspend's ack and its resume, is stopped
    through its helper and its job queued again; the other job gets the GPU."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, policy_config=PolicyConfig(quantum_s=2.0, enable_packing=False),
                           settings=Settings(command_timeout_s=4.0))
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        helper = Helper(ch)
        runtimes: list[ScriptedRuntime] = []
        try:
            deaf, victim = _liar_and_victim(ch, stub, helper, wait_for, lie, runtimes)
            first = helper.launched[deaf]

            def evicted() -> common_pb2.Job | None:
                job = stub.GetJob(scheduler_pb2.GetJobRequest(id=deaf))
                return job if any(t.reason.startswith("did not suspend when told") for t in job.history) else None

            job = wait_for(evicted, timeout=60)
            reason = next(t.reason for t in job.history if t.reason.startswith("did not suspend when told"))
            assert "its process is stopped and it is queued again" in reason, reason
            assert wait_for(lambda: first in helper.stopped), "its launch is stopped through its helper"
            # The job time-sliced with it gets the GPU and trains.
            wait_for(lambda: (v := stub.GetJob(scheduler_pb2.GetJobRequest(id=victim))).state ==
                     common_pb2.JOB_STATE_RUNNING and v.steps > 0, timeout=30)
        finally:
            for r in runtimes:
                r.close()
            helper.done.set()
            helper.commands.cancel()


async def _jobs_ended_suspended(engine, n: int) -> None:  # type: ignore[no-untyped-def]
    """What a long-lived scheduler has seen: `n` jobs that left SUSPENDED other than by a
    resume (killed, re-queued, moved while suspended), each leaving its entry."""
    engine._suspended.update({f"gone{i}": ("launch", 0) for i in range(n)})


def test_a_job_that_trains_on_while_suspended_is_caught_however_many_jobs_ended_suspended(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, wait_for) -> None:
    """The record of each suspended job's step was dropped whole at 100,000 entries, most
    of them jobs that ended suspended long ago: the job that had acked its suspend and
    trained on (its partner running beside it) was resumed unchecked, and went on until its
    next suspension. Now only the entries of launches not recorded suspended are dropped: it
    is caught at its first resume."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, policy_config=PolicyConfig(quantum_s=2.0, enable_packing=False),
                           settings=Settings(command_timeout_s=4.0))
    engine = sched.server.engine
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        helper = Helper(ch)
        runtimes: list[ScriptedRuntime] = []
        try:
            liar, _ = _liar_and_victim(ch, stub, helper, wait_for, "ack", runtimes)
            wait_for(lambda: liar in engine._suspended, 60)  # acked its suspend; trains on
            sched.call(_jobs_ended_suspended(engine, 100_001))

            def evicted() -> common_pb2.Job | None:
                job = stub.GetJob(scheduler_pb2.GetJobRequest(id=liar))
                return job if any(t.reason.startswith("did not suspend when told") for t in job.history) else None

            history = wait_for(evicted, timeout=60).history
            states = [common_pb2.JobState.Name(t.to_state) for t in history]
            assert states.count("JOB_STATE_SUSPENDED") == 1, [(s, t.reason) for s, t in zip(states, history)]
            assert "gone0" not in engine._suspended
        finally:
            for r in runtimes:
                r.close()
            helper.done.set()
            helper.commands.cancel()
