"""One scheduler per database.

Two `gandiva scheduler` processes started on one database by mistake (another
--listen port, a second unit, a restart while the old process still runs) would
both act on the cluster: each runs scheduling rounds, marks servers down and
re-queues jobs from its own view, while helpers and job shims talk to only one of
them. The second is refused at start, naming the one that holds the database.

- SQLite: an exclusive ``flock`` on ``PATH.scheduler-lock`` beside the database
  file, released by the kernel when the process ends however it ends (kill -9
  included). The file holds who took it (pid, host, address), for the message.
- PostgreSQL: a session advisory lock (per database) on a connection of its own,
  released by the server when that connection ends (the process killed: its
  socket closes). The connection's ``application_name`` says who holds it. If the
  connection is lost (a database restart), the lock is taken again as soon as the
  database answers; if another scheduler took it meanwhile, ``on_lost`` is called
  and this one stops. A connection lost to a partition leaves its session open on the
  server (nothing told it), holding the lock: that session, this scheduler's own, is
  ended first.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from scheduler.state.db import SqliteFile, file_identity, pg_connect_args, watch_asyncpg

log = logging.getLogger(__name__)

# pg_try_advisory_lock's key: "gandiva" in ASCII (advisory locks are per database).
PG_LOCK_KEY = 0x67616E64697661
CHECK_EVERY_S = 2.0


class DatabaseHeld(Exception):
    """Another scheduler holds the database; the message says which and what to do."""


def _who(listen: str) -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}, listening on {listen}"


def _refusal(db: str, holder: str) -> str:
    return (f"--db {db}: another scheduler is running on this database ({holder or 'holder unknown'}); "
            "two schedulers on one database would both place, suspend and re-queue jobs: stop "
            "the other one first, or give this one its own --db")


class SchedulerLock:
    """Held from `acquire` to `release`; `acquire` raises DatabaseHeld when taken."""

    def __init__(self, url: str, listen: str, shown: str, on_lost: Callable[[str], None] | None = None) -> None:
        self.url, self.listen, self.shown = url, listen, shown
        self.on_lost = on_lost
        self._fd: int | None = None
        self._conn: Any = None
        self._backend: int | None = None  # the server's pid of the session holding the lock
        self._taking: asyncio.Future[bool | None] | None = None  # the take_back under way
        self._watch: asyncio.Task[None] | None = None
        self._confirmed = -math.inf  # (monotonic) when the database last showed the lock is this one's
        self._server_down = False  # the last try to take the lock back was refused by the server (down)
        self._checking: asyncio.Future[bool] | None = None  # the lock's session asked (`confirm`)

    @property
    def path(self) -> Path:
        return Path(f"{make_url(self.url).database}.scheduler-lock")

    async def acquire(self) -> None:
        if make_url(self.url).drivername.startswith("sqlite"):
            self._flock()
        else:
            holder = await self._pg_take()
            if holder is not None:
                raise DatabaseHeld(_refusal(self.shown, holder))
            self._watch = asyncio.create_task(self._pg_watch())

    def _flock(self) -> None:
        path = self.path
        if not path.parent.is_dir():  # the database's own error says what is wrong
            return
        # Never through a link: in a directory others may write (/tmp), a link put there made
        # a scheduler run as root truncate the link's target and write its pid into it.
        kind = "a symbolic link" if path.is_symlink() else "a directory" if path.is_dir() else ""
        if kind:  # (and without a lock file the scheduler ran unguarded)
            raise ValueError(f"{path} is {kind}, not this scheduler's lock file; remove it and start again")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # made a link since the check above
                raise ValueError(f"{path} is a symbolic link, not this scheduler's lock file; remove it "
                                 "and start again") from None
            # No file can be made beside the database: neither can SQLite's journal, and
            # opening the database says what is wrong (a directory not writable...).
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip()
            os.close(fd)
            raise DatabaseHeld(_refusal(self.shown, holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, _who(self.listen).encode(), 0)
        self._fd = fd
        self._confirmed = time.monotonic()

    async def _pg_take(self) -> str | None:
        """Connect and take the lock: None when taken, else who holds it ("" unknown).
        OSError when the database cannot be reached."""
        import asyncpg

        url = make_url(self.url)
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        args = pg_connect_args(url.query, {"server_settings": {"application_name": self._name()}})
        conn = await asyncpg.connect(dsn, **args)
        watch_asyncpg(conn)
        try:
            if await self._try_lock(conn):
                self._conn, conn = conn, None
                return None
            row = await conn.fetchrow(
                "SELECT a.pid, a.application_name, a.application_name || coalesce(' from ' || host(a.client_addr), '') "
                "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (l.classid::bigint << 32 | l.objid::bigint) = $1", PG_LOCK_KEY)
            if row is not None and row[0] == self._backend and row[1] == self._name():
                # This scheduler's own session from before its connection was lost (a
                # partition: the server never heard that it ended), still holding the lock:
                # ended, and the lock taken again. Before, the scheduler stopped itself on
                # the link's return, naming itself as "another scheduler".
                log.warning("the database still had this scheduler's lost session (pid %s): ending it", row[0])
                await conn.fetchval("SELECT pg_terminate_backend($1)", row[0])
                for _ in range(50):  # (it ends, and lets the lock go, as soon as it is signalled)
                    if await self._try_lock(conn):
                        self._conn, conn = conn, None
                        return None
                    await asyncio.sleep(0.1)
            return str(row[2] or "") if row is not None else ""
        finally:
            if conn is not None:
                await conn.close()

    def held(self) -> bool:
        """Whether this scheduler surely holds the database now: its lock file, or its lock's
        PostgreSQL session open. A session lost (a restart, a partition) may have let
        another scheduler take the database before the watch finds out (up to CHECK_EVERY_S
        later, once it answers): until the lock is taken again, this one must not write."""
        return self._fd is not None or (self._conn is not None and not self._conn.is_closed())

    def unconfirmed_s(self) -> float:
        """How long since the database last showed that its lock is this scheduler's (its
        lock's session answered the watch): 0 with a lock file (a local file cannot be cut
        off), 0 while its session is lost and its server refuses connections (down: nobody
        can take the lock). While a partition lasts (connections time out), the
        database's server ends the session only after its keepalives
        (scheduler.state.db.PG_SESSION_END_MIN_S at the earliest), and another scheduler may
        take the database from then on: the bound on answering helpers from memory
        (SchedulerCore.heartbeat_unrecorded)."""
        if self._fd is not None:
            return 0.0
        if not self.held() and self._server_down:
            # Its server refuses connections (stopped, restarting): no scheduler can take the
            # lock until it is back, and then this one's watch tries again within
            # CHECK_EVERY_S (and stops if another took it).
            return 0.0
        return max(0.0, time.monotonic() - self._confirmed)

    async def _try_lock(self, conn: Any) -> bool:
        asked = time.monotonic()
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", PG_LOCK_KEY):
            return False
        self._backend = conn.get_server_pid()
        self._confirmed = asked
        return True

    async def _pg_watch(self) -> None:
        """Keep the lock: a lost connection (the database restarted) takes it again."""
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if await self.confirm() is False:
                return

    async def confirm(self) -> bool | None:
        """Ask the lock's session now (the watch, or a write after it went unconfirmed: one
        query at a time on that connection, shared): True when it answers, else `take_back`'s
        answer (None: unreachable; False: another scheduler took the database)."""
        if self._fd is not None:
            return True
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check())
        if await asyncio.shield(self._checking):
            return True
        return await self.take_back()

    async def _check(self) -> bool:
        try:
            if self._conn is not None and not self._conn.is_closed():
                asked = time.monotonic()
                await asyncio.wait_for(self._conn.fetchval("SELECT 1"), CHECK_EVERY_S * 5)
                # As of when it was asked: the server heard this session then or later (an
                # answer handled late on a busy event loop is no later proof).
                self._confirmed = asked
                return True
        except Exception:  # noqa: BLE001 - any loss of the connection
            with contextlib.suppress(Exception):
                self._conn.terminate()
        return False

    async def take_back(self) -> bool | None:
        """The lock taken again once its connection was lost (by the watch, or at once by a
        write that found it lost: `held`): True when held, None while the database does not
        answer, False when another scheduler took it meanwhile (``on_lost`` is called).
        Callers meanwhile share one try (each write of an outage waited for a connect of its own)."""
        if self.held():
            return True
        if self._taking is None or self._taking.done():
            self._taking = asyncio.ensure_future(self._take_back_once())
        return await asyncio.shield(self._taking)

    async def _take_back_once(self) -> bool | None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.terminate()
        self._conn = None
        try:
            holder = await self._pg_take()
        except Exception as exc:  # noqa: BLE001 - still unreachable: try again
            log.debug("database lock not taken again yet: %s", exc)
            self._server_down = _server_down(exc)
            return None
        self._server_down = False
        if holder is not None:
            message = _refusal(self.shown, holder) + " (it took the database while the connection was lost)"
            log.error("%s; stopping", message)
            if self.on_lost is not None:
                self.on_lost(message)
            return False
        log.warning("database lock taken again after its connection was lost")
        return True

    async def bound(self, address: str) -> None:
        """Name the address actually bound (a --listen port 0) as the holder's."""
        self.listen = address
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, _who(address).encode(), 0)
        elif self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.execute(f"SET application_name = '{self._name()}'")

    def _name(self) -> str:
        # PostgreSQL keeps 63 bytes of it: the address and pid first, the host name last
        # (cut first). No quote can be in it (a host name has none).
        return f"gandiva-scheduler {self.listen} pid {os.getpid()} on {socket.gethostname()}"[:63].replace("'", "")

    async def release(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self._checking is not None and not self._checking.done():
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._checking
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with it
            self._fd = None


class DatabaseLost(DatabaseHeld):
    """The SQLite file this scheduler ran on was deleted, moved away or replaced under it;
    the message says where its state is now and what to do."""


class SqliteFileWatch:
    """The SQLite database file a scheduler runs on, and its write-ahead log, watched for
    being deleted, moved away or replaced under the running scheduler.

    An open SQLite connection keeps writing to the file it opened, whatever happens to
    the name: with the file deleted (or renamed) every change went on being accepted and
    was lost at the next restart, which found no database and made an empty one; with
    the log (``PATH-wal``) deleted, a crash lost every change not yet copied into the
    file, the schema included. The watch keeps a connection of its own open on the file
    (so that SQLite never deletes the log on its own while the scheduler runs, and to
    read the state back from); `check` says what changed; `save_copy` writes the
    database as this scheduler has it beside the file, and `put_back` (once every other
    connection is closed) moves it to the file's name unless another database is there.
    """

    def __init__(self, path: Path, pin: SqliteFile | None = None) -> None:
        """``pin``: the file the scheduler's engines opened (its connection is opened as
        theirs are, and the file it watches is that one, whatever is at the name now)."""
        import sqlite3

        self.path = path
        self.wal = Path(f"{path}-wal")
        pin = pin or SqliteFile(str(path))
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = pin.connect()
            self._conn.execute("SELECT count(*) FROM sqlite_master").fetchall()  # opens the log too
        except sqlite3.Error as exc:  # gone or replaced already: `check` says so at once
            log.error("cannot keep a connection on the database file %s: %s", path, exc)
        self._main = pin.identity
        self._wal = file_identity(self.wal)
        self.fault = ""  # gone, replaced, wal
        self.copy: Path | None = None

    def check(self) -> str:
        """"" while the file and its log are the ones opened; else what happened."""
        main = file_identity(self.path)
        if main is None:
            self.fault = "gone"
            return f"the database file {self.path} was deleted or moved away while the scheduler ran on it"
        if main != self._main:
            self.fault = "replaced"
            return f"the database file {self.path} was replaced by another file while the scheduler ran on it"
        wal = file_identity(self.wal)
        if self._wal is None:
            self._wal = wal  # not in WAL mode yet when the watch began
        elif wal != self._wal:
            self.fault = "wal"
            return (f"the database's write-ahead log {self.wal} was deleted or replaced while the scheduler "
                    "ran (the latest changes are only there until SQLite copies them into the file)")
        return ""

    def save_copy(self) -> None:
        """The database as this scheduler has it (through its connection to the file it
        opened), written to PATH.recovered-TIME beside it."""
        import sqlite3
        import time

        if self._conn is None:
            return
        target = self.path.with_name(f"{self.path.name}.recovered-{time.strftime('%Y%m%dT%H%M%S')}")
        tmp = target.with_name(target.name + ".tmp")
        dst = sqlite3.connect(tmp)
        try:
            self._conn.backup(dst)
        finally:
            dst.close()
        os.replace(tmp, target)
        self.copy = target

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def put_back(self, shown: str) -> str:
        """After every connection to the old file is closed: the copy goes to the file's
        name, unless another database was put there (then it stays beside it). The
        message for the operator."""
        self.close()
        if self.copy is None:
            return f"--db {shown}: {self.check() or 'the database file changed'}; its state could not be saved"
        if self.fault == "replaced" and file_identity(self.path) is not None:
            return (f"--db {shown}: the database file was replaced by another file while the scheduler ran "
                    f"on it: stopped, leaving that file alone; the database as this scheduler had it is in "
                    f"{self.copy}: move it to {self.path} to go on with it, then start the scheduler again "
                    f"(the file now at {self.path} may hold pages of this scheduler's write-ahead log, which "
                    "SQLite applies to whatever file has that name: check it before using it)")
        for leftover in (self.wal, Path(f"{self.path}-shm")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()  # the old file's (SQLite removes them as its last connection closes)
        os.replace(self.copy, self.path)
        what = ("its write-ahead log was deleted" if self.fault == "wal"
                else "the database file was deleted or moved away")
        return (f"--db {shown}: {what} while the scheduler ran on it (its changes would have been lost at "
                f"the next restart): stopped; the database as this scheduler had it is back at {self.path}: "
                "start the scheduler again")


def _server_down(exc: BaseException) -> bool:
    """Whether a failed connect says the database server is down for every scheduler (its
    own answer: starting up, shutting down, in recovery), not cut off from this one alone:
    no scheduler can take its lock then. A refused connection is not such an answer: it
    may be this scheduler's path alone (a proxy beside it that stopped, a firewall's
    REJECT) while the server, which ended the lost session at once, lets a standby take
    the lock (before, this scheduler answered its helpers from memory for as long)."""
    try:
        import asyncpg
    except ImportError:  # (PostgreSQL only)
        return False
    return isinstance(exc, asyncpg.exceptions.CannotConnectNowError)
