"""Alembic environment for Gandiva: one migration history for SQLite and PostgreSQL.

The scheduler runs migrations through scheduler.state.migrate, which hands a live
connection in ``config.attributes["connection"]``; the ``alembic`` command line
works too, taking the URL from ``-x db=URL`` or GANDIVA_DB.
"""

from __future__ import annotations

import asyncio
import os

from sqlalchemy.engine import Connection

from alembic import context
from scheduler.config import default_db_url
from scheduler.state.db import make_engine
from scheduler.state.models import Base

target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online(url: str) -> None:
    from scheduler.state.migrate import migration_connection

    engine = make_engine(url)
    async with migration_connection(engine) as conn:  # on SQLite, no cascades from batch copies
        await conn.run_sync(_configure)
    await engine.dispose()


def main() -> None:
    conn = context.config.attributes.get("connection")
    if conn is not None:
        _configure(conn)
        return
    url = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get(
        "GANDIVA_DB", default_db_url()
    )
    asyncio.run(_run_online(url))


main()
