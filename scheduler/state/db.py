"""The database, chosen in one place from its URL.

``sqlite+aiosqlite:///PATH`` is the embedded default; ``postgresql+asyncpg://...``
is for production. Everything else goes through :func:`make_engine`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from scheduler.errors import InvalidArgument

T = TypeVar("T")

SUPPORTED = ("sqlite+aiosqlite", "postgresql+asyncpg")


def make_engine(url: str, readonly: bool = False, **kwargs: Any) -> AsyncEngine:
    """An async engine configured as a long-running server needs it.

    ``readonly``: for SQLite, an engine whose transactions begin DEFERRED, for reads
    that must not queue behind the single writer (WAL lets them run alongside it).
    """
    parsed = make_url(url)
    if parsed.drivername not in SUPPORTED:
        raise InvalidArgument(
            "db", f"unsupported database URL {parsed.drivername!r}; use one of {', '.join(SUPPORTED)}"
        )
    if parsed.drivername.startswith("sqlite"):
        return _sqlite_engine(url, parsed.database, immediate=not readonly, **kwargs)
    # pool_pre_ping: after the database restarts, stale pooled connections are
    # replaced instead of failing the next request. 20 kept: under load (100 helpers'
    # heartbeats, progress batches, rounds, users) fewer made overflow connections be
    # opened and closed again all the time (benchmarks/control_plane_load.py).
    return create_async_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=10, **kwargs)


def _sqlite_engine(url: str, database: str | None, immediate: bool = True, **kwargs: Any) -> AsyncEngine:
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)
    _configure_sqlite(engine.sync_engine, immediate)
    return engine


class SqliteWriter:
    """A synchronous SQLite connection for the write hot path, used from one thread.

    Configured like the async engine's connections (WAL, busy timeout, foreign keys)
    and its transactions begin IMMEDIATE. The caller serialises writers (the core's
    write lock), so it never waits on SQLite's busy handler.
    """

    def __init__(self, database: str) -> None:
        # check_same_thread=False: the connection is opened and used on the writer
        # thread, but closed at shutdown from wherever dispose runs.
        self._engine = create_engine(
            f"sqlite:///{database}", poolclass=NullPool, connect_args={"check_same_thread": False, "timeout": 30}
        )
        _configure_sqlite(self._engine, immediate=True)
        self._conn: Connection | None = None

    def call(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in one transaction; its result."""
        if self._conn is None:
            self._conn = self._engine.connect()
        try:
            with self._conn.begin():
                return fn(self._conn)
        except Exception:
            # A broken connection is replaced on the next call.
            self._conn.close()
            self._conn = None
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()


class SqliteReader:
    """Sync SQLite sessions for the busiest reads (a job's detail, a scheduling round's
    rows), each run whole on one of a few reader threads: one hop off the event loop
    instead of one per statement and fetch. Transactions begin DEFERRED: in WAL mode
    they read a consistent state alongside the writer."""

    THREADS = 2

    def __init__(self, database: str) -> None:
        self._engine = create_engine(
            f"sqlite:///{database}", pool_size=self.THREADS, max_overflow=0,
            connect_args={"check_same_thread": False, "timeout": 30},
        )
        _configure_sqlite(self._engine, immediate=False)
        self.threads = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="gandiva-sqlite-reader")

    def call(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in one read transaction (on a reader thread); its result.
        Objects it returns stay readable (they are not expired)."""
        with Session(self._engine, expire_on_commit=False) as session, session.begin():
            return fn(session)

    def close(self) -> None:
        self.threads.shutdown(wait=True)
        self._engine.dispose()


def execute_all(conn: Connection, statements: list[tuple[Any, list[dict[str, Any]]]]) -> None:
    """Execute (statement, parameters) pairs on ``conn`` (in its transaction)."""
    for stmt, params in statements:
        conn.execute(stmt, params)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def _configure_sqlite(engine: Engine, immediate: bool) -> None:
    """Connection settings for a server that keeps its state in SQLite."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see _on_begin).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # WAL: readers never block the writer and vice versa.
        cur.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL is durable across a crash of the scheduler process
        # (only an OS crash can lose the last commits) and is several times faster.
        cur.execute("PRAGMA synchronous=NORMAL")
        # Wait for a competing writer instead of failing at once with "database is locked".
        cur.execute("PRAGMA busy_timeout=10000")
        # SQLite ignores foreign keys unless asked; our cascades rely on them.
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # IMMEDIATE takes the write lock at BEGIN: a read-then-write transaction
        # can never fail half-way with SQLITE_BUSY when another writer commits first.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    # expire_on_commit=False: rows stay readable after commit, without a reload round trip.
    return async_sessionmaker(engine, expire_on_commit=False)
