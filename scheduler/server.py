"""serve(): the central scheduler process.

gRPC (grpc.aio) with the Scheduler, Runtime and Helper services, health checking
and server reflection; alembic brings the schema up to date at start; the live
engine runs the policy in the background. Shutdown is graceful: health goes
NOT_SERVING, the current scheduling round finishes, calls get `grace` seconds,
then the database engine is disposed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from protos.gandiva.v1 import (
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import auth
from scheduler.api.helper_api import HelperServicer
from scheduler.api.runtime_api import RuntimeServicer
from scheduler.api.scheduler_api import SchedulerServicer
from scheduler.auth import Authenticator
from scheduler.config import DEFAULT_LISTEN
from scheduler.core import SchedulerCore, Settings
from scheduler.engine.live import LiveEngine
from scheduler.lifecycle import JobState
from scheduler.policy.types import PolicyConfig
from scheduler.state import migrate, prune
from scheduler.state.db import make_engine, sqlite_file
from scheduler.state.owner import DatabaseHeld, DatabaseLost, SchedulerLock, SqliteFileWatch
from scheduler.transport import (
    BoundedHealth,
    LetGoOfRequestsInterceptor,
    MalformedRequestInterceptor,
    ServerTls,
    add_port,
    check_exposure,
    server_options,
)
from scheduler.validation import MAX_REQUEST_BYTES

log = logging.getLogger(__name__)

# A client connection with no call in flight for this long is closed (grpc.max_connection_idle_ms).
IDLE_CONNECTION_MS = 60_000

SERVICE_NAMES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
    runtime_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name,
    helper_pb2.DESCRIPTOR.services_by_name["Helper"].full_name,
)


@dataclass
class SchedulerServer:
    """A running scheduler: its gRPC server, core, engine and bound address."""

    db_url: str
    listen: str = DEFAULT_LISTEN
    policy: str = "gandiva"
    settings: Settings = field(default_factory=Settings)
    policy_config: PolicyConfig | None = None
    tick_s: float = 1.0
    address: str = ""
    # HOST:PORT for /metrics and the dashboard ("" = off); http_address once bound.
    http_listen: str = ""
    http_address: str = ""
    # Host names the dashboard answers through loopback besides this machine's own
    # (--http-allow-host: a proxy on this machine that passes its users' Host).
    http_allow_hosts: tuple[str, ...] = ()
    # More addresses to serve on, e.g. unix:/run/gandiva.sock for operator tools on the
    # scheduler's own host, whatever its network does.
    also_listen: tuple[str, ...] = ()
    # "token": every call needs a token (`gandiva token create`); "none": trusted callers.
    auth: str = "none"
    tls: ServerTls | None = None
    # Allow an open address without TLS and tokens (otherwise start() refuses).
    insecure: bool = False
    # Finished jobs' events older than this are deleted (0: kept forever).
    event_retention_days: float = 0.0
    interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)

    async def start(self) -> str:
        if self.auth not in ("none", "token"):
            raise ValueError(f"--auth {self.auth!r}: use 'token' or 'none'")
        # Every TCP address is checked (a unix socket is reachable only on this host), and
        # refused before anything is touched.
        # The warnings are logged once bound, with the port that was bound (not `:0`).
        for address in (self.listen, *(a for a in self.also_listen if not a.startswith("unix:"))):
            check_exposure(address, self.tls, self.auth == "token", self.insecure, "the scheduler")
        if self.http_listen:
            from scheduler.observe.http import check_dashboard_exposure

            said = check_dashboard_exposure(self.http_listen, self.auth == "token", self.http_allow_hosts,
                                            self.insecure)
            if said:
                log.warning("%s", said)
        self.db = make_engine(check_db_url(self.db_url))
        _warn_relative_sqlite(self.db_url)
        # One scheduler per database: a second one is refused before it touches anything.
        self.lost = asyncio.Event()
        self.lost_why = ""
        self._file_watch: SqliteFileWatch | None = None
        self._file_task: asyncio.Task[None] | None = None
        self._lock = SchedulerLock(self.db_url, self.listen, _redact(self.db_url), self._lost)
        try:
            await self._lock.acquire()
        except OSError as exc:  # PostgreSQL not there
            await self.db.dispose()
            raise OSError(f"--db {_redact(self.db_url)}: cannot reach the database "
                          f"({exc.strerror or exc}); is it running, and is the URL right?") from None
        except DatabaseHeld:
            await self.db.dispose()
            raise
        except Exception as exc:  # noqa: BLE001 - a refused login, an unknown database: one line
            await self.db.dispose()
            raise ValueError(f"--db {_redact(self.db_url)}: {str(exc).strip() or type(exc).__name__}") from None
        try:
            address = await self._start()
            await self._lock.bound(address)
            return address
        except BaseException:
            await self._lock.release()
            raise

    def _watch_file(self) -> None:
        """SQLite: watch the database file for being deleted, moved or replaced under the
        running scheduler (scheduler.state.owner.SqliteFileWatch)."""
        url = make_url(self.db_url)
        path = Path(url.database or "")
        pin = sqlite_file(self.db)
        if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:" \
                or not (path.is_file() or (pin is not None and pin.identity is not None)):
            return
        self._file_watch = SqliteFileWatch(path, pin)
        self._file_task = asyncio.create_task(self._file_loop(self._file_watch))

    async def _file_loop(self, watch: SqliteFileWatch, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            why = watch.check()
            if why:
                log.error("%s: stopping, to save its state before it is lost", why)
                self._lost(why)
                return

    @property
    def file_fault(self) -> bool:
        """The SQLite file was deleted, moved or replaced under this scheduler."""
        return self._file_watch is not None and bool(self._file_watch.fault)

    def _lost(self, why: str) -> None:
        """Another scheduler took the database (ours lost its lock), or its SQLite file
        was deleted or replaced under it: stop acting."""
        self.lost_why = why
        self.lost.set()

    async def _start(self) -> str:
        self.core = SchedulerCore(self.db, self.settings)
        # No write while another scheduler may hold the database.
        self.core.lock_held, self.core.lock_take_back = self._lock.held, self._lock.take_back
        self.core.lock_unconfirmed_s, self.core.lock_confirm = self._lock.unconfirmed_s, self._lock.confirm
        # The policy is checked before anything touches the database.
        self.engine = LiveEngine(self.core, self.policy, self.policy_config, self.tick_s)
        try:
            await migrate.upgrade(self.db)
            await migrate.check_states(self.db, frozenset(s.value for s in JobState))
        except (OSError, SQLAlchemyError) as exc:
            # Closed before the error leaves: a connection thread still finishing would
            # otherwise print its own traceback once the event loop is gone.
            await self.db.dispose()
            await _aiosqlite_threads_ended()
            if isinstance(exc, OSError):  # PostgreSQL not there: "[Errno 111] Connection refused"
                raise OSError(f"--db {_redact(self.db_url)}: cannot reach the database "
                              f"({exc.strerror or exc}); is it running, and is the URL right?") from None
            raise ValueError(f"--db {_redact(self.db_url)}: {_db_trouble(exc)}") from None
        except migrate.Refused as exc:  # a newer gandiva's schema, or rows a migration broke
            await self.db.dispose()
            await _aiosqlite_threads_ended()
            raise ValueError(f"--db {_redact(self.db_url)}: {exc}") from None
        # Innermost: a request that is not its method's message is INVALID_ARGUMENT, not UNKNOWN.
        interceptors = [*self.interceptors, MalformedRequestInterceptor()]
        authenticator = auth.Authenticator(self.core.read_sessions) if self.auth == "token" else None
        if authenticator is not None:
            interceptors.insert(0, auth.AuthInterceptor(authenticator))
        # Outermost, so that refused calls are timed too; outside them all, a refused call
        # lets go of its request at once (a cycle inside gRPC held it until a full collection).
        interceptors = [LetGoOfRequestsInterceptor(), *self._observe(authenticator), *interceptors]
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                # A connection with no call for this long is closed (GOAWAY; a client that
                # calls again reconnects). A helper leaves connections behind when this
                # scheduler stalls: each Register and hedged heartbeat it gives up on is a
                # channel it closes, but gRPC completes some of their connections once the
                # scheduler runs again and keeps them, answering keepalive pings, for good
                # (15-20 a helper after a 30-s SIGSTOP). Every helper's session and every
                # job's runtime holds a stream open, so they are never idle.
                ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
                # The largest valid request (a full multi-job); larger ones are refused
                # with RESOURCE_EXHAUSTED before they are parsed.
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                *server_options(),
            ],
        )
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerServicer(self.core, self.engine), self.server)
        self.runtime_servicer = RuntimeServicer(self.core)
        runtime_pb2_grpc.add_RuntimeServicer_to_server(self.runtime_servicer, self.server)
        helper_pb2_grpc.add_HelperServicer_to_server(HelperServicer(self.core, self.engine), self.server)
        self.health = BoundedHealth()  # Watch bounded: it needs no token
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        host = self.listen.rpartition(":")[0]
        bound = add_port(self.server, self.listen, self.tls)
        if bound == 0:
            raise OSError(f"cannot listen on {self.listen}")
        self.address = f"{host or '127.0.0.1'}:{bound}"
        bound_at = [(host, bound)]
        for extra in self.also_listen:
            tls = None if extra.startswith("unix:") else self.tls
            port = add_port(self.server, extra, tls, "--also-listen")
            if port == 0:
                raise OSError(f"cannot listen on {extra}")
            if not extra.startswith("unix:"):
                bound_at.append((extra.rpartition(":")[0], port))
        for at, port in bound_at:
            warning = check_exposure(f"{at}:{port}", self.tls, self.auth == "token", self.insecure, "the scheduler")
            if warning:
                log.warning("%s", warning)
        await self.server.start()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.engine.scheduler_address = self.address
        if self.http is not None:  # before the first round: the log's lines stay in time order
            await self._read_back_decisions()
        self._engine_task = asyncio.create_task(self.engine.run())
        self._prune_task = None
        if self.http is not None:
            try:
                self.http_address = await self.http.start()
            except OSError:  # in use: stop what started, so that nothing outlives the loop
                await self.stop(grace=0)
                raise
            log.info("metrics and dashboard on http://%s/", self.http_address)
        self._prune_task = (
            asyncio.create_task(self._prune_loop()) if self.event_retention_days > 0 else None
        )
        self._watch_file()
        log.info("scheduler listening on %s (db %s, policy %s, auth %s, %s)", self.address,
                 _redact(self.db_url), self.policy, self.auth, "TLS" if self.tls else "plaintext")
        return self.address

    def _observe(self, authenticator: Authenticator | None = None) -> list[grpc.aio.ServerInterceptor]:
        """With http_listen: metrics, decision log and timeline hooked in; the
        interceptors that time RPCs. The HTTP server starts once gRPC is up. With
        tokens (``authenticator``) its data, every user's jobs, is an operator's to read."""
        self.http = None
        if not self.http_listen:
            return []
        from scheduler.observe.dashboard import PUBLIC_PAGES, operator_guard, routes
        from scheduler.observe.http import HttpServer
        from scheduler.observe.metrics import RpcMetricsInterceptor, SchedulerMetrics

        metrics = SchedulerMetrics(lambda: getattr(self.engine.policy, "state", None))
        self._metrics = metrics
        self.engine.observer = self.core.observer = metrics
        separate = self.core.read_engine is not self.core.engine  # SQLite: a reader engine apart
        metrics.watch_engine(self.core.engine, "write" if separate else "all")
        if separate:
            metrics.watch_engine(self.core.read_engine, "read")
        guard = operator_guard(authenticator) if authenticator is not None else None
        self.http = HttpServer(self.http_listen, routes(self.core, metrics, self.engine), guard, PUBLIC_PAGES,
                               allow_hosts=self.http_allow_hosts, any_host=self.insecure and not self.http_allow_hosts)
        return [RpcMetricsInterceptor(metrics)]

    async def _read_back_decisions(self) -> None:
        """The dashboard's decision log, empty at start, gets the latest decisions the
        database records (scheduler.observe.history); a failure to read them is logged only."""
        from scheduler.observe.history import read_back, read_back_timeline

        try:
            t0 = time.monotonic()
            count = await read_back(self.core, self._metrics.log, self.core.clock())
            t1 = time.monotonic()
            drawn = await read_back_timeline(self.core, self._metrics.timeline, self.core.clock())
        except Exception:  # the page's history must never keep the scheduler down
            log.warning("could not read the decision log and GPU timeline back from the database", exc_info=True)
        else:
            log.info("decision log: %d decisions read back from the database in %.2fs; GPU timeline of the last "
                     "hour: %d GPUs in %.2fs", count, t1 - t0, drawn, time.monotonic() - t1)

    async def stop(self, grace: float = 5.0) -> None:
        if self.http is not None:
            await self.http.stop()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        # The same grace for the commands in flight as for the open calls (None: none).
        await self.engine.stop(grace or 0.0)
        self._engine_task.cancel()
        if self._prune_task is not None:
            self._prune_task.cancel()
        await asyncio.gather(self._engine_task, *([self._prune_task] if self._prune_task else []),
                             return_exceptions=True)
        await self.server.stop(grace)
        await self.core.dispose()
        watch = self._file_watch
        if self._file_task is not None:
            self._file_task.cancel()
            await asyncio.gather(self._file_task, return_exceptions=True)
        if watch is not None and watch.fault:
            try:
                await asyncio.to_thread(watch.save_copy)
            except Exception as exc:  # noqa: BLE001 - said in the message below
                log.error("could not save the database's state: %s", exc)
        await self.db.dispose()
        if watch is not None and watch.fault:
            await _aiosqlite_threads_ended()
            self.lost_why = watch.put_back(_redact(self.db_url))
            log.error("%s", self.lost_why)
        elif watch is not None:
            watch.close()
        await self._lock.release()
        log.info("stopped; runtime streams delivered %d progress reports",
                 self.runtime_servicer.progress_received)


    async def _prune_loop(self, every_s: float = 3600.0) -> None:
        """Delete finished jobs' old events once an hour (the retention setting)."""
        while True:
            try:
                n = await prune.prune(self.core, self.event_retention_days * 86400.0)
                if n.events:
                    log.info("retention: deleted %d events of jobs finished over %g days ago",
                             n.events, self.event_retention_days)
            except Exception:  # a database outage: try again next hour
                log.warning("retention pruning failed", exc_info=True)
            await asyncio.sleep(every_s)


def check_db_url(url: str) -> str:
    """``url``, or ValueError naming what is wrong with it as the scheduler's database."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"--db {url!r}: not a database URL; give one like "
                         "sqlite+aiosqlite:////var/lib/gandiva/gandiva.db or "
                         "postgresql+asyncpg://USER:PASSWORD@HOST/DB") from None
    if parsed.drivername.startswith("sqlite") and parsed.database in (None, "", ":memory:"):
        raise ValueError(f"--db {url!r}: an in-memory SQLite database lives in one connection, "
                         "and the scheduler opens several; give a file "
                         "(sqlite+aiosqlite:////var/lib/gandiva/gandiva.db)")
    if parsed.drivername.startswith("sqlite") and os.path.isdir(os.path.expanduser(parsed.database or "")):
        # Before anything opens it (or tightens its mode as if it were the database file).
        raise ValueError(f"--db {url!r}: {parsed.database} is a directory; give a file in it, "
                         f"e.g. sqlite+aiosqlite:///{os.path.join(parsed.database or '', 'gandiva.db')}")
    return url


def _warn_relative_sqlite(url: str) -> None:
    """``sqlite+aiosqlite:///var/x.db`` (three slashes) is var/x.db under the current
    directory, not /var/x.db: say where the database is, as a warning."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.drivername.startswith("sqlite") and parsed.database and not os.path.isabs(parsed.database):
        log.warning("--db %s is a path relative to the current directory: the database is %s "
                    "(four slashes, sqlite+aiosqlite:////PATH, give an absolute path)",
                    url, os.path.abspath(parsed.database))


def _db_trouble(exc: Exception) -> str:
    """A database error at start, in one line with what to check."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    if "not a database" in text:
        return f"{text}: the file is not an SQLite database (is it a Gandiva database?)"
    if "malformed" in text:  # "database disk image is malformed": a file cut short, or written over
        return (f"{text}: the file is damaged (cut short or partly written over: a disk that filled, a copy "
                "taken while a scheduler wrote it); restore it from a backup, or save what it holds with "
                "`sqlite3 FILE .recover | sqlite3 NEW.db` and give --db that one")
    if "unable to open database file" in text:
        return f"{text}: check that its directory exists and is writable (GANDIVA_HOME or --db)"
    return text


async def _aiosqlite_threads_ended(timeout_s: float = 5.0) -> None:
    """Wait, with this loop running, for aiosqlite's connection threads to end.

    A connection that failed to open is stopped by aiosqlite without awaiting the stop:
    its thread then posts the stop's result to this loop. Were the loop closed first (the
    error leaving ``asyncio.run``), that thread would print its own traceback after the
    one-line error. Python names a thread by its target, which is how they are found.
    """
    loop = asyncio.get_running_loop()
    for thread in threading.enumerate():
        if thread.name.endswith("(_connection_worker_thread)"):
            await loop.run_in_executor(None, thread.join, timeout_s)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _write_atomically(path: str, text: str, flag: str) -> None:
    """PATH holds TEXT whole or is left as it was: written under a name of this process's
    own beside it, flushed to disk, then renamed over PATH; on a failure that file is
    removed (a fixed PATH.tmp was left behind when the rename failed, e.g. PATH a directory)."""
    import uuid
    from pathlib import Path

    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        try:
            with open(tmp, "x") as fh:
                fh.write(text + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise OSError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); "
                      "give a file in a directory that exists and is writable") from None


# The collector's young-generation threshold in a running scheduler (Python's default: 700).
GC_YOUNG = 20_000


def quiet_gc() -> None:
    """Garbage collection for a long-running server process, whose event loop must not
    stop for long. Python's default collector ran a full collection every few seconds
    under load (1,000 runtime streams; each round's job views live long enough to be
    promoted), each one stopping the event loop for 100-450 ms on this machine: many
    of the calls slower than 100 ms (benchmarks/control_plane_load.py). Now the objects
    alive after start-up (modules, classes, the ORM's tables: about 90,000) are frozen,
    never scanned again, and young objects are collected per GC_YOUNG allocations, so
    a round's objects die young instead of reaching the old generation (one full
    collection in a 30 s run instead of ten). Garbage in cycles is still collected,
    only later."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


# How long a Python thread may hold the interpreter while another waits for it (Python's
# default: 5 ms). See quick_switches.
SWITCH_INTERVAL_S = 0.001


def quick_switches() -> None:
    """The event loop shares the interpreter with the database threads (SQLite's writer
    and readers, PostgreSQL's loops) and the thread that builds a round's snapshot. When
    one of them is busy, the loop waits up to the switch interval for the interpreter
    each time it takes it back after a system call, and it makes many per call it
    serves: with Python's 5 ms, SubmitJob's p99 under benchmarks/control_plane_load.py
    was 69-138 ms on SQLite; with 1 ms 38-66 ms (runs taking turns, docs/security.md)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


async def serve(server: SchedulerServer, port_file: str | None = None, http_port_file: str | None = None) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully."""
    address = await server.start()
    quiet_gc()
    quick_switches()
    try:
        if http_port_file and server.http_address:
            _write_atomically(http_port_file, server.http_address, "--http-port-file")
        if port_file:
            _write_atomically(port_file, address, "--port-file")
    except OSError:
        await server.stop(grace=0.0)  # nothing was served yet; its lock and database let go
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Or until another scheduler took the database (its lock lost with a restart of the
    # database): this one stops, and says so (exit status 2).
    lost = asyncio.create_task(server.lost.wait())
    signalled = asyncio.create_task(stop.wait())
    await asyncio.wait({lost, signalled}, return_when=asyncio.FIRST_COMPLETED)
    lost.cancel()
    signalled.cancel()
    log.info("shutting down")
    await server.stop(grace=0.0 if server.lost.is_set() else 5.0)
    if server.lost.is_set():
        raise (DatabaseLost if server.file_fault else DatabaseHeld)(server.lost_why)
