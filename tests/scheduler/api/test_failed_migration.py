"""A migration that fails after the checkpoint was written: the job goes back to the
queue remembering its checkpoint, and its next launch on that server restores it
instead of starting again from step 0."""

from __future__ import annotations

import grpc
import pytest

from migration_protocol.fast_path import MigrationResult, Outcome
from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler.engine import live_migration

from .test_runtime_api import FakeShim


def _two_one_gpu_servers(ch: grpc.Channel, shared_root: str = "",
                         ) -> tuple[scheduler_pb2_grpc.SchedulerStub, helper_pb2_grpc.HelperStub]:
    """Servers "a" and "b", one GPU each, registered over `ch`; with `shared_root`, each
    with its ramdisk /ram/NAME and that shared root."""
    helper = helper_pb2_grpc.HelperStub(ch)
    for name in ("a", "b"):
        helper.Register(helper_pb2.RegisterServerRequest(
            name=name, gpus=[common_pb2.Gpu(index=0)], ramdisk=f"/ram/{name}" if shared_root else "",
            shared_root=shared_root))
    return scheduler_pb2_grpc.SchedulerStub(ch), helper


def _submit_one_gpu_job(stub: scheduler_pb2_grpc.SchedulerStub) -> common_pb2.Job:
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job


async def _fails_after_its_checkpoint(plan, ports, timeouts=None):  # type: ignore[no-untyped-def]
    return MigrationResult(Outcome.FAILED, "", "", step=7, checkpoint_path="/dev/shm/a/j/ckpt-7", reason="destination lost")


def _placed(ch: grpc.Channel, wait_for):  # type: ignore[no-untyped-def]
    """Servers a and b with their command streams, and a one-GPU job placed on one of them:
    (stub, a's stream, b's stream, the job, the server it is on)."""
    stub, helper = _two_one_gpu_servers(ch)
    a_cmds = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="a"))
    b_cmds = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="b"))
    job = _submit_one_gpu_job(stub)
    src = wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).placement)[0].server
    return stub, a_cmds, b_cmds, job, src


def test_failed_migration_resumes_from_its_checkpoint(scheduler_server, wait_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(live_migration, "migrate", _fails_after_its_checkpoint)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, a_cmds, b_cmds, job, src = _placed(ch, wait_for)
        cmds = a_cmds if src == "a" else b_cmds
        launch = next(cmds).launch
        assert launch.restore_checkpoint == ""
        _shim = FakeShim(ch, job.id, launch.incarnation)  # a job migrates with its runtime connected
        # Keep the other server busy so that the job can only come back to its source.
        stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server="b" if src == "a" else "a"))
        relaunch = next(cmds).launch
        assert relaunch.job_id == job.id
        assert relaunch.restore_checkpoint == "/dev/shm/a/j/ckpt-7"
        assert relaunch.incarnation != launch.incarnation
        got = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
        reasons = [t.reason for t in got.history]
        assert any("will resume from step 7" in r for r in reasons), reasons
        a_cmds.cancel()
        b_cmds.cancel()


def _cancelled() -> BaseException:
    import asyncio

    return asyncio.CancelledError()  # as a cancel() of the settling task lands there


def _database_blinks() -> BaseException:
    from scheduler.errors import Unavailable

    return Unavailable("database unreachable (OperationalError); retry shortly")


@pytest.mark.parametrize("fault", [_database_blinks, _cancelled], ids=["database_blinks", "cancelled"])
def test_an_operators_migration_runs_though_the_read_after_its_begin_fails(
        scheduler_server, wait_for, monkeypatch, fault) -> None:  # type: ignore[no-untyped-def]
    """Once an operator's migration has begun (its job MIGRATING), the engine reads its
    destination's address (to tell a refusal from a helper that moved). That read failing
    (the database unreachable for a moment), or the settling task cancelled during it (the
    scheduler stopping), left the migration never run ("coroutine ... was never awaited"):
    the job stayed MIGRATING, its GPUs held, until the scheduler restarted. Now it runs
    (here it fails after its checkpoint) and the job goes on from that checkpoint."""
    from scheduler.engine import live
    from scheduler.state import repo

    begun: list[bool] = []
    real_begin, real_get_server = live.begin_migration, repo.get_server

    async def begin(*args, **kwargs):  # type: ignore[no-untyped-def]
        rest = await real_begin(*args, **kwargs)
        begun.append(True)  # the job is MIGRATING: the database's next answer fails
        return rest

    async def get_server(session, name):  # type: ignore[no-untyped-def]
        if begun and begun.pop():
            raise fault()
        return await real_get_server(session, name)

    monkeypatch.setattr(live_migration, "migrate", _fails_after_its_checkpoint)
    monkeypatch.setattr(live, "begin_migration", begin)
    monkeypatch.setattr(repo, "get_server", get_server)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, a_cmds, b_cmds, job, src = _placed(ch, wait_for)
        launch = next(a_cmds if src == "a" else b_cmds).launch
        _shim = FakeShim(ch, job.id, launch.incarnation)
        stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server="b" if src == "a" else "a"))
        wait_for(lambda: not begun, 10)  # the fault was met
        story = lambda: [t.reason for t in stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).history]
        wait_for(lambda: any("will resume from step 7" in r for r in story()), 30)
        a_cmds.cancel()
        b_cmds.cancel()


def test_job_finishing_during_a_migration_succeeds(scheduler_server, wait_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The source ends the job (exit 0) while the destination is still pre-warming:
    the job succeeded; the migration must not put it back in the queue."""
    import asyncio

    release = asyncio.Event()

    async def slow_migrate(plan, ports, timeouts=None):  # type: ignore[no-untyped-def]
        await release.wait()
        return MigrationResult(Outcome.FAILED, "", "", reason="source gone")

    monkeypatch.setattr(live_migration, "migrate", slow_migrate)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, helper = _two_one_gpu_servers(ch)
        job = _submit_one_gpu_job(stub)
        placed = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).placement and j)
        src = placed.placement[0].server
        cmds = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=src))
        incarnation = next(cmds).launch.incarnation
        _shim = FakeShim(ch, job.id, incarnation)
        cmds.cancel()
        moving = stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server="b" if src == "a" else "a"))
        assert moving.state == common_pb2.JOB_STATE_MIGRATING
        # An exit without an incarnation cannot prove it is the current launch's: ignored.
        helper.ReportProcessExit(helper_pb2.ProcessExitRequest(server=src, job_id=job.id, incarnation="", exit_code=0))
        assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_MIGRATING
        helper.ReportProcessExit(helper_pb2.ProcessExitRequest(server=src, job_id=job.id, incarnation=incarnation, exit_code=0))
        scheduler_server.loop.call_soon_threadsafe(release.set)
        done = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).state == common_pb2.JOB_STATE_SUCCEEDED and j)
        assert list(done.placement) == []
        import time

        time.sleep(0.5)  # the migration's own ending must not undo it
        assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_SUCCEEDED


def test_a_checkpoint_left_in_the_destinations_ramdisk_through_a_shared_mount_is_kept_there(  # type: ignore[no-untyped-def]
        scheduler_server, wait_for, monkeypatch) -> None:
    """Through a shared mount the source writes its checkpoint into the destination's
    ramdisk (SHARED-ROOT/DEST/...). When the migration then fails, the restore point is
    recorded on the destination, where it lies: that server's helper is told to keep it
    (its housekeeping would otherwise prune it while the job waits), and the relaunch reads
    it there, or through the shared mount from the source."""
    async def failing_migrate(plan, ports, timeouts=None):  # type: ignore[no-untyped-def]
        written = f"{plan.source.shared_root}/{plan.dest.name}/{plan.job_id}/ckpt-7"
        return MigrationResult(Outcome.FAILED, "", "", step=7, checkpoint_path=written, reason="activate failed")

    monkeypatch.setattr(live_migration, "migrate", failing_migrate)
    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub, helper = _two_one_gpu_servers(ch, shared_root="/peers")
        streams = {n: helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=n), timeout=60) for n in "ab"}
        job = _submit_one_gpu_job(stub)
        src = wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).placement)[0].server
        dest = "b" if src == "a" else "a"
        first = next(streams[src]).launch
        assert first.restore_checkpoint == ""
        _shim = FakeShim(ch, job.id, first.incarnation)
        stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server=dest))
        there = f"/ram/{dest}/{job.id}/ckpt-7"
        got = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).placement and
                       any("will resume from step 7" in t.reason for t in j.history) and j)
        assert any(f"will resume from step 7 (its checkpoint is on {dest})" in t.reason for t in got.history)
        where = got.placement[0].server
        relaunch = next(streams[where]).launch
        assert relaunch.job_id == job.id
        assert relaunch.restore_checkpoint == (there if where == dest else f"/peers/{dest}/{job.id}/ckpt-7")
        # The destination's helper keeps it; the source's list does not name it.
        kept = helper.Heartbeat(helper_pb2.HeartbeatRequest(name=dest, want_kept=True))
        assert kept.kept_listed and list(kept.kept) == [there], [t.reason for t in stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).history]
        assert list(helper.Heartbeat(helper_pb2.HeartbeatRequest(name=src, want_kept=True)).kept) == []
        for stream in streams.values():
            stream.cancel()


def test_a_pre_warmed_destinations_verdict_counts_only_once_it_runs_the_job(
        make_scheduler, db_url, wait_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A migration's pre-warmed destination runs the program too, and its runtime may
    judge the job before the job is moved there. Before, its verdict set the job's flag:
    had that migration failed, the job would stay "not migratable" at its source for the
    word of a launch that never ran it. Now a verdict counts only from the job's current
    launch; the destination's is applied when the migration makes it current."""
    import threading

    release = threading.Event()
    plans: list = []

    async def held_then_migrated(plan, ports, timeouts=None):  # type: ignore[no-untyped-def]
        import asyncio

        plans.append(plan)
        while not release.is_set():
            await asyncio.sleep(0.05)
        return MigrationResult(Outcome.MIGRATED, plan.dest.name, plan.dest_incarnation, step=9,
                               checkpoint_path=f"/ram/{plan.dest.name}/ckpt-9")

    monkeypatch.setattr(live_migration, "migrate", held_then_migrated)
    sched = make_scheduler(db_url, tick_s=0.2)
    core = sched.server.core
    with grpc.insecure_channel(sched.address) as ch:
        stub, a_cmds, b_cmds, job, src = _placed(ch, wait_for)
        launch = next(a_cmds if src == "a" else b_cmds).launch
        get = lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id))
        source = FakeShim(ch, job.id, launch.incarnation)
        dest = None
        try:
            wait_for(lambda: get().state == common_pb2.JOB_STATE_RUNNING, 30)
            source.verdict(True)
            wait_for(lambda: core.runtimes.verdict(job.id, launch.incarnation) == (True, ""), 30)
            to = "b" if src == "a" else "a"
            stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job.id, to_server=to))
            plan = wait_for(lambda: plans and plans[0], 30)
            dest = FakeShim(ch, job.id, plan.dest_incarnation)
            dest.verdict(False, "its training run reads RandomUniform op 'dropout'")
            dest.progress(9, 1.0)  # read after the verdict (one stream, in order)
            wait_for(lambda: core.steps_seen(job.id, plan.dest_incarnation) == 9, 30)
            mid = get()
            assert mid.state == common_pb2.JOB_STATE_MIGRATING and mid.migratable, mid
            release.set()
            moved = wait_for(lambda: (j := get()).state == common_pb2.JOB_STATE_RUNNING and j.placement
                             and j.placement[0].server == to and j, 30)
            assert not moved.migratable, moved
            assert moved.control_note == "its training run reads RandomUniform op 'dropout'", moved.control_note
        finally:
            release.set()
            source.close()
            if dest is not None:
                dest.close()
            a_cmds.cancel()
            b_cmds.cancel()
