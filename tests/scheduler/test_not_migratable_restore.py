"""A job found not migratable cannot resume from a checkpoint: a restore point it got
before the verdict is dropped (found with transformer.py --dropout through the real CLI:
a periodic checkpoint at its step 1, before its first steps were judged, was resumed from
after its server was lost, and the job ended with other weights than an uninterrupted run)."""

from __future__ import annotations

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore, Settings
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine


async def test_a_job_found_not_migratable_drops_the_restore_point_it_had(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    core = SchedulerCore(engine, Settings())
    try:
        await migrate.upgrade(engine)
        job_id = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
        async with core.tx() as s:
            job = await repo.get_job(s, job_id)
            job.restore_checkpoint, job.restore_server, job.restore_step = "/shm/h1/j/periodic-1", "h1", 1
        await core.record_migratability(job_id, "", True, "")
        async with core.tx() as s:
            assert (await repo.get_job(s, job_id)).restore_checkpoint == "/shm/h1/j/periodic-1"
        await core.record_migratability(job_id, "", False, "its training run reads RandomUniform op 'dropout'")
        async with core.tx() as s:
            job = await repo.get_job(s, job_id)
            assert (job.restore_checkpoint, job.restore_server, job.restore_step) == ("", "", 0)
            assert not job.migratable
        events = await core.list_events(job_id=job_id)
        assert any(e.kind == "job.checkpoint" and "dropped: the job is not migratable" in e.message
                   and "step 1" in e.message for e in events), [e.message for e in events]
    finally:
        await core.dispose()
        await engine.dispose()
