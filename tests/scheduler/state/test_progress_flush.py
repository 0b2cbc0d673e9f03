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
