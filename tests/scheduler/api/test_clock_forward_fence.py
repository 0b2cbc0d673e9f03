"""The scheduler's wall clock stepped FORWARD (NTP correcting a clock that ran slow, an
operator's `date -s`, a VM resumed with a stale clock) while a job is fenced: queued, not
to be placed again until the lease of a launch that did not answer has surely run out.
The fence runs its real length. Before, the step ended it at once (it was a wall-clock
time), and the job could be placed again beside a copy of it still training.

The scheduler's own clock (scheduler.wallclock.StepFreeClock) is the real one; only the
system wall clock it reads is moved, as a step moves it (the monotonic clock untouched).
The live case under libfaketime: tests/migration_helper/test_scheduler_clock_jump.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from migration_protocol.fast_path import MigrationResult, Outcome
from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.core import Settings

from .test_fencing import AGENTS, Fake, _blocking_migrate, _next_command, checkpointed_on_y

# A 6-s heartbeat timeout (the fence): with test_fencing's 2-s one, the launch the fake
# helper never confirms was withdrawn before the migration was asked, on a loaded machine.
FENCE = Settings(heartbeat_interval_s=0.2, down_after_s=6.0, command_timeout_s=1.0)


def test_a_fence_runs_its_length_though_the_wall_clock_steps_an_hour_forward(
    make_scheduler: Any, sqlite_url: str, wait_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=FENCE)
    f = Fake(sched.address)
    try:
        _fenced_then_stepped(sched, f, wait_for, monkeypatch)
    finally:
        f.close()


def _fenced_then_stepped(sched: Any, f: Fake, wait_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    f.keep_alive("a", "b")
    _, release = _blocking_migrate(monkeypatch, MigrationResult(
        Outcome.FAILED, "", "", reason="the source shim did not confirm its checkpoint"))
    release.set()
    job_id = f.submit()
    server, launch = f.launched(job_id, wait_for)
    f.shim(job_id, launch.incarnation)
    f.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server="b" if server == "a" else "a"))
    stop = next(f.commands(server))
    assert (stop.stop.job_id, stop.stop.incarnation) == (job_id, launch.incarnation)
    # The source's helper never answers the stop: the job is queued, fenced for the lease.
    queued = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_QUEUED and j, 15)
    requeued = time.monotonic()
    assert "lease to run out" in queued.history[-1].reason, queued.history[-1].reason
    clock = sched.server.core.clock
    real_wall = clock._wall
    monkeypatch.setattr(clock, "_wall", lambda: real_wall() + 3600.0)
    placed = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and j, 30)
    waited = time.monotonic() - requeued
    # The fence is 6 s; the test saw the requeue up to a poll late (0.05 s and a GetJob).
    # Before, 0.1-0.2 s.
    assert waited >= 0.8 * FENCE.down_after_s, f"placed again {waited:.1f}s after its requeue"
    assert len([t for t in placed.history if t.to_state == common_pb2.JOB_STATE_RUNNING]) == 2


def test_a_job_waiting_for_its_checkpoints_server_waits_on_though_the_wall_clock_steps_an_hour_forward(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its server down (a helper restarting), a queued job waits up to `checkpoint_wait_s`
    after that server was last heard for it to come back, rather than start from step 0
    elsewhere. That wait was counted from the server's last heartbeat as a wall-clock time:
    a step forward ended it at once, and the job started over from step 0."""
    settings = Settings(heartbeat_interval_s=0.2, down_after_s=2.0, command_timeout_s=2.0,
                        checkpoint_interval_s=0.5, checkpoint_wait_s=30.0)
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=settings)
    f = Fake(sched.address, gpus={"y": 1}, agents=True)
    try:
        job_id, path = checkpointed_on_y(f, wait_for)  # "y" falls silent: down after 2 s, its job re-queued
        wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_QUEUED
                 and "waits for server y" in j.message, 15)
        clock = sched.server.core.clock
        real_wall = clock._wall
        monkeypatch.setattr(clock, "_wall", lambda: real_wall() + 3600.0)
        time.sleep(3.0)  # past its fence (one heartbeat timeout, 2 s), when the wait is judged again
        job = f.job(job_id)
        assert job.state == common_pb2.JOB_STATE_QUEUED and "waits for server y" in job.message, \
            (job.state, job.history[-1].reason)
        f.streams.pop("y").cancel()  # back: a helper coming back opens a new command stream
        f.keep_alive("y")
        transfer = _next_command(f, "y", "transfer")
        assert (transfer.transfer.checkpoint_path, transfer.transfer.dest_address) == (path, AGENTS["x"])
    finally:
        f.close()
