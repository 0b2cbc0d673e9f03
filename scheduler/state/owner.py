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
  and this one stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

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
        self._watch: asyncio.Task[None] | None = None

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

    async def _pg_take(self) -> str | None:
        """Connect and take the lock: None when taken, else who holds it ("" unknown).
        OSError when the database cannot be reached."""
        import asyncpg

        dsn = make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(dsn, server_settings={"application_name": self._name()})
        try:
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", PG_LOCK_KEY):
                self._conn, conn = conn, None
                return None
            holder = await conn.fetchval(
                "SELECT a.application_name || coalesce(' from ' || host(a.client_addr), '') "
                "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (l.classid::bigint << 32 | l.objid::bigint) = $1", PG_LOCK_KEY)
            return str(holder or "")
        finally:
            if conn is not None:
                await conn.close()

    async def _pg_watch(self) -> None:
        """Keep the lock: a lost connection (the database restarted) takes it again."""
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                if self._conn is not None and not self._conn.is_closed():
                    await asyncio.wait_for(self._conn.fetchval("SELECT 1"), CHECK_EVERY_S * 5)
                    continue
            except Exception:  # noqa: BLE001 - any loss of the connection
                with contextlib.suppress(Exception):
                    self._conn.terminate()
            self._conn = None
            try:
                holder = await self._pg_take()
            except Exception as exc:  # noqa: BLE001 - still unreachable: try again
                log.debug("database lock not taken again yet: %s", exc)
                continue
            if holder is not None:
                message = _refusal(self.shown, holder) + " (it took the database while the connection was lost)"
                log.error("%s; stopping", message)
                if self.on_lost is not None:
                    self.on_lost(message)
                return
            log.warning("database lock taken again after its connection was lost")

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
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with it
            self._fd = None
