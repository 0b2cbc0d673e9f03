"""A progress report that arrives while the previous batch is being written is still
stored, without waiting for some later report (found by benchmarks/control_plane_load.py:
the last report of each job stayed in memory)."""

from __future__ import annotations

import asyncio

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore, Settings
from scheduler.state import migrate
from scheduler.state.db import make_engine


async def test_a_report_during_a_flush_is_flushed_too(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    core = SchedulerCore(engine, Settings(progress_flush_s=0.05))
    try:
        await migrate.upgrade(engine)
        job = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job
        assert core._write_lock is not None
        async with core._write_lock:  # the flush of the first report waits on the writer
            await core.record_progress(job.id, "", 1, 1.0, 1.0, {})
            await asyncio.sleep(0.3)
            await core.record_progress(job.id, "", 2, 1.0, 1.0, {})
        for _ in range(40):
            await asyncio.sleep(0.05)
            if (await core.get_job(job.id)).job.steps == 2:
                break
        assert (await core.get_job(job.id)).job.steps == 2
    finally:
        await core.dispose()
        await engine.dispose()


async def test_a_batch_stores_each_jobs_current_launch_only_and_merges_metrics(db_url: str) -> None:
    """The batched write (two plain UPDATEs per flush, on SQLite and PostgreSQL): steps
    never go back, an older launch's report changes nothing, metrics merge per job."""
    from scheduler.state import repo

    engine = make_engine(db_url)
    core = SchedulerCore(engine, Settings(progress_flush_s=60))  # flushed by hand below
    try:
        await migrate.upgrade(engine)
        ids = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id for _ in range(3)]
        async with core.tx() as s:
            for job_id in ids:
                (await repo.get_job(s, job_id)).incarnation = "now"
        a, b, c = ids
        await core.record_progress(a, "now", 10, 2.0, 0.5, {"loss": 1.0})
        await core.record_progress(b, "old", 99, 9.0, 9.0, {"loss": 9.0})  # a launch that is gone
        await core.record_progress(c, "now", 5, 1.0, 1.0, {})
        await core.flush_progress()
        await core.record_progress(a, "now", 7, 3.0, 0.25, {"acc": 0.5})  # fewer steps: a late report
        await core.record_progress(c, "now", 6, 1.5, 1.0, {})
        await core.flush_progress()
        got = {j: (await core.get_job(j)).job for j in ids}
        assert (got[a].steps, got[a].rate, got[a].last_step_s) == (10, 3.0, 0.25)
        assert got[a].metrics == {"loss": 1.0, "acc": 0.5}
        assert (got[b].steps, got[b].rate, got[b].metrics) == (0, 0.0, {})
        assert (got[c].steps, got[c].rate, got[c].metrics) == (6, 1.5, {})
    finally:
        await core.dispose()
        await engine.dispose()
