"""Schema migrations through alembic, callable from a running event loop.

The migration scripts live in ``alembic/`` at the repository root; the package
ships them as ``scheduler/state/alembic`` (a link to that folder) so that an
installed wheel can migrate too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from alembic import command

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"


class Refused(ValueError):
    """A migration refused, nothing changed; the message says why and what to do."""


class SchemaTooNew(Refused):
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

    async with migration_connection(engine) as conn:
        await conn.run_sync(in_sync)


class UnknownStates(Refused):
    """Jobs in states this code does not know: a newer gandiva (or a hand edit) wrote them."""


async def check_states(engine: AsyncEngine, known: frozenset[str]) -> None:
    """UnknownStates when a job's state is none of ``known``. States are text, so a newer
    gandiva's (this one run again after a rollback, its schema unchanged) or a hand edit's
    were taken, and every listing of jobs then failed on them (INTERNAL, for every caller)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT state, COUNT(*), MIN(id) FROM jobs GROUP BY state"))).all()
    odd = [(state, count, job) for state, count, job in rows if state not in known]
    if odd:
        said = "; ".join(f"{state!r} ({count} job{'s' if count > 1 else ''}, e.g. {job})" for state, count, job in odd)
        raise UnknownStates(
            f"the database holds jobs in states this gandiva does not know: {said}. A newer gandiva (or a "
            "hand edit) wrote them, and every listing of jobs would fail on them. Nothing was changed. Run "
            "that newer gandiva (its `gandiva kill` ends such jobs), or restore a backup this version wrote")


class BrokenReferences(Refused):
    """A migration would have left rows that point at rows which do not exist."""


@asynccontextmanager
async def migration_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose work is one transaction, committed when the block ends.

    On SQLite, with foreign-key enforcement off while it runs: SQLite cannot alter most
    of a table in place, so alembic's batch mode copies it and drops the old one, and
    with foreign keys on, dropping `jobs` cascaded into every row that refers to a job.
    An upgrade of a database from the first revision deleted every placement, state
    transition and profile (0004 adds a boolean column: a copy), so running jobs had no
    GPUs and no history. SQLite's own procedure for such changes: keys off outside the
    transaction, `PRAGMA foreign_key_check` before the commit, keys on again."""
    async with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:  # a no-op inside a transaction: set on the driver's connection first
            await conn.run_sync(_foreign_keys, False)
        try:
            async with conn.begin():
                before = await conn.run_sync(_revision) if sqlite else None
                yield conn
                # Checked only when a migration ran: a row left broken earlier must not stop
                # every later start of the scheduler.
                if sqlite and await conn.run_sync(_revision) != before:
                    broken = (await conn.exec_driver_sql("PRAGMA foreign_key_check")).all()
                    if broken:
                        table, row, parent = tuple(broken[0])[:3]
                        raise BrokenReferences(
                            f"the migration would leave {len(broken)} row(s) referring to rows that do "
                            f"not exist (first: table {table}, row {row}, missing in {parent}); nothing "
                            "was changed. List them with `sqlite3 FILE 'PRAGMA foreign_key_check'`, "
                            "delete or mend them (or restore a backup), then upgrade again")
        finally:
            if sqlite:
                await conn.run_sync(_foreign_keys, True)


def _revision(sync_conn: Connection) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


def _foreign_keys(sync_conn: Connection, on: bool) -> None:
    """SQLite's foreign-key enforcement on this connection (outside any transaction)."""
    cur = sync_conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cur.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    finally:
        cur.close()
