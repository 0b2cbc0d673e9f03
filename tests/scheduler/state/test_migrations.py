"""Alembic: one head; upgrade/downgrade/upgrade with data present; the migrated
schema equals the ORM metadata. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from scheduler.state import migrate
from scheduler.state.db import make_engine
from scheduler.state.models import Base


def test_exactly_one_head() -> None:
    assert len(migrate.heads()) == 1


async def test_migrated_schema_equals_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata
                )
            )
        assert diff == [], f"schema differs from the models: {diff}"
    finally:
        await engine.dispose()


async def test_upgrade_downgrade_upgrade_with_data(db_url: str) -> None:
    from protos.gandiva.v1 import common_pb2
    from scheduler.core import SchedulerCore

    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine)
        core = SchedulerCore(engine)
        await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))
        assert await migrate.current(engine) == migrate.heads()[0]
        await migrate.downgrade(engine, "base")
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: c.dialect.get_table_names(c))
        assert "jobs" not in tables
        await migrate.upgrade(engine)
        await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=2))
        async with engine.connect() as conn:
            assert (await conn.execute(text("select count(*) from jobs"))).scalar() == 1
        assert await migrate.current(engine) == migrate.heads()[0]
    finally:
        await engine.dispose()


async def test_host_memory_revision_keeps_servers_and_profiles(db_url: str) -> None:
    """0006_host_memory down and up again with a server and a profile present: the rows stay,
    the new columns go and come back as 0 (unknown, not measured)."""
    from protos.gandiva.v1 import common_pb2, helper_pb2
    from scheduler.core import SchedulerCore
    from scheduler.state import repo

    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine)
        core = SchedulerCore(engine)
        await core.register_server(helper_pb2.RegisterServerRequest(
            name="s1", gpus=[common_pb2.Gpu(index=0)], host_memory_bytes=64 << 30))
        job_id = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
        async with core.tx() as s:
            await repo.upsert_profile(s, job_id, 1.0, memory_max=1 << 30, host_memory_bytes=5 << 30)
        await migrate.downgrade(engine, "0005_i9rt")

        def columns(c, table: str) -> set[str]:  # type: ignore[no-untyped-def]
            return {col["name"] for col in c.dialect.get_columns(c, table)}

        async with engine.connect() as conn:
            assert "host_memory_bytes" not in await conn.run_sync(columns, "servers")
            assert "host_memory_bytes" not in await conn.run_sync(columns, "job_profiles")
            assert (await conn.execute(text("select memory_max from job_profiles"))).scalar() == 1 << 30
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            assert (await conn.execute(text("select host_memory_bytes from servers"))).scalar() == 0
            assert (await conn.execute(text("select host_memory_bytes, memory_max from job_profiles"))).one() == (0, 1 << 30)
        await core.dispose()
    finally:
        await engine.dispose()



async def _set_revision(engine, revision: str) -> None:  # type: ignore[no-untyped-def]
    async with engine.begin() as conn:
        await conn.execute(text("update alembic_version set version_num = :r"), {"r": revision})


async def test_database_from_a_newer_gandiva_is_refused_untouched(db_url: str) -> None:
    """A schema revision this code does not have (the software was downgraded): every
    migration refuses it naming the revision and what to do, and changes nothing."""
    import pytest

    from protos.gandiva.v1 import common_pb2
    from scheduler.core import SchedulerCore

    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine)
        core = SchedulerCore(engine)
        await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))
        await _set_revision(engine, "0099_from_the_future")
        for step in (migrate.upgrade(engine), migrate.downgrade(engine, "base")):
            with pytest.raises(migrate.SchemaTooNew, match="0099_from_the_future.*newer gandiva"):
                await step
        assert await migrate.current(engine) == "0099_from_the_future"
        async with engine.connect() as conn:
            assert (await conn.execute(text("select count(*) from jobs"))).scalar() == 1
    finally:
        await engine.dispose()


def test_scheduler_refuses_a_newer_schema_in_one_line(sqlite_url: str) -> None:
    """`gandiva scheduler` on a database a newer gandiva upgraded: exit 2, one line naming
    --db, the revision and what to do; no traceback."""
    import asyncio
    import subprocess
    import sys

    async def prepare() -> None:
        engine = make_engine(sqlite_url)
        try:
            await migrate.upgrade(engine)
            await _set_revision(engine, "0099_from_the_future")
        finally:
            await engine.dispose()

    asyncio.run(prepare())
    done = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0", "--db", sqlite_url],
        check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "0099_from_the_future" in done.stderr and "gandiva db downgrade" in done.stderr
    assert "gandiva scheduler: --db " in done.stderr


async def test_upgrade_from_the_first_revision_keeps_every_job(db_url: str) -> None:
    """A database made at the first revision, with a queued, a running, a suspended and a
    finished job, upgraded to head: every job keeps its state, GPUs, history and profile,
    and so on the way down to the first revision and up again. On SQLite, 0004 copied
    the jobs table (batch mode) and dropping the old one cascaded: every placement,
    transition and profile was deleted. Foreign keys are enforced again afterwards. A job
    MIGRATING then (no migration row existed yet) is rolled back to where it runs when the
    scheduler starts; it used to stay MIGRATING for good."""
    from sqlalchemy.exc import IntegrityError

    from scheduler.core import SchedulerCore
    from scheduler.engine.live_migration import recover_migrations

    engine = make_engine(db_url)
    states = {"j0": "QUEUED", "j1": "RUNNING", "j2": "SUSPENDED", "j3": "COMPLETED", "j4": "MIGRATING"}
    gpu_of = {"j1": 0, "j2": 1, "j4": 2}
    try:
        await migrate.upgrade(engine, "0001")
        async with engine.begin() as conn:
            await conn.execute(text("insert into servers values ('s1', '127.0.0.1:1', 3, '/dev/shm', '/tmp', "
                                    "true, 1, 1)"))
            for i in (0, 1, 2):
                await conn.execute(text("insert into gpus values ('s1', :i, 'u', 'm', 1, 0, 0, 0)"), {"i": i})
            for job_id, state in states.items():
                await conn.execute(text(
                    "insert into jobs values (:id, 'n', '[\"python\", \"t.py\"]', '/tmp', '{}', 1, 1, false, 'u', "
                    "NULL, 0, '{}', :state, 'inc', 5, 1.0, 0.1, '{}', true, false, '', 0, 1, 1, 1, 1, 0, 0)"),
                    {"id": job_id, "state": state})
                await conn.execute(text("insert into transitions (job_id, from_state, to_state, at, reason) "
                                        "values (:id, 'QUEUED', :state, 1, 'before the upgrade')"),
                                   {"id": job_id, "state": state})
                await conn.execute(text("insert into job_profiles values (:id, 1024, 512, 0.5, 0.1, 1)"),
                                   {"id": job_id})
            for job_id, gpu in gpu_of.items():
                await conn.execute(text("insert into placements values (:id, 's1', :gpu)"), {"id": job_id, "gpu": gpu})

        async def kept() -> None:
            core = SchedulerCore(engine)
            try:
                for job_id, state in states.items():
                    detail = await core.get_job(job_id)
                    assert detail.job.state == state
                    assert detail.placement == ([("s1", gpu_of[job_id])] if job_id in gpu_of else [])
                    assert [t.reason for t in detail.history][:1] == ["before the upgrade"], job_id
            finally:
                await core.dispose()
            async with engine.connect() as conn:
                assert (await conn.execute(text("select count(*) from job_profiles"))).scalar() == len(states)

        await migrate.upgrade(engine)
        await kept()
        core = SchedulerCore(engine)
        try:
            assert await recover_migrations(core) == ["j4"]
            assert "rolled back" in (await core.get_job("j4")).history[-1].reason
        finally:
            await core.dispose()
        states["j4"] = "RUNNING"
        await kept()
        await migrate.downgrade(engine, "0001")
        await migrate.upgrade(engine)
        await kept()
        with pytest.raises(IntegrityError):  # enforced again on the connection the migration used
            async with engine.begin() as conn:
                await conn.execute(text("insert into placements values ('no-such-job', 's1', 0)"))
    finally:
        await engine.dispose()


def test_upgrade_that_would_leave_broken_rows_changes_nothing(sqlite_url: str, gandiva) -> None:  # type: ignore[no-untyped-def]
    """SQLite runs migrations with foreign keys off (so that a table's copy does not
    cascade); a placement of a job that is not there, left by an older writer, is found
    before the commit: `gandiva db upgrade` exits 2 with one line saying what and that
    nothing changed, and the database stays at its revision."""
    import asyncio
    import sqlite3

    async def at_0003() -> None:
        engine = make_engine(sqlite_url)
        try:
            await migrate.upgrade(engine, "0003_auth_tokens")
        finally:
            await engine.dispose()

    asyncio.run(at_0003())
    path = sqlite_url.split("///", 1)[1]
    with sqlite3.connect(path) as conn:  # foreign keys off: SQLite's default
        conn.execute("insert into servers values ('s1', '', 1, '', '', 1, 1, 1)")
        conn.execute("insert into placements values ('gone', 's1', 0)")
    up = gandiva("db", "--db", sqlite_url, "upgrade")
    assert up.returncode == 2, up
    assert "placements" in up.stderr and "nothing was changed" in up.stderr and len(up.stderr.splitlines()) == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("select version_num from alembic_version").fetchall() == [("0003_auth_tokens",)]
