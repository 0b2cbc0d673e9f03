"""Hosts lost in the middle of a shrink, over the real Helper and Runtime APIs (a real
scheduler, gRPC and SQLite; the test answers for the helper and the shims)."""

from __future__ import annotations

from typing import Any

from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2

from .test_fencing import Fake, _next_command
from .test_host_faults import SETTINGS, Beats, _allocated, _launch_confirmed, growing_on_a

QUEUED, RUNNING = common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING


def _ack(f: Fake, server: str, cmd: helper_pb2.HelperCommand, **kw: Any) -> None:
    f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(server=server, command_id=cmd.command_id, ok=True, **kw))


def test_a_host_lost_while_its_job_shrinks_resumes_it_once_from_the_shrinks_checkpoint(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A grow-shrink job grown onto both of a's GPUs shrinks back to one when a second job
    arrives; the source confirmed the shrink's checkpoint (step 42) and exited, and a is
    lost before the shrunk copy's activation is answered. Both jobs go back to the queue,
    holding no GPU; the first to resume from the shrink's checkpoint. a back, each job is
    launched once, and the shrunk copy is named stale."""
    from scheduler.policy.types import PolicyConfig

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS, policy_config=PolicyConfig(grow_idle_s=0.3))
    f = Fake(sched.address, gpus={"a": 2})
    beats = Beats(f)
    try:
        job_id, launch, shim, grown = growing_on_a(f, beats)  # then activated
        _ack(f, "a", _next_command(f, "a", "activate"), step=42)
        shim.close()
        beats.run("a", (job_id, grown.incarnation))
        big = f.shim(job_id, grown.incarnation)
        big.out.put(runtime_pb2.RuntimeMessage(towers=runtime_pb2.TowerReport(towers=1)))
        wait_for(lambda: len((j := f.job(job_id)).placement) == 2 and j.state == RUNNING, 10)

        other = f.submit()  # wants a GPU: the grown job shrinks back to one
        small = _launch_confirmed(f, "a")  # the shrink's destination, pre-warmed on one GPU
        assert small.warm and small.job_id == job_id and len(small.gpu_indices) == 1, small
        beats.run("a", (job_id, grown.incarnation), (job_id, small.incarnation))
        activate = _next_command(f, "a", "activate")  # the grown copy checkpointed; never answered
        checkpoint = activate.activate.restore_checkpoint
        big.close()  # the grown copy exited after its checkpoint
        beats.silence("a")  # a is lost
        waiting = wait_for(lambda: (j := f.job(job_id)).state == QUEUED and j, 15)
        reasons = [t.reason for t in waiting.history]
        assert any("its server a went down mid-migration; will resume from step 42 (its checkpoint is on a)" in r
                   for r in reasons), reasons
        wait_for(lambda: f.job(other).state == QUEUED, 10)
        assert _allocated(f) == {"a": (2, 0)}
        assert not f.job(job_id).placement and not f.job(other).placement

        f.streams.pop("a").cancel()
        f.register("a", 2)
        beats.run("a")
        assert (job_id, small.incarnation) in f.heartbeat("a", (job_id, small.incarnation))
        launches = {}
        for _ in range(2):
            cmd = _next_command(f, "a", "launch")
            _ack(f, "a", cmd)
            launches[cmd.launch.job_id] = cmd.launch
        assert set(launches) == {job_id, other}
        relaunch = launches[job_id]
        assert relaunch.restore_checkpoint == checkpoint and not relaunch.warm, relaunch
        assert relaunch.incarnation not in (launch.incarnation, grown.incarnation, small.incarnation)
        beats.run("a", *((j, lj.incarnation) for j, lj in launches.items()))
        wait_for(lambda: all(f.job(j).state == RUNNING for j in launches), 10)
        gpus = [(p.server, p.index) for j in launches for p in f.job(j).placement]
        assert len(gpus) == len(set(gpus)) == 2, gpus
        assert _allocated(f) == {"a": (2, 2)}
    finally:
        beats.close()
        f.close()
