"""Schema migrations through alembic, callable from a running event loop.

The migration scripts live in ``alembic/`` at the repository root; the package
ships them as ``scheduler/state/alembic`` (a link to that folder) so that an
installed wheel can migrate too.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from alembic import command

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"


class SchemaTooNew(ValueError):
    """The database's schema revision is not one of this code's: a newer gandiva made it."""


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    return cfg


def heads() -> list[str]:
    return list(ScriptDirectory.from_config(alembic_config()).get_heads())


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    await _run(engine, lambda cfg: command.upgrade(cfg, revision))


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    await _run(engine, lambda cfg: command.downgrade(cfg, revision))


async def current(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync_conn: MigrationContext.configure(sync_conn).get_current_revision()
        )


def check_known(sync_conn: Connection, cfg: Config) -> None:
    """SchemaTooNew when the database is at a revision this code does not have (the
    software was downgraded below the schema): nothing is run on it then."""
    at = MigrationContext.configure(sync_conn).get_current_heads()
    script = ScriptDirectory.from_config(cfg)
    known = {rev.revision for rev in script.walk_revisions()}
    unknown = [rev for rev in at if rev not in known]
    if unknown:
        head = script.get_current_head()
        raise SchemaTooNew(
            f"the database's schema is at revision {', '.join(unknown)}, which this gandiva "
            f"(schema {head}) does not know: a newer gandiva has upgraded it. Nothing was changed. "
            f"Run that newer gandiva, or first move the database back with the newer version's "
            f"`gandiva db downgrade {head}`")


async def _run(engine: AsyncEngine, action) -> None:  # type: ignore[no-untyped-def]
    def in_sync(sync_conn: Connection) -> None:
        cfg = alembic_config()
        check_known(sync_conn, cfg)
        cfg.attributes["connection"] = sync_conn
        action(cfg)

    async with engine.begin() as conn:
        await conn.run_sync(in_sync)
