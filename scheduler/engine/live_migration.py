"""Live migration: the scheduler's side of scheduler/engine/migration.py.

It implements MigrationPorts over the helper and runtime streams, moves the job
to MIGRATING for the duration, and records the outcome (placement, incarnation,
state) in one transaction at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from protos.gandiva.v1 import helper_pb2, runtime_pb2
from scheduler.core import spec_of
from scheduler.engine.migration import Endpoint, MigrationPlan, Outcome, migrate
from scheduler.errors import FailedPrecondition
from scheduler.lifecycle import JobState
from scheduler.policy.types import GpuRef
from scheduler.state import repo

if TYPE_CHECKING:
    from scheduler.engine.live import LiveEngine

log = logging.getLogger(__name__)


class LivePorts:
    def __init__(self, engine: LiveEngine) -> None:
        self.core = engine.core

    async def helper_command(
        self, server: str, command: helper_pb2.HelperCommand, timeout_s: float
    ) -> helper_pb2.HelperCommandResult:
        return await self.core.helpers.call(server, command, timeout_s)

    async def runtime_command(
        self, job_id: str, incarnation: str, command: runtime_pb2.RuntimeCommand, timeout_s: float
    ) -> runtime_pb2.CommandAck:
        return await self.core.runtimes.send(job_id, command, timeout_s, incarnation)

    async def record_phase(self, job_id: str, phase: str, seconds: float, detail: str) -> None:
        async with self.core.tx() as s:
            msg = f"{phase} {seconds:.3f}s" + (f" ({detail})" if detail else "")
            repo.add_event(s, self.core.clock(), "job.migration", msg, job_id=job_id)


async def run_migration(engine: LiveEngine, job_id: str, to_gpus: Sequence[GpuRef], reason: str) -> None:
    await (await begin_migration(engine, job_id, to_gpus, reason))


async def begin_migration(
    engine: LiveEngine, job_id: str, to_gpus: Sequence[GpuRef], reason: str
) -> Coroutine[Any, Any, None]:
    """Move the job to MIGRATING (one transaction) and return the coroutine that
    carries the migration out and records its outcome."""
    core = engine.core
    async with core.tx() as s:
        job = await repo.get_job(s, job_id, for_update=True)
        if not job.migratable:
            raise FailedPrecondition(f"job {job_id} is not migratable")
        placement = (await repo.placements_of(s, [job_id])).get(job_id, [])
        if not placement:
            raise FailedPrecondition(f"job {job_id} has no placement to migrate from")
        was = JobState(job.state)
        src_name, dest_name = placement[0].server_name, to_gpus[0].server
        src, dst = await repo.get_server(s, src_name), await repo.get_server(s, dest_name)
        await repo.transition(s, job, JobState.MIGRATING, core.clock(), f"{reason}: {src_name} -> {dest_name}")
        plan = MigrationPlan(
            job_id=job_id,
            spec=spec_of(job),
            source=Endpoint(src.name, src.address, src.ramdisk, src.shared_root),
            source_incarnation=job.incarnation,
            source_gpus=tuple(p.gpu_index for p in placement if p.server_name == src_name),
            dest=Endpoint(dst.name, dst.address, dst.ramdisk, dst.shared_root),
            dest_gpus=tuple(g.index for g in to_gpus if g.server == dest_name),
            warm_signature=core.runtimes.train_signature(job_id, job.incarnation),
        )
    return _carry_out(engine, plan, was, list(to_gpus))


async def _carry_out(engine: LiveEngine, plan: MigrationPlan, was: JobState, to_gpus: list[GpuRef]) -> None:
    core = engine.core
    job_id, dest_name = plan.job_id, plan.dest.name
    failure = ""
    try:
        result = await migrate(plan, LivePorts(engine))
    except Exception as err:  # a bug in the orchestration must not leave the job MIGRATING
        log.exception("migration of %s crashed", job_id)
        result = None
        failure = f"migration crashed: {err}"
    now = core.clock()
    async with core.tx() as s:
        job = await repo.get_job(s, job_id, for_update=True)
        if job.state != JobState.MIGRATING.value:
            return  # killed meanwhile
        if result is None or result.outcome is Outcome.FAILED:
            why = failure if result is None else result.reason
            if result is not None and result.step >= 0 and result.checkpoint_path:
                # Never silently from step 0: the next launch on that server restores it.
                job.restore_checkpoint = result.checkpoint_path
                job.restore_server = plan.source.name
                why += f"; will resume from step {result.step} when placed on {plan.source.name}"
            await repo.transition(s, job, JobState.QUEUED, now, f"migration failed, re-placing: {why}")
            await repo.clear_placement(s, job_id)
        elif result.outcome is Outcome.MIGRATED:
            job.incarnation = result.incarnation
            await repo.set_placement(s, job_id, [(g.server, g.index) for g in to_gpus])
            paused = result.durations_s.get("total", 0.0)
            await repo.transition(
                s, job, JobState.RUNNING, now,
                f"migrated to {dest_name} at step {result.step} (training paused {paused:.2f}s)",
            )
        else:
            job.incarnation = result.incarnation
            back = JobState.SUSPENDED if (was is JobState.SUSPENDED and result.outcome is Outcome.STAYED) else JobState.RUNNING
            if back is JobState.SUSPENDED:
                # MIGRATING -> RUNNING -> SUSPENDED keeps the state machine's rules in one place.
                await repo.transition(s, job, JobState.RUNNING, now, result.reason)
                await repo.transition(s, job, JobState.SUSPENDED, now, "still suspended")
            else:
                await repo.transition(s, job, JobState.RUNNING, now, f"{result.outcome.value}: {result.reason}")
    core.poke()
