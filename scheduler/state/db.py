"""The database, chosen in one place from its URL.

``sqlite+aiosqlite:///PATH`` is the embedded default; ``postgresql+asyncpg://...``
is for production. Everything else goes through :func:`make_engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Connection, Engine, Executable, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from scheduler.errors import InvalidArgument
from scheduler.loops import new_event_loop

log = logging.getLogger(__name__)

T = TypeVar("T")

SUPPORTED = ("sqlite+aiosqlite", "postgresql+asyncpg")


def make_engine(url: str, readonly: bool = False, pin: SqliteFile | None = None, **kwargs: Any) -> AsyncEngine:
    """An async engine configured as a long-running server needs it.

    ``readonly``: for SQLite, an engine whose transactions begin DEFERRED, for reads
    that must not queue behind the single writer (WAL lets them run alongside it).
    ``pin``: for SQLite, the file another engine on it opened first (`SqliteFile`).
    """
    parsed = make_url(url)
    if parsed.drivername not in SUPPORTED:
        raise InvalidArgument(
            "db", f"unsupported database URL {parsed.drivername!r}; use one of {', '.join(SUPPORTED)}"
        )
    if parsed.drivername.startswith("sqlite"):
        return _sqlite_engine(url, parsed.database, immediate=not readonly, pin=pin, **kwargs)
    # pool_pre_ping: after the database restarts, stale pooled connections are
    # replaced instead of failing the next request. 20 kept: under load (100 helpers'
    # heartbeats, progress batches, rounds, users) fewer made overflow connections be
    # opened and closed again all the time (benchmarks/control_plane_load.py).
    kwargs["connect_args"] = pg_connect_args(parsed.query, kwargs.get("connect_args"))
    engine = create_async_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=10, **kwargs)
    watch_pg_connections(engine)
    return engine


# A PostgreSQL server that answers nothing (a network partition, its host cut off: packets
# dropped, not refused) is found out in seconds. Before, a connect waited 60 s (asyncpg's
# default) and a statement on a pooled connection until the kernel gave up retransmitting
# (about 15 min): `gandiva get job` hung, the scheduling rounds stopped without a word and
# `gandiva_database_up` stayed 1. A partition, not a slow database: a busy server's kernel
# still acknowledges what is sent and answers keepalives, so a long statement is not cut.
PG_CONNECT_TIMEOUT_S = 5.0
# Unacknowledged data or unanswered keepalives for this long: the connection is dead
# (TCP_USER_TIMEOUT; keepalive probes from 3 s of silence, every 1 s).
PG_DEAD_AFTER_S = 5
# The server's side of the same (PostgreSQL's own per-session settings): a session whose
# scheduler it can no longer reach ends within about 11 s instead of the kernel's 2 h,
# with its locks: a transaction that was open when the link dropped is rolled back, rather
# than holding its rows' locks (every later write to them waited) and the scheduler's
# advisory lock (scheduler.state.owner) while nobody can commit it.
PG_SERVER_SETTINGS = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                      "tcp_user_timeout": str(PG_DEAD_AFTER_S * 1000)}
# The earliest the server ends the session of a scheduler cut off from it, counted from when
# it last heard that session: its keepalives' idle time, or its user timeout on an answer in
# flight. Another scheduler can take the database no sooner (SchedulerCore.heartbeat_unrecorded).
PG_SESSION_END_MIN_S = min(float(PG_SERVER_SETTINGS["tcp_keepalives_idle"]), float(PG_DEAD_AFTER_S))


def pg_connect_args(query: Any, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """asyncpg's connect arguments for a scheduler's engine (``query``: the URL's, whose
    ``timeout`` wins): the connect timeout and PG_SERVER_SETTINGS under ``given``'s."""
    args = dict(given or {})
    if "timeout" not in query:
        args.setdefault("timeout", PG_CONNECT_TIMEOUT_S)
    args["server_settings"] = {**PG_SERVER_SETTINGS, **args.get("server_settings", {})}
    return args


def watch_tcp(sock: Any) -> None:
    """Keepalives and a user timeout of PG_DEAD_AFTER_S on a TCP socket (a Unix socket is
    left alone: it cannot be partitioned)."""
    import socket

    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, PG_DEAD_AFTER_S - 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, PG_DEAD_AFTER_S * 1000)


def watch_asyncpg(conn: Any) -> None:
    """`watch_tcp` on an asyncpg connection's socket."""
    transport = getattr(conn, "_transport", None)  # (asyncpg gives no public way to its socket)
    watch_tcp(transport.get_extra_info("socket") if transport is not None else None)


def watch_pg_connections(engine: AsyncEngine) -> None:
    """Every connection ``engine`` opens gets `watch_tcp`."""
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        watch_asyncpg(dbapi_conn.driver_connection)


def file_identity(path: str | Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode); None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class SqliteFile:
    """The database file a scheduler's connections are opened on, pinned by the first one.

    SQLite opens whatever file has the name when a connection is made, and makes an
    empty one when there is none. A connection that one of the scheduler's pools (the
    async engines', the writer's, the readers') opened after the file was deleted or
    replaced under it made a new empty database at the name ("no such table: jobs"),
    or, on another file put there, reset the shared index of the write-ahead log the
    scheduler's state was in (the copy it then saved held no job). So only the first
    connection may make the file (a new database's first start); every later one opens
    it read-write only (SQLite's URI ``mode=rw``: never created) and is closed, before
    it reads anything, unless it is the file the first one opened (device and inode):
    an OperationalError, which a request reports as UNAVAILABLE, retry shortly, while
    the scheduler's watch (scheduler.state.owner.SqliteFileWatch) stops it and saves
    its state. One per scheduler, shared by all its engines (`sqlite_file`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def connect_args(self, cargs: list[Any], cparams: dict[str, Any]) -> None:
        """The arguments of ``sqlite3.connect``: once pinned, the file read-write only."""
        if self.identity is not None:
            cargs[0] = f"file:{quote(os.path.abspath(self.path))}?mode=rw"
            cparams["uri"] = True

    def opened(self) -> None:
        """Just after a connection was opened, before it reads: the first pins the file at
        the name; a later one raises OperationalError unless it is that file."""
        now = file_identity(self.path)
        with self._lock:
            if self.identity is None:
                self.identity = now
                return
        if now != self.identity:
            what = "deleted or moved away" if now is None else "replaced by another file"
            raise sqlite3.OperationalError(
                f"the database file {self.path} was {what} since the scheduler opened it: not opened")

    def connect(self) -> sqlite3.Connection:
        """A plain ``sqlite3`` connection, opened as the pools' are."""
        cargs: list[Any] = [self.path]
        cparams: dict[str, Any] = {"check_same_thread": False}
        self.connect_args(cargs, cparams)
        conn = sqlite3.connect(*cargs, **cparams)
        try:
            self.opened()
        except sqlite3.Error:
            conn.close()
            raise
        return conn


# The pin of each SQLite engine made here, for the other engines on its file (`sqlite_file`).
_PINS: weakref.WeakKeyDictionary[Engine, SqliteFile] = weakref.WeakKeyDictionary()


def sqlite_file(engine: AsyncEngine) -> SqliteFile | None:
    """The file `make_engine` pinned for ``engine`` (None: not a SQLite file)."""
    return _PINS.get(engine.sync_engine)


def _sqlite_engine(url: str, database: str | None, immediate: bool = True, pin: SqliteFile | None = None,
                   **kwargs: Any) -> AsyncEngine:
    path = database if database and database != ":memory:" else None  # a file's name
    if path is not None and (pin is None or pin.identity is None):  # (once opened, never made again: SqliteFile)
        parent = Path(path).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot make the database's directory {parent} ({exc.strerror}); "
                          "point GANDIVA_HOME or --db to a writable place") from None
        if not path.startswith("file:"):  # a URI names its file its own way
            _owner_only(Path(path))
    engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)
    if pin is None and path is not None and not path.startswith("file:"):
        pin = SqliteFile(path)  # (a URI names its file, and how to open it, its own way)
    _configure_sqlite(engine.sync_engine, immediate, pin)
    if pin is not None:
        _PINS[engine.sync_engine] = pin
    return engine


def _owner_only(path: Path) -> None:
    """The database holds every job's environment and the tokens' hashes (the keys of the
    runtime tokens and transfer tickets a helper's token stands behind): created readable
    by its owner only, and made so if it was readable by others (SQLite's -wal and -shm
    files take the database file's mode). Before, it was created 644 by the umask: any
    user of the scheduler's host read them."""
    with contextlib.suppress(OSError):  # not ours, or no such place: SQLite says why
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = part.stat().st_mode
            if mode & 0o077:
                part.chmod(mode & 0o700)
                log.warning("%s was readable by other users (every job's environment, the tokens' hashes); "
                            "it is now its owner's only (mode %o)", part, mode & 0o700)
        except OSError:
            continue


class SqliteWriter:
    """A synchronous SQLite connection for the write hot path, used from one thread.

    Configured like the async engine's connections (WAL, busy timeout, foreign keys)
    and its transactions begin IMMEDIATE. The caller serialises writers (the core's
    write lock), so it never waits on SQLite's busy handler.
    """

    def __init__(self, database: str, pin: SqliteFile | None = None) -> None:
        # check_same_thread=False: the connection is opened and used on the writer
        # thread, but closed at shutdown from wherever dispose runs.
        self._engine = create_engine(
            f"sqlite:///{database}", poolclass=NullPool, connect_args={"check_same_thread": False, "timeout": 30}
        )
        _configure_sqlite(self._engine, immediate=True, pin=pin or SqliteFile(database))
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


class WriteQueue:
    """One thread that runs writes one at a time, in two classes: urgent ones (a user
    waits for the answer: a submission) before bulk ones (heartbeats, progress batches,
    queueing reasons), so a submission does not queue behind a burst of heartbeats.
    Each class runs in the order it was queued. A bulk write is never starved: while
    one waits, at most ``URGENT_RUN`` urgent writes run before it. A ``barrier`` (bulk)
    runs only once every write queued before it, of either class, has run.

    ``submit`` returns a concurrent Future (``asyncio.wrap_future`` awaits it)."""

    URGENT_RUN = 4

    def __init__(self, name: str) -> None:
        self._urgent: deque[tuple[Future, Callable[[], Any]]] = deque()
        self._bulk: deque[tuple[Future, Callable[[], Any]]] = deque()
        self._barriers: set[Future] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T], urgent: bool = False, barrier: bool = False) -> Future[T]:
        fut: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the writer is shut down")
            if barrier:
                # Only urgent writes queued before it can be ahead of it in the thread's
                # order: the urgent queue is empty when it runs (see _next).
                self._barriers.add(fut)
            (self._urgent if urgent and not barrier else self._bulk).append((fut, fn))
            self._cond.notify()
        return fut

    def _next(self, streak: int) -> tuple[tuple[Future, Callable[[], Any]] | None, int]:
        """The next write to run (None: closed and drained), and the new urgent streak."""
        with self._cond:
            while not (self._urgent or self._bulk or self._closed):
                self._cond.wait()
            if self._urgent and (not self._bulk or streak < self.URGENT_RUN or self._bulk[0][0] in self._barriers):
                return self._urgent.popleft(), streak + 1
            if self._bulk and self._bulk[0][0] in self._barriers:
                self._barriers.discard(self._bulk[0][0])
            if self._bulk:
                return self._bulk.popleft(), 0
            return None, 0

    def _run(self) -> None:
        streak = 0
        while True:
            item, streak = self._next(streak)
            if item is None:
                return
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(err)

    def shutdown(self, wait: bool = True) -> None:
        """No more writes; those queued still run. ``wait``: until they have."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if wait:
            self._thread.join()


class SqliteReader:
    """Sync SQLite sessions for the busiest reads (a job's detail, a scheduling round's
    rows), each run whole on one of a few reader threads: one hop off the event loop
    instead of one per statement and fetch. Transactions begin DEFERRED: in WAL mode
    they read a consistent state alongside the writer."""

    THREADS = 2

    def __init__(self, database: str, pin: SqliteFile | None = None) -> None:
        self._engine = create_engine(
            f"sqlite:///{database}", pool_size=self.THREADS, max_overflow=0,
            connect_args={"check_same_thread": False, "timeout": 30},
        )
        _configure_sqlite(self._engine, immediate=False, pin=pin or SqliteFile(database))
        self.threads = ThreadPoolExecutor(max_workers=self.THREADS, thread_name_prefix="gandiva-sqlite-reader")

    def call(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in one read transaction (on a reader thread); its result.
        Objects it returns stay readable (they are not expired)."""
        with Session(self._engine, expire_on_commit=False) as session, session.begin():
            return fn(session)

    def close(self) -> None:
        self.threads.shutdown(wait=True)
        self._engine.dispose()


class LoopThread:
    """PostgreSQL's busiest reads and writes (heartbeats, progress batches, submissions,
    a job's detail, a scheduling round's rows), on an event loop of their own on one
    thread, through an engine of their own: one hop from the scheduler's event loop
    instead of one per statement, row batch and commit (asyncpg answers on the loop
    that made its connection; under load the scheduler's loop, busy with a thousand
    runtime streams, made every such hop wait its turn: most of a submission's time)."""

    def __init__(self, url: str, name: str = "gandiva-db", pool: int = 4, durable: bool = True) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        # Not durable: commits do not wait for the WAL to reach the disk (a crash of the
        # database may lose the last fraction of a second of them, never half of one).
        settings = {} if durable else {"server_settings": {"synchronous_commit": "off"}}
        self.engine = create_async_engine(url, pool_pre_ping=False, pool_size=pool, max_overflow=0,
                                          connect_args=pg_connect_args(make_url(url).query, settings))
        watch_pg_connections(self.engine)
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        # Reads without BEGIN and COMMIT round trips: at PostgreSQL's default isolation
        # (read committed) each statement sees the latest commits either way.
        self._reads = async_sessionmaker(self._autocommit, expire_on_commit=False)

    def _on_thread(self, make: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        async def run() -> T:
            try:
                return await make()
            except DBAPIError as err:
                # Pooled connections are not pinged before use (a round trip each time):
                # after the database restarted, the first use of a stale one fails and the
                # pool is replaced; the work is tried once more on a fresh connection. (A
                # dead connection never ran it; a repeated INSERT would only collide.)
                if not err.connection_invalidated:
                    raise
            return await make()
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._loop))

    async def write(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in one write transaction, on this thread's loop."""
        async def run() -> T:
            async with self.engine.begin() as conn:
                return await conn.run_sync(fn)
        return await self._on_thread(run)

    async def execute(self, stmt: Executable) -> None:
        """One statement, which PostgreSQL runs as a transaction of its own (no BEGIN
        and COMMIT round trips), on this thread's loop."""
        async def run() -> None:
            async with self._autocommit.connect() as conn:
                await conn.execute(stmt)
        await self._on_thread(run)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in one read transaction, on this thread's loop."""
        async def run() -> T:
            async with self._reads() as session:
                return await session.run_sync(fn)
        return await self._on_thread(run)

    async def close(self) -> None:
        """Work still running on this loop is cancelled (its callers get CancelledError),
        then its connections are closed and the thread ends."""
        async def shut() -> None:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await self.engine.dispose()

        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(shut(), self._loop))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._loop.close()


def execute_all(conn: Connection, statements: list[tuple[Any, list[dict[str, Any]]]]) -> None:
    """Execute (statement, parameters) pairs on ``conn`` (in its transaction)."""
    for stmt, params in statements:
        conn.execute(stmt, params)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def _configure_sqlite(engine: Engine, immediate: bool, pin: SqliteFile | None = None) -> None:
    """Connection settings for a server that keeps its state in SQLite. ``pin``: the
    file every connection but the first must be (`SqliteFile`)."""

    if pin is not None:
        @event.listens_for(engine, "do_connect")
        def _on_do_connect(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
            pin.connect_args(cargs, cparams)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        if pin is not None:
            pin.opened()  # before it reads: (the pool closes a connection refused here)
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


class bytewise(ColumnElement[Any]):
    """``column`` to sort by in code-point order on both databases: ``ORDER BY
    bytewise(Server.name)``. SQLite compares text bytewise (BINARY); PostgreSQL by the
    database's collation, which on an installation made with a locale (en_US.UTF-8, an
    ICU locale) ignores case and punctuation first: servers gpu-B, gpu-a, gpuD, gpu_c on
    SQLite were gpu_c, gpu-a, gpu-B, gpuD there, so `gandiva get servers` and the other
    listings came in another order by database (the policy orders by name itself)."""

    inherit_cache = True
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]  # noqa: RUF012 - SQLAlchemy reads it

    def __init__(self, column: Any) -> None:
        self.column = column
        self.type = column.type


@compiles(bytewise)
def _bytewise_default(element: bytewise, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.column, **kw))


@compiles(bytewise, "postgresql")
def _bytewise_postgresql(element: bytewise, compiler: Any, **kw: Any) -> str:
    return f'{compiler.process(element.column, **kw)} COLLATE "C"'
