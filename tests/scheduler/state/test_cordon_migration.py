"""0009_cordon on a database with data: `gandiva db upgrade` from 0008 keeps every server,
GPU and placement (servers come out uncordoned), and downgrades (its own, and down to 0005)
drop the columns without taking a server's GPUs or placements with it. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.state import migrate
from scheduler.state.db import make_engine


async def _rows(engine) -> tuple:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return tuple([(await conn.execute(text(f"select count(*) from {t}"))).scalar() for t in
                      ("servers", "gpus", "jobs", "placements")])


@pytest.mark.parametrize("back_to", ["0008_progress", "0005_i9rt"])
async def test_upgrade_from_0008_keeps_servers_and_placements_and_back(db_url: str, back_to: str) -> None:
    """Down to 0005 too: 0006's downgrade copied the servers table on SQLite (batch mode),
    and every server's GPUs and placements went with the old table."""
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine, "0008_progress")
        async with engine.begin() as conn:
            await conn.execute(text(
                "insert into servers (name, address, num_gpus, ramdisk, shared_root, up, registered_at, "
                "last_heartbeat, host_memory_bytes) values ('s1', '', 2, '', '', true, 1, 1, 0)"))
            await conn.execute(text("insert into gpus (server_name, index, uuid, model, memory_total, memory_used, "
                                    "utilization, sampled_at) values ('s1', 0, '', 'v', 0, 0, 0, 0), "
                                    "('s1', 1, '', 'v', 0, 0, 0, 0)".replace("index", '"index"')))
        core = SchedulerCore(engine)  # jobs are as at 0008: a submission writes one
        job_id = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
        async with engine.begin() as conn:
            await conn.execute(text("insert into placements (job_id, server_name, gpu_index) values (:j, 's1', 1)"),
                               {"j": job_id})
        before = await _rows(engine)
        assert before == (1, 2, 1, 1)
        await migrate.upgrade(engine)
        assert await _rows(engine) == before
        async with engine.begin() as conn:
            # 0010_gpu_holds: the GPU held at the upgrade begins the GPUs' history, open (held now),
            # from its job's last placement (none recorded here: its last state change).
            held = (await conn.execute(text("select h.job_id, h.server_name, h.gpu_index, h.end_at, "
                                            "h.start_at = j.state_changed_at from gpu_holds h join jobs j "
                                            "on j.id = h.job_id"))).all()
            assert [tuple(r) for r in held] == [(job_id, "s1", 1, None, True)], held
            row = (await conn.execute(text("select cordoned, cordoned_at, cordon_reason, draining from servers"))).one()
            assert (bool(row[0]), row[1], row[2], bool(row[3])) == (False, 0, "", False)
            await conn.execute(text("update servers set cordoned = true, cordon_reason = 'fan'"))
        await migrate.downgrade(engine, back_to)
        assert await _rows(engine) == before, "the downgrade took a server's GPUs or placements with it"
        await migrate.upgrade(engine)
        assert await _rows(engine) == before
        assert await migrate.current(engine) == migrate.heads()[0]
    finally:
        await engine.dispose()
