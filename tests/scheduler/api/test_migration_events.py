"""What an operator reads of a migration that did not happen because its job ended first,
over the real Scheduler, Helper and Runtime APIs and the real migration path (the test
answers for both helpers and the shim). In `gandiva demo` a job finished (SUCCEEDED) while
its unpack migration pre-warmed a copy at the destination; the scheduler stopped that copy,
and the migration's event said "aborted 0.000s (pre-warm at node-1 failed: ... exited with
code -9 before 'warm_ready'; see ...log)": a failed migration, with a log to read, in the
operator's list of what went wrong, for a job that succeeded."""

from __future__ import annotations

from typing import Any

from protos.gandiva.v1 import common_pb2, helper_pb2, scheduler_pb2

from .test_fencing import Fake, fake

assert fake  # a fixture (a scheduler and servers a, b), used by name


def _migration_events(f: Fake, job_id: str) -> list[str]:
    events = f.api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
    return [e.message for e in events if e.kind == "job.migration"]


def test_a_migration_whose_job_ended_first_says_so_not_that_it_failed(fake: Fake, wait_for: Any) -> None:
    fake.keep_alive("a", "b")
    job_id = fake.submit()
    src, launch = fake.launched(job_id, wait_for)
    dest = "b" if src == "a" else "a"
    fake.shim(job_id, launch.incarnation)
    wait_for(lambda: fake.job(job_id).state == common_pb2.JOB_STATE_RUNNING)
    fake.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest))
    prewarm = next(c for c in fake.commands(dest) if c.WhichOneof("body") == "launch")
    # The job ends at its source while its copy pre-warms at the destination ...
    fake.helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
        server=src, job_id=job_id, incarnation=launch.incarnation, exit_code=0))
    wait_for(lambda: fake.job(job_id).state == common_pb2.JOB_STATE_SUCCEEDED)
    # ... and the copy, stopped, exits before it was warm.
    fake.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
        server=dest, command_id=prewarm.command_id, ok=False, exit_code=-9,
        message=f"{job_id}: the job process exited with code -9 before 'warm_ready'; "
                f"see /ram/{dest}/logs/{job_id}.log"))
    stop = next(c for c in fake.commands(dest) if c.WhichOneof("body") == "stop")  # the migration's clean-up
    fake.helper.ReportCommandResult(helper_pb2.HelperCommandResult(server=dest, command_id=stop.command_id, ok=True))
    said = wait_for(lambda: [m for m in _migration_events(fake, job_id) if m.startswith("aborted")], 30)
    assert said == [(f"aborted (the job ended (SUCCEEDED) before it moved: nothing to move; what the migration "
                    f"met then: pre-warm at {dest} failed: {dest}: launch failed: {job_id}: the job process exited "
                    f"with code -9 before 'warm_ready'; see /ram/{dest}/logs/{job_id}.log)")], said
    assert fake.job(job_id).state == common_pb2.JOB_STATE_SUCCEEDED


def test_a_migration_whose_job_ended_after_its_pre_warm_still_ends_in_an_event(
        fake: Fake, wait_for: Any, monkeypatch: Any) -> None:
    """`gandiva demo` (s51): "long" went MIGRATING, its copy pre-warmed at node-2, then it
    finished (SUCCEEDED) before its source was told to stop; the stop found no runtime to tell
    and the migration ended with no ``job.migration`` event at all ("Moves: none" in
    ``describe job``, the decision's outcome unknown)."""
    from scheduler.hubs import RuntimeHub

    monkeypatch.setattr(RuntimeHub, "reconnect_grace_s", 0.2)  # how long the gone runtime is awaited
    fake.keep_alive("a", "b")
    job_id = fake.submit()
    src, launch = fake.launched(job_id, wait_for)
    dest = "b" if src == "a" else "a"
    shim = fake.shim(job_id, launch.incarnation)
    wait_for(lambda: fake.job(job_id).state == common_pb2.JOB_STATE_RUNNING)
    fake.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest))
    prewarm = next(c for c in fake.commands(dest) if c.WhichOneof("body") == "launch")
    shim.close()  # the job ends at its source while its copy pre-warms ...
    fake.helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
        server=src, job_id=job_id, incarnation=launch.incarnation, exit_code=0))
    wait_for(lambda: fake.job(job_id).state == common_pb2.JOB_STATE_SUCCEEDED)
    # ... and the copy is warm: the source, to be told to stop, has no runtime any more.
    fake.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
        server=dest, command_id=prewarm.command_id, ok=True))
    for server in (dest, src):  # the migration's clean-up: the copy, then the source, stopped
        stop = next(c for c in fake.commands(server) if c.WhichOneof("body") == "stop")
        fake.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
            server=server, command_id=stop.command_id, ok=True))
    said = wait_for(lambda: [m for m in _migration_events(fake, job_id) if m.startswith("aborted")], 30)
    assert said == [(f"aborted (the job ended (SUCCEEDED) before it moved: nothing to move; what the migration "
                     f"met then: the source shim did not confirm its checkpoint (FailedPrecondition: job {job_id} "
                     f"has no running process (launch {launch.incarnation}) connected to the scheduler); its "
                     "process exit decides what happens next)")], _migration_events(fake, job_id)
    assert fake.job(job_id).state == common_pb2.JOB_STATE_SUCCEEDED
