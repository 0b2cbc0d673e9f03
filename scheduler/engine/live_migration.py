"""Live migration: the scheduler's side of migration_protocol/fast_path.py.

It implements MigrationPorts over the helper and runtime streams, moves the job
to MIGRATING for the duration, and records the outcome (placement, incarnation,
state) in one transaction at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from migration_protocol.fast_path import (
    MigrationPlan,
    MigrationResult,
    Outcome,
    checkpoint_home,
    migrate,
)
from protos.gandiva.v1 import helper_pb2, runtime_pb2
from scheduler import auth
from scheduler.core import SchedulerCore, spec_of
from scheduler.errors import FailedPrecondition, GandivaError, Unavailable
from scheduler.lifecycle import JobState
from scheduler.policy.types import GpuRef
from scheduler.state import repo
from scheduler.state.models import AuthToken, Gpu, Job, Migration, Server
from scheduler.unmoved import ENDED_UNMOVED, FAILED_REQUEUE

log = logging.getLogger(__name__)

# How long an operator's suspend or resume waits for the job's runtime to connect.
OPERATOR_CONNECT_WAIT_S = 10.0


def not_connected(job_id: str, deadline_s: float) -> str:
    """Why a job whose runtime is not connected cannot take a command now, and what to do."""
    return (f"job {job_id} has no runtime connected: its program connects when it starts "
            "training (TensorFlow under the shim); try again once it shows progress. A program "
            f"that has not connected {deadline_s:g} s after its launch (not TensorFlow, or a "
            "wrapper that hides it) is marked uncontrollable: it is never suspended or migrated")

# How long a migration step's reads (is the server down? the transfer's ticket) wait for an
# unreachable database before the step fails: a database restart (a second or two) used to
# fail the step at once, a migration whose source had already checkpointed included (a
# restart instead of a move).
READ_WAIT_S = 30.0


# A migration's durable phase (migrations.phase) after each phase completes.
NEXT_PHASE = {"prewarm": "checkpoint", "checkpoint": "transfer", "transfer": "activate"}


async def vouch_transfer(core: SchedulerCore, transfer: helper_pb2.TransferCheckpoint) -> str:
    """A checkpoint goes only to a registered helper's agent that is up; when that helper
    has a token, the command carries a ticket for it (auth.transfer_ticket), without which
    its agent refuses the stream. Returns the destination server's name: the caller
    watches it (``HelperHub.call(watch=...)``), so that the transfer fails as soon as
    that server goes down instead of streaming into a cut link until its timeout."""
    async def look(s: AsyncSession) -> tuple[Server | None, AuthToken | None]:
        dest = await repo.server_at(s, transfer.dest_address)
        return dest, (await s.get(AuthToken, dest.name) if dest is not None else None)

    dest, token = await core.when_reachable(look, read=True, within_s=READ_WAIT_S)
    if dest is None:
        raise FailedPrecondition(f"transfer of {transfer.job_id}: {transfer.dest_address!r} is not "
                                 "the agent address of a registered helper")
    if not dest.up:
        raise Unavailable(f"transfer of {transfer.job_id}: its destination {dest.name} is down")
    if token is not None and token.role == "helper" and not token.revoked_at:
        # Bound to the name the checkpoint lands under there (the source's directory name
        # unless the command names one: migration_helper.ramdisk.checkpoint_chunks).
        name = transfer.checkpoint_name or PurePosixPath(transfer.checkpoint_path).name
        transfer.ticket = auth.transfer_ticket(token.token_hash, dest.name, transfer.job_id, name,
                                               core.clock() + auth.TICKET_S)
    return str(dest.name)


async def refuse_if_down(core: SchedulerCore, server: str, command: helper_pb2.HelperCommand) -> None:
    """A command for a server marked down fails at once (Unavailable) instead of waiting
    out its timeout for a helper that is not there: a migration whose source or
    destination was lost used to hold its job, unplaceable, 30-60 s more. A stop is still
    queued, for the helper to carry out if it comes back (its heartbeat fencing stops the
    launch then anyway)."""
    async def look(s: AsyncSession) -> Server | None:
        return await s.get(Server, server)

    srv = await core.when_reachable(look, read=True, within_s=READ_WAIT_S)
    if srv is not None and not srv.up:
        body = command.WhichOneof("body")
        if body == "stop":
            core.stop_on(server, command.stop.job_id, command.stop.incarnation, command.stop.reason)
        raise Unavailable(f"server {server} is down: {body} not sent")


class LivePorts:
    def __init__(self, core: SchedulerCore) -> None:
        self.core = core
        self.observer = core.observer

    async def helper_command(
        self, server: str, command: helper_pb2.HelperCommand, timeout_s: float
    ) -> helper_pb2.HelperCommandResult:
        await refuse_if_down(self.core, server, command)
        if command.WhichOneof("body") == "transfer":
            # Fails at once when the destination goes down (its link cut mid-copy): the
            # job restarts at its source from the checkpoint instead of waiting out the
            # transfer's timeout (300 s) without training.
            dest = await self._vouch(command.transfer)
            return await self.core.helpers.call(server, command, timeout_s, watch=dest)
        return await self.core.helpers.call(server, command, timeout_s)

    async def _vouch(self, transfer: helper_pb2.TransferCheckpoint) -> str:
        return await vouch_transfer(self.core, transfer)

    async def runtime_command(
        self, job_id: str, incarnation: str, command: runtime_pb2.RuntimeCommand, timeout_s: float
    ) -> runtime_pb2.CommandAck:
        return await self.core.runtimes.send(job_id, command, timeout_s, incarnation)

    async def record_phase(self, job_id: str, phase: str, seconds: float, detail: str) -> None:
        """The event, and the durable phase: the one the migration enters next."""
        self.observer.migration_phase(phase, seconds)
        if phase == "total" or phase in ENDED_UNMOVED:
            self.observer.move_ended(self.core.clock(), job_id, phase, seconds)
        async with self.core.tx() as s:
            msg = f"{phase} {seconds:.3f}s" + (f" ({detail})" if detail else "")
            if phase in ENDED_UNMOVED:
                job = await s.get(Job, job_id)
                if job is not None and JobState(job.state).terminal:
                    # Its job ended first (finished, failed, killed), and the migration's
                    # clean-up stopped the copy it was preparing: not a failed migration. It
                    # read "aborted 0.000s (pre-warm at node-1 failed: ... exited with code -9
                    # ...; see LOG)" in the demo, for a job that had SUCCEEDED.
                    msg = (f"{phase} (the job ended ({job.state}) before it moved: nothing to move"
                           + (f"; what the migration met then: {detail})" if detail else ")"))
            now = self.core.clock()
            repo.add_event(s, now, "job.migration", msg, job_id=job_id)
            row = await repo.get_migration(s, job_id)
            if row is not None and phase in NEXT_PHASE:
                row.phase = NEXT_PHASE[phase]
                row.updated_at = now

    async def checkpoint_confirmed(self, job_id: str, step: int, path: str) -> None:
        """The source stopped with a checkpoint: a restart can always resume from it."""
        async with self.core.tx() as s:
            row = await repo.get_migration(s, job_id)
            if row is not None:
                row.checkpoint_path, row.step, row.updated_at = path, step, self.core.clock()


async def begin_migration(
    core: SchedulerCore, job_id: str, to_gpus: Sequence[GpuRef], reason: str
) -> Coroutine[Any, Any, MigrationResult | None]:
    """Move the job to MIGRATING (one transaction) and return the coroutine that
    carries the migration out, records its outcome and returns it (None: it crashed)."""
    async with core.tx() as s:
        job = await repo.get_job(s, job_id, for_update=True)
        if not job.migratable:
            raise FailedPrecondition(f"job {job_id} is not migratable")
        # The destination is pre-warmed by starting the program there, which holds before
        # it trains only under a connected runtime: without one it would be a second live
        # copy of the program (a plain Python job in its first minutes).
        if not core.runtimes.connected(job_id, job.incarnation):
            raise FailedPrecondition(not_connected(job_id, core.settings.runtime_connect_deadline_s))
        placement = (await repo.placements_of(s, [job_id])).get(job_id, [])
        if not placement:
            raise FailedPrecondition(f"job {job_id} has no placement to migrate from")
        was = JobState(job.state)
        src_name, dest_name = placement[0].server_name, to_gpus[0].server
        src, dst = await repo.get_server(s, src_name), await repo.get_server(s, dest_name)
        now = core.clock()
        plan = MigrationPlan(
            job_id=job_id,
            spec=spec_of(job),
            source=repo.endpoint(src),
            source_incarnation=job.incarnation,
            source_gpus=tuple(p.gpu_index for p in placement if p.server_name == src_name),
            dest=repo.endpoint(dst),
            dest_gpus=tuple(g.index for g in to_gpus if g.server == dest_name),
            warm_signature=core.runtimes.train_signature(job_id, job.incarnation),
            source_towers=core.runtimes.towers(job_id, job.incarnation),
        )
        # Durable from here: the destination GPUs are held, and a scheduler restart
        # finds this row and completes or rolls back the migration (recover_migrations).
        row = Migration(
            job_id=job_id, phase="prewarm", was_state=was.value, reason=reason,
            source_server=src_name, source_incarnation=job.incarnation,
            dest_server=dest_name, dest_gpus=list(plan.dest_gpus),
            dest_incarnation=plan.dest_incarnation, fallback_incarnation=plan.fallback_incarnation,
            checkpoint_path="", step=-1, started_at=now, updated_at=now,
        )
        await repo.start_migration(s, job, row, now, f"{reason}: {src_name} -> {dest_name}")
    return _carry_out(core, plan, was, list(to_gpus))


async def _carry_out(
    core: SchedulerCore, plan: MigrationPlan, was: JobState, to_gpus: list[GpuRef]
) -> MigrationResult | None:
    job_id, dest_name = plan.job_id, plan.dest.name
    failure = ""
    try:
        result = await migrate(plan, LivePorts(core))
    except Exception as err:  # a bug in the orchestration must not leave the job MIGRATING
        log.exception("migration of %s crashed", job_id)
        result = None
        failure = f"migration crashed: {err}"
    fence = 0.0
    if result is None or (result.outcome is Outcome.FAILED and result.step < 0):
        # The source never confirmed a checkpoint: it may still be training. Stop it
        # before anything else runs the job; if that cannot be confirmed, the job waits
        # until the source's lease has surely run out.
        fence = await _stop_source(core, plan)

    gone_at_dest: list[str] = []  # the destination GPUs its server no longer reports, if any
    left_first: list[bool] = []  # the job was out of MIGRATING (ended, killed) before this end

    async def record(s: AsyncSession) -> None:
        gone_at_dest.clear()
        left_first.clear()
        now = core.clock()
        job = await repo.get_job(s, job_id, for_update=True)
        if job.state != JobState.MIGRATING.value:
            left_first.append(True)
            # Killed, or its source server went down, meanwhile: whatever this migration
            # left running is not the job any more (unless this outcome was recorded by a
            # try whose commit was answered by a lost connection).
            if result is not None and result.incarnation and result.server and job.incarnation != result.incarnation:
                core.stop_on(result.server, job_id, result.incarnation, "migration overtaken")
            return
        await repo.end_migration(s, job_id)
        if result is None or result.outcome is Outcome.FAILED:
            why = failure if result is None else result.reason
            if result is not None and result.step >= 0 and result.checkpoint_path:
                # Never silently from step 0: the next launch restores it, recorded on the
                # server whose ramdisk holds it (the destination's, through a shared mount),
                # so that that server's helper keeps it and a launch elsewhere can fetch it.
                holder, path = checkpoint_home(plan.source, plan.dest, result.checkpoint_path)
                job.restore_checkpoint, job.restore_server, job.restore_step = path, holder, result.step
                why += f"; will resume from step {result.step} (its checkpoint is on {holder})"
            if fence:
                why += f"; waiting {fence - now:.0f}s for {plan.source.name}'s lease to run out"
            await core.requeue_fenced(s, job, now, FAILED_REQUEUE + why, fence)
        elif result.outcome is Outcome.MIGRATED:
            # The migration's checkpoint, at the destination, is the job's latest restore point.
            job.restore_checkpoint, job.restore_server, job.restore_step = result.checkpoint_path, dest_name, result.step
            gone = await _gpus_gone(s, dest_name, [g.index for g in to_gpus if g.server == dest_name])
            if gone:
                gone_at_dest.append(gone)
                # Its helper registered again meanwhile without them (one failed, or its
                # CUDA_VISIBLE_DEVICES changed). Before, the job was placed there all the same:
                # RUNNING on a GPU the server no longer has (1 GPU, 2 allocated), for good.
                await repo.requeue(s, job, now, f"migration to {dest_name} failed, re-placing: its GPU(s) "
                                   f"{gone} on {dest_name} are no longer reported by the server's "
                                   f"helper; will resume from step {result.step} (its checkpoint is on {dest_name})")
                return
            # What the destination reported before it was current (a scheduler that did not
            # run meanwhile: it may even have finished) is its progress too.
            job.steps = max(job.steps, result.step, core.steps_seen(job_id, result.incarnation))
            paused = result.durations_s.get("total", 0.0)
            await repo.place(s, job, [(g.server, g.index) for g in to_gpus], result.incarnation, now,
                             f"migrated to {dest_name} at step {result.step} (training paused {paused:.2f}s)")
            core.apply_launch_verdict(s, job)
        else:
            job.incarnation = result.incarnation
            core.apply_launch_verdict(s, job)
            still_suspended = was is JobState.SUSPENDED and result.outcome is Outcome.STAYED
            why = result.reason if still_suspended else f"{result.outcome.value}: {result.reason}"
            await _roll_back(s, job, now, why, suspended=still_suspended)

    # Recorded whatever it takes: the job's processes already are where the outcome says.
    await core.record_when_reachable(f"the end of {job_id}'s migration", record)
    if result is None or (result.outcome is Outcome.FAILED
                          and not (ENDED_UNMOVED | {"total"}) & result.durations_s.keys()):
        # A migration that crashed, or whose source never confirmed a checkpoint (its runtime
        # gone: in `gandiva demo`, "long" finished after its copy pre-warmed), ended with no
        # event of its own: "Moves: none" in `describe job`, its decision's outcome unknown.
        # Its end is said like any other's (record_phase: "aborted (the job ended ...)").
        await LivePorts(core).record_phase(job_id, "aborted" if left_first else "failed", 0.0,
                                           failure if result is None else result.reason)
    if gone_at_dest and result is not None:
        core.stop_on(dest_name, job_id, result.incarnation, f"its GPU(s) {gone_at_dest[0]} on {dest_name} are gone")
    await core.replay_early_exit(job_id, result.incarnation if result is not None else "")
    if result is not None and result.towers_refused:
        # Its runtime's own report of the refusal may have come after the helper's answer
        # (the copy then stale, its messages not heeded): grow-shrink off all the same.
        try:
            await core.record_towers_changed(job_id, plan.dest_incarnation, 0, 0, len(to_gpus))
        except GandivaError as err:  # the next grow's refusal says it again
            log.warning("could not turn grow-shrink off for job %s: %s", job_id, err)
    core.poke()
    return result


async def _gpus_gone(s: AsyncSession, server: str, indices: Sequence[int]) -> str:
    """Those of `indices` that `server` no longer has (its helper registered again with
    fewer GPUs), as words ("1, 2"); "" when it has them all."""
    have = set((await s.execute(select(Gpu.index).where(Gpu.server_name == server))).scalars())
    return ", ".join(str(i) for i in indices if i not in have)


async def _roll_back(s: AsyncSession, job: Job, now: float, reason: str, suspended: bool) -> None:
    """Out of MIGRATING, back to running (and on to suspended when `suspended`):
    MIGRATING -> RUNNING -> SUSPENDED keeps the state machine's rules in one place."""
    await repo.transition(s, job, JobState.RUNNING, now, reason)
    if suspended:
        await repo.transition(s, job, JobState.SUSPENDED, now, "still suspended")


async def _stop_source(core: SchedulerCore, plan: MigrationPlan) -> float:
    """Stop the source launch; 0 once its helper confirmed, else the time until which
    the job must not run anywhere (the source's lease has surely run out by then)."""
    stop = helper_pb2.HelperCommand(stop=helper_pb2.StopJob(
        job_id=plan.job_id, incarnation=plan.source_incarnation, reason="migration failed before its checkpoint"))
    try:
        await refuse_if_down(core, plan.source.name, stop)
        result = await core.helpers.call(plan.source.name, stop, core.settings.command_timeout_s)
        if result.ok:
            return 0.0
    except GandivaError as err:  # unreachable or gone: fall back on the lease
        log.warning("could not stop the source of %s on %s (%s); waiting out its lease", plan.job_id, plan.source.name, err)
    return core.clock() + core.settings.down_after_s


async def recover_migrations(core: SchedulerCore) -> list[str]:
    """Complete or roll back every migration left in SQL by a scheduler that stopped
    (or crashed) mid-way; returns the jobs concerned. Nothing in memory survives a
    restart, so each is decided from its durable phase alone:

    - before the source confirmed a checkpoint (prewarm, checkpoint): rolled back; the
      job stays where it was, in the state it had, and the destination is stopped. Had
      the source already stopped, its exit report re-queues the job;
    - after (transfer, activate): completed by a restart from that checkpoint (the
      destination, which may or may not have started training, is stopped): the job is
      re-queued to resume from the checkpoint's step, never from 0; in phase activate
      fenced until the destination's lease has surely run out.
    """
    now = core.clock()
    stops: list[tuple[str, str, str]] = []
    async with core.tx() as s:
        rows = list(await repo.migrations(s))
        for m in rows:
            job = await repo.get_job(s, m.job_id, for_update=True)
            stops.append((m.dest_server, m.job_id, m.dest_incarnation))
            if job.state != JobState.MIGRATING.value:
                await repo.end_migration(s, m.job_id)
                continue
            if m.step < 0:
                await repo.end_migration(s, m.job_id)
                await _roll_back(s, job, now, f"migration to {m.dest_server} rolled back after a scheduler restart "
                                 f"(phase {m.phase})", suspended=m.was_state == JobState.SUSPENDED.value)
            else:
                stops.append((m.source_server, m.job_id, m.fallback_incarnation))
                resume = await repo.resume_from_migration(s, job, m)
                why, fence = f"scheduler restarted mid-migration (phase {m.phase}); {resume}", 0.0
                if m.phase == "activate":
                    # Its destination may have been told to train: this scheduler cannot
                    # know. It was placed again at the first round, beside that copy until
                    # the destination's helper or runtime reconnected and was told to stop
                    # it; it waits, as a launch that did not answer, for that lease to run out.
                    fence = now + core.settings.down_after_s
                    why += f"; waiting {fence - now:.0f}s for {m.dest_server}'s lease to run out"
                await core.requeue_fenced(s, job, now, why, fence)
            repo.add_event(s, now, "job.migration", f"recovered after restart from phase {m.phase}", job_id=m.job_id)
        # MIGRATING with no durable row: a database from before 0002_fencing_migrations,
        # upgraded while a migration was in flight. It stayed MIGRATING for good (no
        # command, no policy move, none of its progress shown as running); rolled back as
        # a migration before its checkpoint is: to where it runs (its exit or loss, if it
        # stopped, re-queues it), or to the queue when it holds no GPU.
        orphans = list(await s.scalars(select(Job).where(
            Job.state == JobState.MIGRATING.value, Job.id.not_in(select(Migration.job_id))).with_for_update()))
        for job in orphans:
            why = "a migration with no record of its own (a database from before they were kept) rolled back " \
                  "after a scheduler restart"
            if (await repo.placements_of(s, [job.id])).get(job.id):
                await _roll_back(s, job, now, why, suspended=False)
            else:
                await repo.requeue(s, job, now, why)
    for server, job_id, incarnation in stops:
        core.stop_on(server, job_id, incarnation, "migration abandoned by a scheduler restart")
    if rows or orphans:
        core.poke()
    return [m.job_id for m in rows] + [job.id for job in orphans]
