"""Alembic: one head; upgrade/downgrade/upgrade with data present; the migrated
schema equals the ORM metadata. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

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
