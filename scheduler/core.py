"""The scheduler's domain operations: what every API call and engine step does to
the cluster state. Each operation is one transaction; events are published to
watchers only after their transaction commits."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from sqlalchemy import Connection, select
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from migration_protocol.host_memory import format_size
from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.alone import AloneRates
from scheduler.errors import (
    AlreadyExists,
    FailedPrecondition,
    GandivaError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from scheduler.eta import Sharer
from scheduler.hangs import HangWatch
from scheduler.health import DatabaseHealth
from scheduler.hubs import HelperHub, RuntimeHub, remember
from scheduler.lifecycle import ACTIVE, JobState
from scheduler.observe.observer import Observer
from scheduler.observe.waits import Wait
from scheduler.policy.types import PolicyConfig
from scheduler.state import repo
from scheduler.state.db import (
    PG_SESSION_END_MIN_S,
    LoopThread,
    SqliteFile,
    SqliteReader,
    SqliteWriter,
    WriteQueue,
    execute_all,
    is_sqlite,
    make_engine,
    make_sessionmaker,
    sqlite_file,
)
from scheduler.state.models import Event, Gpu, Job, MultiJob, Placement, Server
from scheduler.validation import (
    check_priority,
    default_name,
    request_key,
    validate_members,
    validate_spec,
)
from scheduler.wallclock import StepFreeClock

log = logging.getLogger(__name__)

T = TypeVar("T")

# Exit code agreed with tf_runtime (tf_runtime.EXIT_MIGRATED): stopped for a migration.
EXIT_MIGRATED = 75
# Exit code agreed with tf_runtime (tf_runtime.EXIT_KILLED): told to exit by the scheduler
# (a kill, or RuntimeHub.kill_stale: a launch taken for lost).
EXIT_KILLED = 143
# A job process killed by SIGKILL that Gandiva did not send (the kernel's OOM killer, most
# often: a server's memory is shared by every job packed or suspended there) is re-queued
# to resume from its restore point, this many times at most; then it fails.
KILLED_RESTARTS = 2
KILLED = "its process was killed by SIGKILL"


# The lease must run out this long before the scheduler gives up on a server: the
# helper's watchdog polls its lease and freezes its jobs within this time.
LEASE_MARGIN_S = 1.0
# The `job.fenced` events one heartbeat may write (Core._heartbeat_full): a helper back from
# a partition has a few stale launches, one per job it ran; more are recorded at later beats.
FENCED_EVENTS_PER_BEAT = 32
# How long a write waits for the lock's session to answer once it went unconfirmed past
# PG_SESSION_END_MIN_S (SchedulerCore._check_held), before it goes on without the answer.
LOCK_CONFIRM_WAIT_S = 2.0
# A server's exit reports of a job's launches that are not its current one: one event per
# job and server in this time (Core._process_exit), the others only logged.
STALE_EXIT_EVENT_EVERY_S = 60.0
# Of the exits a registration carries, those of launches their jobs no longer run that are
# applied (a `job.stale_exit` event each), at most; the others are logged (as FENCED_EVENTS_PER_BEAT).
STALE_EXITS_PER_REGISTRATION = 32
# Launches whose highest reported step is kept (SchedulerCore.steps_seen), the one that
# reported least recently out first beyond.
STEPS_SEEN_KEPT = 100_000
# Fences whose monotonic end is kept (note_fence): a job has one at a time; beyond it the
# oldest is timed again from its written time when next looked at.
FENCES_KEPT = 100_000


@dataclass(frozen=True)
class Settings:
    """Timing of the scheduler's side of the helper protocol.

    ``lease_s``: a helper that has had no heartbeat answered for this long freezes its
    jobs (SIGSTOP) by itself. ``down_after_s``: the scheduler marks a silent server down,
    and re-places its jobs, only after this long. The lease always runs out first
    (``lease_s + LEASE_MARGIN_S <= down_after_s``), so a job is never trained by a cut-off
    server and its replacement at once. Default lease: 60% of ``down_after_s`` (at most
    ``down_after_s - LEASE_MARGIN_S``)."""

    heartbeat_interval_s: float = 2.0
    down_after_s: float = 10.0
    command_timeout_s: float = 60.0
    # How long job progress is coalesced in memory before one transaction writes it.
    progress_flush_s: float = 0.25
    # A launched job none of whose processes connects a runtime within this time is
    # marked not suspendable and not migratable (a wrapper hid python from the shim,
    # or the job is not a TensorFlow program): the scheduler cannot stop it at a boundary.
    runtime_connect_deadline_s: float = 120.0
    lease_s: float | None = None
    # Every running migratable job checkpoints this often (0: never) into its server's
    # ramdisk; a job that loses its server resumes from the last one instead of step 0
    # (on another server too, when that one sees the ramdisk through its shared root).
    checkpoint_interval_s: float = 300.0
    # A queued job whose checkpoint is in the ramdisk of a server that is down waits this
    # long after that server's last heartbeat for it to come back (a helper restarting, a
    # short partition) before it starts again from step 0 elsewhere (0: never waits).
    checkpoint_wait_s: float = 60.0
    # A running job none of whose mini-batches ends for max(this, 20 x its own mini-batch
    # time) is flagged hung (0: never looked for); one still hung this much longer is
    # stopped and re-queued from its restore point (0: only flagged). scheduler/hangs.py.
    hang_after_s: float = 600.0
    hang_restart_after_s: float = 600.0
    # A user (not an operator) may have at most this many jobs not yet ended (queued,
    # running, suspended); a submission past it is refused (0: no limit).
    max_jobs_per_user: int = 1000

    def __post_init__(self) -> None:
        lease = self.lease
        if isinstance(self.max_jobs_per_user, bool) or not isinstance(self.max_jobs_per_user, int) \
                or self.max_jobs_per_user < 0:
            raise InvalidArgument("max_jobs_per_user", f"{self.max_jobs_per_user!r} is not a whole number >= 0: give "
                                                       "how many unfinished jobs one user may have (0: no limit)")
        waits = (  # seconds, 0 turning each off
            ("hang_after_s", "how long a running job may go without a mini-batch before it is flagged hung (0: never)"),
            ("hang_restart_after_s", "how long a job flagged hung is left before it is restarted (0: never)"),
            ("checkpoint_wait_s", "how long a job waits for the server holding its checkpoint (0: not at all)"),
        )
        for name, what in waits:
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise InvalidArgument(name, f"{value:g} is not a number of seconds >= 0: give {what}")
        if self.checkpoint_interval_s < 0:
            raise InvalidArgument("checkpoint_interval_s", f"{self.checkpoint_interval_s} is negative; 0 turns periodic checkpoints off")
        if not self.runtime_connect_deadline_s > 0 or math.isinf(self.runtime_connect_deadline_s):
            raise InvalidArgument(
                "runtime_connect_deadline_s",
                f"{self.runtime_connect_deadline_s:g} is not a positive number of seconds: give how long "
                "a launched job's processes have to connect the Gandiva runtime (e.g. 120)")
        if self.heartbeat_interval_s <= 0:
            raise InvalidArgument("heartbeat_interval_s", f"{self.heartbeat_interval_s} must be positive")
        if lease + LEASE_MARGIN_S > self.down_after_s:
            raise InvalidArgument(
                "lease_s",
                f"a lease of {lease:g}s does not run out {LEASE_MARGIN_S:g}s before servers are "
                f"marked down ({self.down_after_s:g}s): raise the heartbeat timeout or shorten the lease",
            )
        if lease < 2 * self.heartbeat_interval_s:
            raise InvalidArgument(
                "lease_s",
                f"a lease of {lease:g}s is shorter than two heartbeats ({self.heartbeat_interval_s:g}s "
                "each): helpers would freeze their jobs after one late heartbeat",
            )

    @property
    def lease(self) -> float:
        if self.lease_s is not None:
            return self.lease_s
        return min(0.6 * self.down_after_s, self.down_after_s - LEASE_MARGIN_S)


@dataclass
class JobDetail:
    job: Job
    placement: list[tuple[str, int]]
    history: Sequence = ()
    host_memory_bytes: int = 0  # its processes' resident set, last measured (0: not measured)
    sharers: Sequence[Sharer] = ()  # the jobs on its first GPU (scheduler/eta.py)
    wait: str = ""  # a queued job's place in the queue, a suspended one's next turn (observe/waits.py)
    alone_rate: float = 0.0  # its rate alone on its GPUs, where measured (scheduler/alone.py)


# SQLSTATEs of a database that is there but takes no work now: class 08 (connection
# exception) and 57P01-57P03 (shut down by an administrator or a crash, or starting up:
# "the database system is starting up" / "is not yet accepting connections" while
# PostgreSQL recovers after a crash or restart). They arrive as a plain DBAPIError.
_UNAVAILABLE_STATES = ("08", "57P01", "57P02", "57P03")


def _is_connectivity_error(err: BaseException) -> bool:
    if isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        return True
    state = str(getattr(getattr(err, "orig", None), "sqlstate", None) or "")
    if isinstance(err, sa_exc.DBAPIError) and state.startswith(_UNAVAILABLE_STATES):
        return True
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return True
    return isinstance(err, (OSError, ConnectionError, asyncio.TimeoutError)) or (
        type(err).__module__.startswith("asyncpg") and "Connection" in type(err).__name__
    )


# What the database says when it is there but cannot write (SQLite's SQLITE_FULL and
# SQLITE_READONLY): its own words, then what to do.
_CANNOT_WRITE = (
    (("database or disk is full", "no space left"),
     "the disk holding the database is full", "free space there"),
    (("readonly database", "read-only file system"),
     "the database is read-only", "check the file's and its directory's permissions and mount"),
)


async def _held() -> bool:
    return True


def _unavailable_text(err: BaseException, health: DatabaseHealth | None = None) -> str:
    """The message of an Unavailable for `err`: a full or read-only database named as
    such (it used to read "database unreachable (OperationalError)", sending operators
    after the network while the disk was full), else unreachable since when, and why
    (recorded in `health`: /metrics and the dashboard say it too)."""
    said = str(getattr(err, "orig", None) or err).strip()
    first = said.splitlines()[0] if said else type(err).__name__
    for needles, what, todo in _CANNOT_WRITE:
        if any(n in said.lower() for n in needles):
            if health is not None:
                health.cannot_write(f"{what} ({first})")
            return f"{what} ({first}): {todo}; nothing was written; retry once it is fixed"
    if health is None:
        return f"database unreachable ({type(err).__name__}); retry shortly"
    # Its type and its first line, bounded (a connect error: no data of anyone's in it).
    root: BaseException = err
    while root.__cause__ is not None and not isinstance(root.__cause__, asyncio.CancelledError):
        root = root.__cause__  # the driver's own error under SQLAlchemy's and its adapter's
    why = type(root).__name__
    detail = first[:120] if first != why else ""
    if not detail and isinstance(root, TimeoutError):  # (asyncpg's connect timeout says nothing)
        detail = "no answer in time: the network to it, or its server, hangs"
    return f"{health.unreachable(f'{why}: {detail}' if detail else why)}; retry shortly"


@contextmanager
def _db_errors(health: DatabaseHealth | None = None) -> Iterator[None]:
    """Database connectivity failures (and a full or read-only database) become
    Unavailable; other errors pass through. A transaction that completes marks the
    database reachable in `health`, one that could not reach it unreachable."""
    try:
        yield
    except Exception as err:
        if _is_connectivity_error(err):
            raise Unavailable(_unavailable_text(err, health)) from err
        raise
    if health is not None:
        health.reached()


def _nothing() -> None:
    """Run on the writer thread: once it returns, every write queued before it is done."""


def _spec_differences(job: Job, spec: common_pb2.JobSpec) -> list[str]:
    """The fields in which `spec` asks for something other than `job` was submitted with."""
    wanted = {
        "name": default_name(spec), "command": list(spec.command), "workdir": spec.workdir,
        "env": dict(spec.env), "gpus": spec.gpus, "priority": spec.priority,
        "grow_shrink": spec.grow_shrink, "params": dict(spec.params),
    }
    return [field for field, value in wanted.items() if getattr(job, field) != value]


def _gpus_of(placements: dict[str, list[Placement]], job_id: str) -> list[tuple[str, int]]:
    return [(p.server_name, p.gpu_index) for p in placements.get(job_id, [])]


class EventBus:
    """Wakes the event watchers after a commit that added events; and tells them, read at
    most once a second for all of them, whether another process added some."""

    def __init__(self) -> None:
        # Resolved, and replaced, by each publish; waiters share it (shielded). It was an
        # asyncio.Condition waited on with wait_for: a watcher cancelled (its client gone)
        # just as its wait timed out left the condition's lock held by a task that had
        # ended, and every later commit that wrote events waited for it forever - the
        # scheduler answered no submission again.
        self._next: asyncio.Future[None] | None = None
        self.version = 0
        self._newest, self._newest_at = 0, -math.inf
        self._reading = asyncio.Lock()

    async def newest_id(self, read: Callable[[], Awaitable[int]], max_age: float = 1.0) -> int:
        """The newest event id in the database (``read``), read again only once ``max_age``
        old: each watcher read it for itself every second, and 1,000 open watches (`get
        events -w`) kept a core busy reading nothing new."""
        async with self._reading:
            if time.monotonic() - self._newest_at >= max_age:
                self._newest = await read()
                self._newest_at = time.monotonic()
        return self._newest

    async def publish(self) -> None:
        self.version += 1
        self._newest_at = -math.inf  # read the newest id again (once) for the watchers it wakes
        woken, self._next = self._next, None
        if woken is not None and not woken.done():
            woken.set_result(None)

    async def wait(self, seen: int, timeout: float) -> int:
        """The version once it is no longer ``seen``, or after ``timeout`` seconds."""
        if self.version == seen:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._next), timeout)
        return self.version


class SchedulerCore:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: Settings | None = None,
        clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.engine = engine
        self.sessions: async_sessionmaker[AsyncSession] = make_sessionmaker(engine)
        sqlite = is_sqlite(engine)
        database = engine.url.database or ""
        # SQLite: every engine's connections on the file the first one opened (SqliteFile).
        pin = sqlite_file(engine) or (SqliteFile(database) if sqlite and database not in ("", ":memory:") else None)
        # SQLite: reads get their own engine so they never wait for the writer's lock.
        self.read_engine = (
            make_engine(engine.url.render_as_string(hide_password=False), readonly=True, pin=pin)
            if sqlite
            else engine
        )
        self.read_sessions = make_sessionmaker(self.read_engine)
        # SQLite has one writer at a time; queueing writers here, in order, avoids
        # SQLite's busy-wait back-off (sleeps of up to 100 ms) under concurrent load.
        # Held by the ORM write transactions (tx); writes on the writer thread
        # (write_sync) queue on that thread instead and only wait while it is held.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if sqlite else None
        # SQLite's submission hot path: a synchronous connection on one dedicated thread.
        self._sync_writer = (
            SqliteWriter(database, pin) if sqlite and database not in ("", ":memory:") else None
        )
        # Its one thread: submissions (urgent) run before queued heartbeats and progress.
        self._writer = WriteQueue("gandiva-sqlite-writer") if self._sync_writer is not None else None
        # SQLite's busiest reads: sync sessions on reader threads (read_sync).
        self._sync_reader = SqliteReader(database, pin) if self._sync_writer is not None else None
        # PostgreSQL's busiest reads and writes, on event loops of their own (LoopThread):
        # a user's (submissions, a job's detail) on one, the bulk (heartbeats, progress,
        # a round's rows) on another, so a user never waits behind a bulk batch. Bulk
        # commits do not wait for the disk (each cost a 4 ms fdatasync here, and a
        # submission's own commit queued behind 50 of them a second): a crash of the
        # database may lose its last heartbeats and progress, which the next ones redo.
        url = engine.url.render_as_string(hide_password=False)
        self._db_threads = None if sqlite else (
            LoopThread(url, "gandiva-db-user", pool=4),
            LoopThread(url, "gandiva-db-bulk", pool=4, durable=False),
        )
        # job id -> (incarnation, steps, rate, last step s, metrics): reported, not yet written.
        self._progress: dict[str, tuple[str, int, float, float, dict[str, float]]] = {}
        self._flusher: asyncio.Task | None = None
        self.settings = settings or Settings()
        # Submissions of users hashed to one lock count and insert one after another, so
        # two sent at once cannot both pass at the limit minus one (_within_quota).
        self._quota_locks = [asyncio.Lock() for _ in range(64)]
        # The wall clock without its backward steps (scheduler.wallclock): a slice, fence or
        # checkpoint interval in progress is not stretched by NTP stepping the clock back.
        real = clock is None or clock is time.time
        self.clock: Callable[[], float] = StepFreeClock() if real or clock is None else clock
        # Whether the database answers, and how the scheduling rounds fare (scheduler.health).
        self.db_health = DatabaseHealth(self.clock)
        # Whether a server is silent is measured on this one (CLOCK_MONOTONIC), never on
        # the wall clock, which NTP or an operator may step: an hour forward used to make
        # every server "silent for 3600s" at once, down, and every job in the cluster
        # killed and re-queued. A test's fake `clock` serves as both.
        self.monotonic = monotonic or (time.monotonic if real else self.clock)
        # A server's silence counts only while this scheduler was there to hear it.
        self.started_mono = self.monotonic()
        # Whether this scheduler surely holds its database (scheduler.state.owner.SchedulerLock.held,
        # set by the server): writes are refused while it does not.
        self.lock_held: Callable[[], bool] = lambda: True
        # How long since the database last showed the lock is this scheduler's (infinite once
        # its session is known lost): SchedulerLock.unconfirmed_s; 0 without a lock.
        self.lock_unconfirmed_s: Callable[[], float] = lambda: 0.0
        self._memory_answers_stopped = False
        self.lock_take_back: Callable[[], Awaitable[bool | None]] = _held
        # The lock asked at once whether it is still this scheduler's (SchedulerLock.confirm).
        self.lock_confirm: Callable[[], Awaitable[bool | None]] = _held
        # When each running job's mini-batches last ended (in memory; the engine judges).
        self.hangs = HangWatch(self.settings.hang_after_s, self.settings.hang_restart_after_s, self.monotonic)
        # Each job's rate measured while it ran alone on its GPUs (a packing trial's baseline):
        # fed by its progress reports, looked at by the engine's snapshots.
        self.alone_rates = AloneRates()
        # Server name -> when (monotonic) its helper's last heartbeat or registration
        # arrived, whether or not the database could record it (unreachable, or locked by
        # another process): a server heard from is not silent (mark_stale_servers_down).
        self._heard: dict[str, float] = {}
        # Server name -> the stale launches (job, incarnation) its last heartbeat said it runs
        # that have had their `job.fenced` event: each such launch gets one while its helper
        # keeps reporting it, not one at every heartbeat (_heartbeat_full). Bounded by the
        # registered servers and the launches one heartbeat may name (MAX_RUNNING_JOBS).
        self._fenced: dict[str, set[tuple[str, str]]] = {}
        # When a heartbeat of each server was last answered while it was not called down
        # (recorded, or answered in a database outage: heartbeat_unrecorded).
        self._vouched: dict[str, float] = {}
        # Jobs re-queued while a copy of theirs still answered (its server down, its helper
        # stopped or hung): that launch, and until when (monotonic) placing the job waits
        # for it to exit at its next boundary as told (old_copy_wait).
        self._old_copies: dict[str, tuple[str, float]] = {}
        # (job id, its fence as written) -> when it ends on the monotonic clock (fence_holds).
        self._fence_ends: dict[tuple[str, float], float] = {}
        # The highest step each launch reported (job, incarnation), written or not: the
        # database keeps only the current launch's, and a migration's destination reports
        # before the migration's end makes it current (steps_seen).
        self._steps_seen: dict[tuple[str, str], int] = {}
        # Exits of a migration's destination (or fallback) launch that came before the
        # migration's end was recorded: applied once it is (replay_early_exit).
        self._early_exits: dict[tuple[str, str], helper_pb2.ProcessExitRequest] = {}
        # (job, server) -> when (monotonic) its last `job.stale_exit` event was written.
        self._stale_exits: dict[tuple[str, str], float] = {}
        # (job, incarnation) -> server, of RUNNING launches (no migration under way) whose job
        # was re-queued when their server went down: a late exit of one, while nothing has
        # launched the job since, settles it (_settles_lost_launch). Bounded: oldest first out.
        self._lost_launches: dict[tuple[str, str], str] = {}
        # When (monotonic) this process was last seen running (watch_stalls; None: not
        # watched, as in unit tests driving a fake clock).
        self._alive_at: float | None = None
        # Server name -> (the instance of the helper that holds it, when last heard from):
        # a second helper started with the same --server-name is refused while the first
        # lives (in memory: after a restart the first helper heard from holds the name).
        self._instances: dict[str, tuple[str, float]] = {}
        # When this scheduler started (monotonic): for the heartbeat timeout after it, a name
        # whose server is up in the database is kept for the helper at its recorded address
        # (_kept_for_its_helper).
        self._born = self.monotonic()
        self._refused: set[tuple[str, str]] = set()  # (name, instance) told so (bounded by helpers started)
        self.events = EventBus()
        self.helpers = HelperHub()
        self.runtimes = RuntimeHub()
        # Set whenever something happened that may change scheduling decisions.
        self.wake = asyncio.Event()
        # Hooks for metrics (gandiva scheduler --http-listen); they do nothing by default.
        self.observer = Observer()
        # Where each waiting job stands as of the last scheduling round (job id -> Wait,
        # scheduler/observe/waits.py), set by the engine; read through wait_of.
        self.waits: dict[str, Wait] = {}
        # (GPUs, name) of the largest server, for the submission check; None: not read yet.
        self._largest: tuple[int, str] | None = None
        # (version, [(name, agent address)]) of the registered helpers; None: read again.
        self._peers: tuple[int, list[tuple[str, str]]] | None = None
        # Bumped at each change of the registered helpers: a list read before it is not kept.
        self._peers_gen = 0
        # (host_memory_use, job_host_memory_bytes) of the policy the engine runs: how
        # server listings count host memory (the engine sets it; the defaults till then).
        defaults = PolicyConfig()
        self.host_memory_budget: tuple[float, int] = (defaults.host_memory_use, defaults.job_host_memory_bytes)

    # ---- transactions ---------------------------------------------------------

    async def dispose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        try:
            await self.flush_progress()  # graceful shutdown keeps the last progress
        except GandivaError as err:
            log.warning("progress not recorded at shutdown: %s", err)
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()
        reader, self._sync_reader = self._sync_reader, None
        if reader is not None:
            await asyncio.get_running_loop().run_in_executor(None, reader.close)
        db_threads, self._db_threads = self._db_threads, None
        for db_thread in db_threads or ():
            await db_thread.close()
        # Idempotent: a scheduler may be stopped twice (a test's restart, then its teardown).
        writer, self._sync_writer = self._sync_writer, None
        if writer is not None and self._writer is not None:
            await asyncio.wrap_future(self._writer.submit(writer.close))
            self._writer.shutdown(wait=False)

    @asynccontextmanager
    async def tx(self, read: bool = False) -> AsyncIterator[AsyncSession]:
        """One transaction; database connectivity failures become Unavailable.
        ``read``: the transaction only reads (on SQLite it does not take the write lock)."""
        wrote_events = False
        lock = None if read else self._write_lock
        if not read:
            await self._check_held()
        with _db_errors(self.db_health):
            if lock is not None:
                await lock.acquire()
            try:
                if lock is not None and self._writer is not None:
                    # Writes queued on the writer thread before this one finish first.
                    await asyncio.wrap_future(self._writer.submit(_nothing, barrier=True))
                async with (self.read_sessions if read else self.sessions)() as session, session.begin():
                    yield session
                    wrote_events = bool(session.info.get("events"))
            finally:
                if lock is not None:
                    lock.release()
        if wrote_events:
            await self.events.publish()

    async def record_when_reachable(self, what: str, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """``fn(session)`` in one write transaction, tried again every 0.2-2 s for as long
        as the database is unreachable (or full), until it is written. For the record of
        what already happened outside the database (a migration's end, a command a job
        obeyed): given up on, the job's state would contradict its processes for good (a
        migration that ended during a database outage left its job MIGRATING, its
        destination training unseen, until the scheduler was restarted). ``fn`` reads what
        it changes again each time (a commit whose answer was lost may have happened)."""
        return await self.when_reachable(fn, what=what)

    async def when_reachable(self, fn: Callable[[AsyncSession], Awaitable[T]], *, read: bool = False,
                             within_s: float = math.inf, what: str = "") -> T:
        """``fn(session)`` in one transaction (``read``: a read one), tried again every
        0.2-2 s while the database is unreachable (or full), for up to ``within_s`` (then
        Unavailable). ``what``: said once in a warning when the first try fails."""
        loop = asyncio.get_running_loop()
        deadline, delay, said = loop.time() + within_s, 0.2, False
        while True:
            try:
                async with self.tx(read=read) as s:
                    return await fn(s)
            except Unavailable as err:
                if loop.time() + delay > deadline:
                    raise
                if what and not said:
                    log.warning("%s: not recorded yet, tried again until the database is back: %s", what, err)
                    said = True
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def write_sync(self, fn: Callable[[Connection], T], urgent: bool = False) -> T:
        """``fn(connection)`` in one write transaction of plain (Core) statements, for the
        busiest writes. On SQLite it runs whole on the writer thread: one hop off the
        event loop instead of one per statement; on PostgreSQL on the database thread's
        own event loop (LoopThread). ``fn`` must not add events (watchers are not woken).

        On the writer thread, writes queue there and run back to back, each its own
        transaction: no turn of the event loop between two (under load, waiting for
        that turn, once per write, was most of a submission's time). Only an ORM write
        transaction (tx) holds them back, while it runs. ``urgent``: a user waits for
        it (a submission): it runs before the bulk writes queued (see WriteQueue)."""
        await self._check_held()
        with _db_errors(self.db_health):
            if self._sync_writer is not None:
                assert self._write_lock is not None and self._writer is not None
                writer, sync_writer = self._writer, self._sync_writer
                while self._write_lock.locked():
                    async with self._write_lock:
                        pass
                # Queued now, with no await since the check: a tx that takes the lock
                # after this waits for it on the writer thread (see tx).
                return await asyncio.wrap_future(writer.submit(partial(sync_writer.call, fn), urgent))
            if self._db_threads is not None:
                return await self._db_threads[0 if urgent else 1].write(fn)
            # The lock: SQLite in memory only.
            async with self._write_lock or nullcontext(), self.engine.begin() as conn:
                return await conn.run_sync(fn)

    async def _check_held(self) -> None:
        """Unavailable while this scheduler's hold on its database is lost (`lock_held`) and
        cannot be taken back now (`lock_take_back`): a write then could land beside another
        scheduler's that took the database meanwhile (its lock's session ended by a restart
        or a partition). Before, on a partition's heal the scheduler wrote (placed jobs,
        answered submissions) until its lock's watch found the other holder, up to 2 s later."""
        if not self.lock_held() and not await self.lock_take_back():
            # Said as an outage: /metrics and the dashboard say it too.
            raise Unavailable(self.db_health.unreachable("its lock's connection dropped: no write until the "
                                                         "lock is taken back") + "; retry shortly")
        # Its session reads open but went unheard long enough for PostgreSQL to have ended it
        # (this host frozen, a paused VM): asked first. Its socket reads open until it sends,
        # and it wrote beside a standby that took the database until the watch's next query.
        if self.lock_unconfirmed_s() > PG_SESSION_END_MIN_S:
            try:
                confirmed = await asyncio.wait_for(asyncio.shield(self.lock_confirm()), LOCK_CONFIRM_WAIT_S)
            except TimeoutError:
                # Not answered yet (a slow or cut-off database, the query going on): the write
                # goes on and meets the database as it is. A frozen host's lost session answers
                # at once (its server resets the connection).
                confirmed = True
            if not confirmed:
                raise Unavailable(self.db_health.unreachable("its hold on the database is not confirmed: no "
                                                             "write until it is") + "; retry shortly")

    async def read_sync(self, fn: Callable[[Session], T], urgent: bool = False) -> T:
        """``fn(session)`` on a sync session, in one read transaction: on SQLite whole on
        a reader thread (one hop off the event loop; see SqliteReader), on PostgreSQL on
        the database thread's loop (LoopThread)."""
        with _db_errors(self.db_health):
            if self._sync_reader is not None:
                return await asyncio.get_running_loop().run_in_executor(
                    self._sync_reader.threads, self._sync_reader.call, fn)
            if self._db_threads is not None:
                return await self._db_threads[0 if urgent else 1].read(fn)
            async with self.read_sessions() as session, session.begin():
                return await session.run_sync(fn)

    def poke(self) -> None:
        self.wake.set()

    # ---- submission -----------------------------------------------------------

    def _job_row(self, spec: common_pb2.JobSpec, now: float, multi_job_id: str | None) -> Job:
        return Job(
            id=repo.new_id("j"),
            name=default_name(spec),
            command=list(spec.command),
            workdir=spec.workdir,
            env=dict(spec.env),
            gpus=spec.gpus,
            priority=spec.priority,
            grow_shrink=spec.grow_shrink,
            user=spec.user,
            multi_job_id=multi_job_id,
            array_index=spec.index,
            params=dict(spec.params),
            state=JobState.QUEUED.value,
            incarnation="",
            steps=0,
            total_steps=spec.steps,
            total_steps_from="spec" if spec.steps else "",
            rate=0.0,
            rate_at=0.0,
            last_step_s=0.0,
            metrics={},
            migratable=True,
            suspendable=True,
            control_note="",
            grow_shrink_note="",
            held=False,
            message="waiting for a placement",
            exit_code=0,
            submitted_at=now,
            updated_at=now,
            started_at=0.0,
            state_changed_at=now,
            finished_at=0.0,
            restore_checkpoint="",
            restore_server="",
            restore_step=0,
            attained_service_s=0.0,
            fenced_until=0.0,
        )

    async def _largest_server(self) -> tuple[int, str]:
        """(GPUs, name) of the largest registered server; (0, "") before any registers."""
        if self._largest is None:
            async with self.tx(read=True) as s:
                self._largest = await repo.largest_server(s)
        return self._largest

    async def _check_fits_one_server(self, spec: common_pb2.JobSpec, field: str = "spec.gpus") -> None:
        """No launch spans servers yet: a job larger than every server would never run
        (or run on part of its GPUs), so it is refused now, with the largest named."""
        gpus, name = await self._largest_server()
        if gpus and spec.gpus > gpus:
            raise InvalidArgument(
                field,
                f"{spec.gpus} GPUs do not fit on one server: the largest, {name}, has {gpus}; "
                f"jobs spanning servers are not supported yet, so ask for {gpus} or fewer",
            )

    async def _once(
        self, key: str | None, earlier: Callable[[str], Awaitable[T | None]], create: Callable[[], Awaitable[T]],
    ) -> T:
        """``create()``, unless a submission with this request key was taken before: then
        what it created (``earlier``). Two copies sent at once: the database's unique index
        lets one insert win, and the other answers with its result."""
        if key is not None:
            found = await earlier(key)
            if found is not None:
                return found
        try:
            return await create()
        except (sa_exc.IntegrityError, ResourceExhausted):
            # A copy sent at once that won the insert (and so may have filled the quota).
            found = await earlier(key) if key is not None else None
            if found is None:
                raise
            return found

    @asynccontextmanager
    async def _within_quota(self, user: str, adding: int, limited: bool) -> AsyncIterator[None]:
        """Runs the block (the insert) only if ``user`` stays within --max-jobs-per-user with
        ``adding`` more jobs; counting and inserting hold a lock of this user's (one
        scheduler owns its database: DatabaseHeld), so concurrent submissions see each
        other's jobs. ``limited`` False (an operator) or a limit of 0: no check."""
        limit = self.settings.max_jobs_per_user
        if not limited or not limit:
            yield
            return
        async with self._quota_locks[hash(user) % len(self._quota_locks)]:
            await self._quota_check(user, adding)
            yield

    async def _quota_check(self, user: str, adding: int) -> None:
        """ResourceExhausted if ``user`` would pass --max-jobs-per-user with ``adding`` more jobs."""
        limit = self.settings.max_jobs_per_user
        if not limit:
            return
        count = await self.read_sync(lambda s: repo.unfinished_jobs(s, user), urgent=True)
        if count + adding > limit:
            more = f"; these {adding} would make {count + adding}" if adding > 1 else ""
            raise ResourceExhausted(
                f"user {user or '(none)'!r} has {count} jobs not yet ended (queued, running or suspended){more}; "
                f"the scheduler takes at most {limit} per user (--max-jobs-per-user): wait for some to end "
                f"or kill some (gandiva kill ID), or ask the operator to raise --max-jobs-per-user")

    async def submit(self, spec: common_pb2.JobSpec, dry_run: bool = False, request_id: str = "",
                     limited: bool = False) -> JobDetail:
        """``limited``: the caller is held to --max-jobs-per-user (a user's, not an operator's, call)."""
        validate_spec(spec)

        async def create() -> JobDetail:
            await self._check_fits_one_server(spec)
            async with self._within_quota(spec.user, 1, limited):
                now = self.clock()
                job = self._job_row(spec, now, None)
                job.request_key = key
                if not dry_run:
                    await self._insert_jobs([job], now)
            return JobDetail(job, [])

        key = request_key(spec.user, request_id)
        return await self._once(None if dry_run else key,
                                lambda k: self._submitted_before(k, spec, request_id), create)

    async def _submitted_before(self, key: str, spec: common_pb2.JobSpec, request_id: str) -> JobDetail | None:
        """The job an earlier submission with this request id created (None: there was
        none); ALREADY_EXISTS when that submission asked for something else."""
        def read(s: Session) -> JobDetail | None:
            job = repo.job_by_request(s, key)
            return None if job is None else JobDetail(*repo.job_detail(s, job.id))

        found = await self.read_sync(read, urgent=True)
        if found is None:
            return None
        differs = _spec_differences(found.job, spec)
        if differs:
            raise AlreadyExists(
                f"request_id {request_id!r} was used for job {found.job.id}, which differs in "
                f"{', '.join(differs)}: a new submission needs a new request id")
        return found

    async def submit_multi(
        self, name: str, specs: Sequence[common_pb2.JobSpec], dry_run: bool = False, request_id: str = "",
        limited: bool = False,
    ) -> tuple[str, list[JobDetail]]:
        validate_members(name, len(specs))
        if specs and limited:
            # Refused before each member is checked and built: a refused multi-job of 10,000
            # members held the event loop 2-3 s, and four clients sending them again and
            # again kept every other caller waiting 6-8 s. A request taken before (sent
            # again) still answers with what it made.
            validate_spec(specs[0], field="jobs[0]")  # its user is counted
            try:
                await self._quota_check(specs[0].user, len(specs))
            except ResourceExhausted:
                key = request_key(specs[0].user, request_id)
                found = None if dry_run or key is None else await self._multi_submitted_before(
                    key, name, specs, request_id)
                if found is None:
                    raise
                return found
        for i, spec in enumerate(specs):
            validate_spec(spec, field=f"jobs[{i}]")

        async def create() -> tuple[str, list[JobDetail]]:
            for i, spec in enumerate(specs):
                await self._check_fits_one_server(spec, field=f"jobs[{i}].gpus")
            now = self.clock()
            mj = MultiJob(id=repo.new_id("mj"), name=name or default_name(specs[0]), created_at=now, request_key=key)
            jobs = [self._job_row(spec, now, mj.id) for spec in specs]
            # Members given indices keep them (0 included: `--array 3,0`); otherwise a member's
            # index is its position.
            explicit = any(spec.index for spec in specs)
            taken: dict[int, int] = {}
            for i, job in enumerate(jobs):
                job.array_index = specs[i].index if explicit else i
                if job.array_index in taken:
                    raise InvalidArgument(f"jobs[{i}].index", f"{job.array_index} is also jobs[{taken[job.array_index]}]'s; "
                                                              f"give each member its own index (or none to number "
                                                              f"them by position)")
                taken[job.array_index] = i
            async with self._within_quota(specs[0].user, len(jobs), limited):
                if not dry_run:
                    await self._insert_jobs(jobs, now, mj)
            return mj.id, [JobDetail(j, []) for j in jobs]

        key = request_key(specs[0].user, request_id)
        return await self._once(None if dry_run else key,
                                lambda k: self._multi_submitted_before(k, name, specs, request_id), create)

    async def _multi_submitted_before(
        self, key: str, name: str, specs: Sequence[common_pb2.JobSpec], request_id: str,
    ) -> tuple[str, list[JobDetail]] | None:
        def read(s: Session) -> tuple[MultiJob, list[JobDetail]] | None:
            found = repo.multi_job_by_request(s, key)
            return None if found is None else (found[0], [JobDetail(*repo.job_detail(s, j.id)) for j in found[1]])

        found = await self.read_sync(read, urgent=True)
        if found is None:
            return None
        mj, members = found
        explicit = any(spec.index for spec in specs)
        wanted = sorted(((spec.index if explicit else i), spec) for i, spec in enumerate(specs))
        differs: list[str] = []
        if name and name != mj.name:
            differs.append("name")
        if len(members) != len(wanted):
            differs.append(f"the number of jobs ({len(members)} then, {len(wanted)} now)")
        else:
            for member, (index, spec) in zip(members, wanted, strict=True):
                if member.job.array_index != index or _spec_differences(member.job, spec):
                    differs.append(f"job {index}")
                    break
        if differs:
            raise AlreadyExists(
                f"request_id {request_id!r} was used for multi-job {mj.id}, which differs in "
                f"{', '.join(differs)}: a new submission needs a new request id")
        return mj.id, members

    async def _insert_jobs(self, jobs: Sequence[Job], now: float, mj: MultiJob | None = None) -> None:
        """One transaction. On SQLite plain INSERTs run whole on the writer thread, ahead
        of the bulk writes queued there (one hop instead of about fourteen between the
        event loop and aiosqlite's thread); on PostgreSQL one statement on the users'
        database loop (job_insert_statement: one round trip instead of five or six)."""
        one = repo.job_insert_statement(jobs, now, mj) if self._db_threads is not None else None
        if one is not None and self._db_threads is not None:
            await self._check_held()  # (write_sync and tx check it themselves)
            with _db_errors(self.db_health):
                await self._db_threads[0].execute(one)
            await self.events.publish()
        elif self._sync_writer is not None or self._db_threads is not None:
            statements = repo.job_inserts(jobs, now, mj)
            await self.write_sync(lambda conn: execute_all(conn, statements), urgent=True)
            await self.events.publish()
        else:  # SQLite in memory
            async with self.tx() as s:
                await repo.add_jobs(s, jobs, now, mj)
        self.poke()

    # ---- reads ----------------------------------------------------------------

    def wait_of(self, job: Job) -> str:
        """Where the job stands while it waits ("" if it does not, or if it changed state
        since the last round: never a place or turn computed for another state)."""
        wait = self.waits.get(job.id)
        return wait.render(self.clock()) if wait is not None and wait.state == job.state else ""

    async def get_job(self, job_id: str) -> JobDetail:
        if not job_id:
            raise InvalidArgument("id", "a job id is required")
        detail = JobDetail(*await self.read_sync(lambda s: repo.job_detail(s, job_id), urgent=True))
        return replace(detail, wait=self.wait_of(detail.job), alone_rate=self.alone_rates.latest.get(job_id, 0.0))

    async def list_jobs(
        self, states: Sequence[JobState] = (), multi_job_id: str = "", limit: int = 0,
        user: str | None = None, after: tuple[float, int, str] | None = None,
    ) -> list[JobDetail]:
        async with self.tx(read=True) as s:
            jobs = await repo.list_jobs(s, states, multi_job_id, limit, user, after)
            placements = await repo.placements_of(s, [j.id for j in jobs])
            host = await repo.host_memory_of(s, [j.id for j in jobs])
            sharers = await repo.sharers_of(s, placements)
        return [JobDetail(j, _gpus_of(placements, j.id), host_memory_bytes=host.get(j.id, 0),
                          sharers=sharers.get(j.id, ()), wait=self.wait_of(j),
                          alone_rate=self.alone_rates.latest.get(j.id, 0.0)) for j in jobs]

    async def list_servers(self) -> list[repo.ServerLoad]:
        async with self.tx(read=True) as s:
            return await repo.server_loads(s)

    async def list_events(
        self, after_id: int = 0, job_id: str = "", limit: int = 0, user: str | None = None
    ) -> Sequence[Event]:
        async with self.tx(read=True) as s:
            return await repo.list_events(s, after_id, job_id, limit, user)

    async def last_event_id(self) -> int:
        async with self.tx(read=True) as s:
            return await repo.last_event_id(s)

    # ---- user and operator actions --------------------------------------------

    @staticmethod
    async def _unfinished_job(s: AsyncSession, job_id: str) -> Job:
        """The job, locked for update; FailedPrecondition if it already ended."""
        job = await repo.get_job(s, job_id, for_update=True)
        if JobState(job.state).terminal:
            raise FailedPrecondition(f"job {job_id} already ended ({job.state})")
        return job

    async def kill(self, job_id: str, reason: str = "") -> JobDetail:
        reason = reason or "killed by user"
        async with self.tx() as s:
            job = await self._unfinished_job(s, job_id)
            placement = await repo.placements_of(s, [job_id])
            stops = {(p.server_name, job.incarnation) for p in placement.get(job_id, [])}
            migration = await repo.get_migration(s, job_id)
            if migration is not None:
                # Killed mid-migration: the pre-warmed destination (and a restart at the
                # source, if the migration fell back to one) must stop too.
                stops |= {(migration.dest_server, migration.dest_incarnation),
                          (migration.source_server, migration.fallback_incarnation)}
            await repo.finish(s, job, JobState.KILLED, self.clock(), reason)
        for server, incarnation in sorted(stops):
            self.stop_on(server, job_id, incarnation, reason)
        self.poke()
        return await self.get_job(job_id)

    def stop_on(self, server: str, job_id: str, incarnation: str, reason: str) -> asyncio.Future:
        """Tell `server`'s helper to stop that launch of the job (fire and forget; the
        heartbeat fencing stops it anyway if this command is lost), and its shim, if it is
        connected, to exit at its next boundary: a helper hung or stopped (its server
        down, its host fine) carries out nothing, and a migration's destination that had
        activated trained on beside the job's restart at its source until it came back."""
        if self.runtimes.kill_stale(job_id, incarnation, f"stopped: {reason}"):
            log.warning("job %s: launch %s on %s told to exit through its own stream (%s)", job_id, incarnation,
                        server, reason)
        fut = self.helpers.send(
            server,
            helper_pb2.HelperCommand(
                stop=helper_pb2.StopJob(job_id=job_id, incarnation=incarnation, reason=reason)
            ),
        )
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        return fut

    async def set_priority(self, job_id: str, priority: int) -> JobDetail:
        check_priority("priority", priority)  # the limits a submission has
        async with self.tx() as s:
            job = await self._unfinished_job(s, job_id)
            old = job.priority
            job.priority = priority
            job.updated_at = self.clock()
            repo.add_event(s, job.updated_at, "job.priority", f"{old} -> {priority}", job_id=job_id)
        self.poke()
        return await self.get_job(job_id)

    # ---- helpers --------------------------------------------------------------

    def _claim_name(self, name: str, instance: str, now: float) -> bool:
        """Whether helper `instance` may speak for server `name`: no other instance has
        been heard from under that name within `down_after_s` (a helper with no instance,
        an older one, is not checked). A helper that may is the name's holder from now on.
        `now`: the monotonic clock's."""
        if not instance:
            return True
        held = self._instances.get(name)
        if held is not None and held[0] != instance and now - held[1] < self.settings.down_after_s:
            return False
        self._instances[name] = (instance, now)
        return True

    async def _kept_for_its_helper(self, req: helper_pb2.RegisterServerRequest, mono: float) -> str:
        """Why a registration is refused ("" when it is not) because this scheduler started
        less than the heartbeat timeout ago and the name's server is up in the database at
        another agent address: its live helper, which held the name before the restart, gets
        that time to register again. The holder is kept in memory only, so after a restart
        the first helper heard took the name: a second helper started under the same
        --server-name on another host (refused while the scheduler ran) took it from the live
        one half the time, its jobs were taken for lost ("its process on S was lost") and
        placed again, on the impostor's host, their checkpoints left on the real one's."""
        if not req.instance or mono - self._born >= self.settings.down_after_s:
            return ""
        async with self.tx() as s:
            row = await s.get(Server, req.name)
            held_at = row.address if row is not None and row.up else ""  # the address of a server up
        if not held_at or held_at == req.address:
            return ""
        wait = self.settings.down_after_s - (mono - self._born)
        return (f"server name {req.name} is held by the helper at {held_at} (up when this scheduler started, "
                f"{mono - self._born:.1f}s ago), not this one at {req.address or 'no agent address'}: it is given "
                f"{self.settings.down_after_s:.0f}s to register again. If two helpers were started with "
                f"--server-name {req.name}, give this one its own name; if this is {req.name}'s helper back at "
                f"another address, nothing is to be done: it retries and gets its name in {wait:.0f}s at most")

    def _restore_name(self, name: str, holder: tuple[str, float] | None, heard: float | None) -> None:
        """Undo a registration's claim of `name` and its being heard (it was refused)."""
        if holder is None:
            self._instances.pop(name, None)
        else:
            self._instances[name] = holder
        if heard is None:
            self._heard.pop(name, None)
        else:
            self._heard[name] = heard

    async def register_server(self, req: helper_pb2.RegisterServerRequest) -> None:
        if not req.name:
            raise InvalidArgument("name", "a server name is required")
        if not req.gpus:
            raise InvalidArgument("gpus", f"server {req.name} reported no GPUs")
        now, mono = self.clock(), self.monotonic()
        before, heard_before = self._instances.get(req.name), self._heard.get(req.name)
        kept_for = await self._kept_for_its_helper(req, mono) if before is None else ""
        if kept_for:
            self._heard[req.name] = mono  # as below: tries count as the server heard from
            raise FailedPrecondition(kept_for)
        if not self._claim_name(req.name, req.instance, mono):
            # Its tries count as the server heard from (first of all: the event below needs the
            # database): the name comes free the very moment a round could call the server
            # down, and that round used to come first, re-queueing the jobs before the
            # registration could bring the exits its predecessor left (a finished job run
            # again). The server still goes down then, by this registration replacing the old
            # helper (tests/scheduler/api/test_helper_replaced.py -k outrun).
            self._heard[req.name] = mono
            other, heard = self._instances[req.name]
            free_in = self.settings.down_after_s - (mono - heard)
            if (req.name, req.instance) not in self._refused:  # once per helper: it retries
                self._refused.add((req.name, req.instance))
                log.warning("refused helper %s (instance %s) at %s: the name is held by live instance %s",
                            req.name, req.instance[:8], req.address or "no agent address", other[:8])
                async with self.tx() as s:
                    repo.add_event(s, now, "server.refused", f"a second helper (instance {req.instance[:8]}, agent "
                                   f"{req.address or 'none'}) asked for this name, held by live instance "
                                   f"{other[:8]}: two helpers share --server-name {req.name}, or its helper "
                                   f"restarted (a crash, a reboot) less than {self.settings.down_after_s:.0f}s after "
                                   "the old one's last heartbeat: then it gets the name by itself once that has passed",
                                   server=req.name)
            # A helper restarted at once after a crash (systemd's Restart=) is refused too,
            # until its old instance has been silent the heartbeat timeout: it used to be told
            # only to rename itself (its jobs' checkpoints live under its name).
            raise FailedPrecondition(
                f"server name {req.name} is held by another live helper (instance {other[:8]}, heard from "
                f"{mono - heard:.1f}s ago): two helpers were started with --server-name {req.name}; give this "
                f"one its own name, or stop the other (its name is free {free_in:.0f}s after its last heartbeat). "
                f"If this is {req.name}'s own helper restarted after a crash or a reboot, nothing is to be done: "
                f"it retries and gets its name in {free_in:.0f}s")
        self._heard[req.name] = mono
        gpus = [
            Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_total=g.memory_total_bytes,
                memory_used=g.memory_used_bytes,
                utilization=g.utilization,
                sampled_at=now,
            )
            for g in req.gpus
        ]
        stops: list[tuple[str, str, str]] = []
        # Another instance of its helper held the name (silent the heartbeat timeout by now):
        # a helper restarted, its host rebooted. The new one runs none of the old one's
        # processes (it kills what that one left), so a server not called down yet goes
        # down first: its jobs re-queued now, the old helper's unanswered commands failed,
        # not sent again to the new one. Before, when this registration came before the
        # round that would call the server down, the server stayed up and its jobs RUNNING,
        # re-queued only a heartbeat timeout later ("its process on S was lost").
        replaced = before[0] if before is not None and req.instance and before[0] != req.instance else ""
        down_stops: list[tuple[str, str, str]] = []
        lost: list[tuple[str, str]] = []
        # Exits its stopped predecessor could not deliver (the database unreachable then),
        # first: a job that finished is recorded so before the server's jobs are re-queued
        # below. Before, such a job was trained again (tests/migration_helper/
        # test_helper_faults.py -k restarted_meanwhile). Each in its own transaction: one
        # that cannot be applied is said and passed over, never a registration refused for
        # good (the helper would send it again and again, its jobs frozen).
        for x in await self._exits_that_matter(req.name, req.exits):
            try:
                async with self.tx() as s:
                    await self._process_exit(s, x, now)
            except Unavailable:
                raise
            except GandivaError as err:
                log.warning("server %s: the exit of job %s (launch %s) its earlier helper left was not applied: %s",
                            req.name, x.job_id, x.incarnation, err)
        async with self.tx() as s:
            old = await s.get(Server, req.name) if replaced else None
            if old is not None and old.up:
                await self._take_down(s, old, now, f"its helper was replaced: instance {replaced[:8]} silent, "
                                      f"{req.instance[:8]} registered", "restarted its helper", down_stops, lost)
            else:
                replaced = ""
            # One agent address, one server: the scheduler finds a transfer's destination, and
            # makes its ticket, by address. A helper registering another's (a copied config, or
            # a helper token used to break another server's migrations) made every checkpoint
            # sent to that address carry a ticket for the wrong server, refused there.
            holder = await repo.server_at(s, req.address) if req.address else None
            if holder is not None and holder.name != req.name and holder.up:
                # Refused for good (until that server goes): neither heard from nor the name's
                # holder. Its tries used to count as the server heard from, so a server whose
                # new helper came with another's address (a copied config) never went down:
                # its jobs RUNNING there, processless, for good (tests/scheduler/api/
                # test_helper_replaced.py -k another_servers).
                self._restore_name(req.name, before, heard_before)
                raise FailedPrecondition(
                    f"agent address {req.address} is that of server {holder.name}, which is up: two helpers "
                    f"cannot share one (checkpoints for one would go to the other); give this one its own "
                    f"--listen address, or stop {holder.name}'s helper (the address is free once that server "
                    f"is marked down, {self.settings.down_after_s:.0f}s after its last heartbeat)")
            created = await repo.upsert_server(
                s, req.name, req.address, gpus, req.ramdisk, req.shared_root, now, req.host_memory_bytes
            )
            # A helper back with fewer GPUs (one failed, or CUDA_VISIBLE_DEVICES changed): a job
            # on a GPU it no longer reports has nowhere to run there, so it goes back to the queue.
            indices = {g.index for g in gpus}
            placed = await repo.jobs_on_server(s, req.name)
            where = await repo.placements_of(s, [j.id for j in placed])
            for job in placed:
                gone = sorted(p.gpu_index for p in where[job.id] if p.server_name == req.name
                              and p.gpu_index not in indices)
                if gone and JobState(job.state) in ACTIVE:
                    stops.append((req.name, job.id, job.incarnation))
                    why = f"its GPU(s) {', '.join(map(str, gone))} on {req.name} are no longer reported by the server's helper"
                    migration = await repo.get_migration(s, job.id)
                    if migration is not None:
                        stops.append((migration.dest_server, job.id, migration.dest_incarnation))
                        if migration.step >= 0 and migration.checkpoint_path:
                            # Its source (this server) confirmed the migration's checkpoint and
                            # exited: the job resumes from it (as when its server goes down),
                            # not from an older checkpoint or step 0.
                            stops.append((req.name, job.id, migration.fallback_incarnation))
                            why += f" mid-migration; {await repo.resume_from_migration(s, job, migration)}"
                    await repo.requeue(s, job, now, why)
            self._largest = await repo.largest_server(s)
            repo.add_event(
                s,
                now,
                "server.registered" if created else "server.up",
                f"{len(gpus)} GPU(s) at {req.address or '-'}, host memory for jobs "
                f"{format_size(req.host_memory_bytes) if req.host_memory_bytes else 'not reported'}",
                server=req.name,
            )
        # A new helper, or one at a new address: dropped once committed, and a list whose
        # read began before is not kept (peers). Dropped inside the transaction, a heartbeat
        # reading between that and the commit kept the list without this helper for good,
        # and every checkpoint streamed to it was refused ("not the agent address of a
        # registered helper"), each move falling back to a restart at its source.
        self._peers, self._peers_gen = None, self._peers_gen + 1
        for x in req.exits:
            if (x.job_id, x.incarnation) not in self._early_exits:
                self._steps_seen.pop((x.job_id, x.incarnation), None)
        if replaced:
            self._after_down([req.name], down_stops, lost)
        for server, job_id, incarnation in stops:
            self.stop_on(server, job_id, incarnation, f"its GPUs on {req.name} are gone")
        self.poke()

    async def peers(self) -> tuple[int, list[tuple[str, str]]]:
        """(version, [(name, agent address)]) of the registered helpers: the only agents a
        helper streams checkpoints to. The version is a digest of the list, so it is the
        same after a scheduler restart if the list is."""
        if self._peers is not None:
            return self._peers
        gen = self._peers_gen
        async with self.tx(read=True) as s:
            agents = await repo.helper_agents(s)
        digest = hashlib.sha256(repr(agents).encode()).digest()
        peers = (int.from_bytes(digest[:7], "big") or 1, agents)
        if gen == self._peers_gen:  # no registration since the read began: keep it
            self._peers = peers
        return peers

    async def kept_checkpoints(self, server: str) -> list[str]:
        """The checkpoints on `server` its helper must keep (repo.kept_checkpoints)."""
        async with self.tx(read=True) as s:
            return await repo.kept_checkpoints(s, server)

    async def read_log(self, job_id: str, offset: int, max_bytes: int) -> tuple[str, helper_pb2.HelperCommandResult]:
        """Part of the job's output, from the helper of the server it runs or ran on last:
        (that server, the helper's answer); ("", nothing) for a job that has not run on
        any server yet. The caller checks who may read it."""
        async with self.tx(read=True) as s:
            server = await repo.last_server(s, job_id)
            row = await s.get(Server, server) if server else None
        if not server:  # it has not run anywhere yet: no output, and nowhere to ask
            return "", helper_pb2.HelperCommandResult(ok=True)
        if row is not None and not row.up:
            # The command waited in its queue for the helper's 60-s timeout, and the client gave
            # up first: "the scheduler ... did not answer in time; is it overloaded or stuck?".
            raise FailedPrecondition(
                f"server {server}, which holds the job's output, is down (no heartbeat since "
                f"{time.strftime('%H:%M:%S %Z', time.localtime(row.last_heartbeat))}): read it once its "
                f"helper is back, or on that machine with gandiva logs --local {job_id}")
        result = await self.helpers.call(server, helper_pb2.HelperCommand(read_log=helper_pb2.ReadLog(
            job_id=job_id, offset=offset, max_bytes=max_bytes)), self.settings.command_timeout_s)
        if not result.ok:
            raise FailedPrecondition(f"server {server}: {result.message}")
        return server, result

    async def known_server(self, name: str) -> None:
        """NotFound unless `name` is registered (its helper must Register first)."""
        async with self.tx(read=True) as s:
            await repo.get_server(s, name)

    async def heartbeat(
        self, name: str, running: Sequence[tuple[str, str]] = (), instance: str = ""
    ) -> tuple[bool, list[helper_pb2.StopJob], Sequence | None]:
        """Record a heartbeat; (whether the server is known, the processes it runs that
        the scheduler does not expect there and that must stop, the rows of the jobs
        placed there for LiveEngine.reconcile_server, or None when not read).

        `running`: the (job, incarnation) pairs the helper runs. A pair is stale when
        the job ended, moved, was re-placed while this server was cut off, or that
        launch was withdrawn: only the current launch (and a migration's destination
        or fallback) may run, which keeps at most one live copy of every job.

        A server that is up and runs nothing stale (nearly every heartbeat) takes one
        transaction of plain statements (repo.heartbeat_fast); otherwise the full path.

        `instance`: the helper's (RegisterServerRequest.instance); a heartbeat of another
        helper than the name's live holder is answered "not known", and its registration
        is refused while that holder lives."""
        now, mono = self.clock(), self.monotonic()
        if not self.heard(name, instance, mono):
            return False, [], None
        beat = await self.write_sync(lambda conn: repo.heartbeat_fast(conn, name, now, running))
        if beat is not None and not beat.stale:
            self._vouched[name] = mono
            return True, [], beat.placed
        known, stop = await self._heartbeat_full(name, now, running)
        if known:
            self._vouched[name] = mono
        return known, stop, None

    def heard(self, name: str, instance: str, mono: float | None = None) -> bool:
        """A heartbeat of helper ``instance`` for ``name`` arrived (``mono``: when, on the
        monotonic clock; now by default): whether it may speak for that name (`_claim_name`),
        and if so the server was heard from (in memory, whether recorded or not)."""
        mono = self.monotonic() if mono is None else mono
        if not self._claim_name(name, instance, mono):
            return False
        self._heard[name] = mono
        return True

    def heartbeat_unrecorded(self, name: str) -> bool:
        """A heartbeat of ``name`` that could not be recorded (the database unreachable):
        whether it is answered all the same (no stops: they need the database), which
        renews the helper's lease and keeps its session, so that its reports (a
        migration's activation, a job's exit) still reach this scheduler. Only while the
        server has been heard from with gaps under ``down_after_s`` since a heartbeat that
        was recorded: such a server cannot have been called down, nor its jobs placed
        elsewhere, meanwhile. Before, every helper's session ended at the first refused
        heartbeat and its registration was refused until the database was back: nothing
        it reported arrived, and its jobs froze once the lease ran out."""
        if not self.vouched(name):
            return False
        # Never past the moment another scheduler could act on this one's servers: once
        # PostgreSQL ends this scheduler's session (PG_SESSION_END_MIN_S at the earliest
        # after it last heard it), a standby may take the database, and it calls this one's
        # servers down `down_after_s` after it starts. Helpers answered from memory until
        # then freeze their jobs at their lease (and LEASE_MARGIN_S), before it does. Before,
        # a scheduler cut off from its database but not from its helpers renewed their
        # leases for the whole cut, while a standby ran the same jobs elsewhere.
        unconfirmed = self.lock_unconfirmed_s()
        if unconfirmed > self.memory_answers_s():
            if not self._memory_answers_stopped:
                self._memory_answers_stopped = True
                log.warning("the database has not confirmed this scheduler's hold on it for %.1fs: helpers are no "
                            "longer answered from memory and freeze their jobs at their lease (another scheduler "
                            "may take the database meanwhile)", unconfirmed)
            return False
        self._memory_answers_stopped = False
        self._vouched[name] = self.monotonic()
        return True

    def memory_answers_s(self) -> float:
        """How long after the database last confirmed this scheduler's lock its helpers'
        heartbeats may still be answered from memory (`heartbeat_unrecorded`)."""
        return PG_SESSION_END_MIN_S + self.settings.down_after_s - self.settings.lease - LEASE_MARGIN_S

    def vouched(self, name: str) -> bool:
        """Whether a heartbeat of ``name`` not recorded now would be answered all the same
        (`heartbeat_unrecorded`), without counting as one."""
        return self.monotonic() - self._vouched.get(name, -math.inf) < self.settings.down_after_s

    async def _heartbeat_full(
        self, name: str, now: float, running: Sequence[tuple[str, str]]
    ) -> tuple[bool, list[helper_pb2.StopJob]]:
        async with self.tx() as s:
            server = await repo.heartbeat(s, name, now)
            if server is None:
                return False, []
            if not server.up:
                server.up = True
                await repo.server_up(s, name, server.num_gpus, now)
                repo.add_event(s, now, "server.up", "heartbeats resumed", server=name)
                self.poke()
            stale = sorted(set(running) - await repo.expected_incarnations(s, name)) if running else []
            # Every stale launch is told to stop; the events are bounded: a helper (or anyone,
            # without --auth token) naming 10,000 launches wrote 10,000 rows at each heartbeat,
            # for jobs that never existed too. Now only a job of this scheduler's gets one, once
            # while its helper keeps reporting that launch, and at most FENCED_EVENTS_PER_BEAT a
            # heartbeat (the others have theirs at the next heartbeats, if still reported).
            told = self._fenced.get(name, set()) & set(stale)
            new = [pair for pair in stale if pair not in told]
            real = await repo.existing_job_ids(s, [job_id for job_id, _ in new]) if new else set()
            for job_id, incarnation in [pair for pair in new if pair[0] in real][:FENCED_EVENTS_PER_BEAT]:
                repo.add_event(
                    s, now, "job.fenced", f"stale launch {incarnation or '(none)'} told to stop",
                    job_id=job_id, server=name,
                )
                told.add((job_id, incarnation))
        self._fenced[name] = told  # once written: a heartbeat whose write failed tells them again
        return True, [
            helper_pb2.StopJob(job_id=j, incarnation=i, reason="not the launch the scheduler expects here")
            for j, i in stale
        ]

    async def gpu_samples(self, req: helper_pb2.GpuSamplesRequest) -> None:
        now = self.clock()
        # Stamped on arrival with this scheduler's clock: a helper's wall clock may be off
        # or jump (NTP, an operator's date -s), and the sample is seconds old at most.
        # The last sample of each GPU and of each job only: each was a statement of its own
        # in one write transaction, and one report of 100,000 samples (the limit per
        # message) held the scheduler's writes, everyone's submissions too, for minutes.
        device = list({x.gpu_index: (x.gpu_index, now, x.memory_used_bytes, x.utilization)
                       for x in req.samples if not x.job_id}.values())
        per_job = {x.job_id: x for x in req.samples if x.job_id}
        async with self.tx() as s:
            await repo.update_gpu_samples(s, req.server, device)
            # Only of jobs placed on that server: a helper may act only as its own server,
            # and any helper's samples of any job id it knew (one that had run there and
            # moved on) rewrote that job's profile, which decides what is packed with it.
            # A migration's pre-warmed copy is sampled before its job is placed there.
            here = await repo.job_ids_on_server(s, req.server, per_job)
            for x in per_job.values():
                if x.job_id in here:  # samples of any other job are dropped
                    values: dict[str, float] = {"utilization": x.utilization}
                    if x.job_memory_max_bytes or x.job_memory_bytes:
                        values["memory_max"] = x.job_memory_max_bytes or x.job_memory_bytes
                    if x.job_memory_min_bytes:
                        values["memory_min"] = x.job_memory_min_bytes
                    if x.minibatch_s:
                        values["step_time_s"] = x.minibatch_s
                    await repo.upsert_profile(s, x.job_id, now, **values)
            if req.host_memory:
                await repo.record_host_memory(s, [(m.job_id, m.incarnation, m.rss_bytes) for m in req.host_memory], now)

    async def _exits_that_matter(self, server: str, exits: Sequence[helper_pb2.ProcessExitRequest]
                                 ) -> list[helper_pb2.ProcessExitRequest]:
        """Of the exits a registration of `server` carries, in their order, those that can
        change a job (`_process_exit` decides): each launch's last, of jobs this scheduler
        has; of a launch that is its job's current one, only while the job is not queued or
        ended; of one it is not (a migration's other end aside), one per job and at most
        STALE_EXITS_PER_REGISTRATION. Each costs a transaction: all 10,000 a registration may
        carry took 18-35 s, past the 5 s its helper waits for the answer, so it was sent
        again and again and the helper never registered
        (tests/scheduler/security/test_hostile_requests.py -k thousands_of_exits)."""
        last = {(x.job_id, x.incarnation): x for x in exits}  # a launch's last word
        async with self.tx(read=True) as s:
            launches = await repo.launches_of(s, {job_id for job_id, _ in last})
            moving = {job_id: await repo.get_migration(s, job_id) for job_id, (_, state) in launches.items()
                      if state == JobState.MIGRATING.value}
        kept: list[helper_pb2.ProcessExitRequest] = []
        stale: set[str] = set()
        for (job_id, incarnation), x in last.items():
            if job_id not in launches:
                continue
            current, state = launches[job_id]
            m = moving.get(job_id)
            if incarnation and incarnation == current:
                if not (JobState(state).terminal or state == JobState.QUEUED.value) or \
                        self._lost_launches.get((job_id, incarnation)) == server:
                    kept.append(x)
            elif m is not None and incarnation and incarnation in (m.dest_incarnation, m.fallback_incarnation):
                kept.append(x)
            elif job_id not in stale and len(stale) < STALE_EXITS_PER_REGISTRATION:
                stale.add(job_id)
                kept.append(x)
        if len(kept) < len(exits):
            unknown = sorted({x.job_id for x in exits if x.job_id not in launches})
            log.warning("server %s: %d of the %d exits its registration carried change nothing and were passed "
                        "over (repeated, of jobs ended or queued since, of launches their jobs no longer run past "
                        "one per job and %d in all, or of jobs this scheduler does not have: %d, e.g. %s)",
                        server, len(exits) - len(kept), len(exits), STALE_EXITS_PER_REGISTRATION, len(unknown),
                        ", ".join(unknown[:3]) or "none")
        return kept

    async def process_exit(self, req: helper_pb2.ProcessExitRequest) -> None:
        """A job's process ended on a helper. Exits of older incarnations are ignored."""
        now = self.clock()
        async with self.tx() as s:
            await self._process_exit(s, req, now)
        if (req.job_id, req.incarnation) not in self._early_exits:
            self._steps_seen.pop((req.job_id, req.incarnation), None)
        self.poke()

    async def replay_early_exit(self, job_id: str, incarnation: str) -> None:
        """The migration of the job has recorded its end, with `incarnation` current: an
        exit of that launch that came before is applied now; any other is forgotten."""
        early = [key for key in self._early_exits if key[0] == job_id]
        reqs = [self._early_exits.pop(key) for key in early]
        for req in reqs:
            if req.incarnation == incarnation:
                await self.process_exit(req)
            else:
                self._steps_seen.pop((req.job_id, req.incarnation), None)

    async def _process_exit(self, s: AsyncSession, req: helper_pb2.ProcessExitRequest, now: float) -> None:
        try:
            job = await repo.get_job(s, req.job_id, for_update=True)
        except NotFound:
            log.warning("exit reported for unknown job %s", req.job_id)
            return
        state = JobState(job.state)
        # Fencing: only the current launch decides the job's fate. An exit without an
        # incarnation cannot prove it is the current one, so it is stale too.
        if req.incarnation != job.incarnation or not req.incarnation:
            if state is JobState.MIGRATING and req.incarnation:
                m = await repo.get_migration(s, job.id)
                if m is not None and req.incarnation in (m.dest_incarnation, m.fallback_incarnation):
                    # That launch may become current when the migration's end is recorded
                    # (the destination trained to its end before: a scheduler that did not
                    # run meanwhile): its exit is applied then, not dropped as stale.
                    self._early_exits[(job.id, req.incarnation)] = req
                    return
            # At most one a minute per job and server (the others logged): any registered helper
            # could write a row into any job's history with each report, 50 calls 50 rows.
            mono, key = self.monotonic(), (job.id, req.server)
            if mono - self._stale_exits.get(key, -math.inf) < STALE_EXIT_EVENT_EVERY_S:
                log.info("job %s: old launch %s on %s exited", job.id, req.incarnation or "(none)", req.server)
                return
            if len(self._stale_exits) >= 10_000:  # bounded: the entries out of their minute go
                self._stale_exits = {k: t for k, t in self._stale_exits.items()
                                     if mono - t < STALE_EXIT_EVENT_EVERY_S}
            self._stale_exits[key] = mono
            # Kept only if this write commits: marked before it, an exit whose write failed (the
            # database down) had its report, sent again, only logged: its event was lost.
            sa_event.listen(s.sync_session, "after_soft_rollback",
                            lambda *_: self._stale_exits.pop(key, None) if self._stale_exits.get(key) == mono
                            else None, once=True)
            repo.add_event(s, now, "job.stale_exit", f"old launch {req.incarnation or '(none)'} exited", job_id=job.id, server=req.server)
            return
        if state is JobState.QUEUED and await self._settles_lost_launch(s, job, req, now):
            return
        if state.terminal or state is JobState.QUEUED:
            return  # killed already, or already re-queued
        if state is JobState.MIGRATING and req.exit_code == EXIT_MIGRATED:
            return  # the source stopping for the migration in progress, as planned
        if state is JobState.MIGRATING and req.exit_code >= 0:
            # Its checkpoint confirmed, the source was told to exit: that is the planned
            # stop whatever the status a wrapper makes of 75 (`python train.py; echo
            # done` exits 0, and was recorded SUCCEEDED half trained).
            migration = await repo.get_migration(s, job.id)
            if migration is not None and migration.checkpoint_path and \
                    migration.source_incarnation == req.incarnation:
                return
        # Not "stopped": the helper itself sends SIGKILL to a launch that outlives the
        # grace of its stop.
        sigkill = req.exit_code == -signal.SIGKILL and req.reason != "stopped"
        if state is JobState.MIGRATING and sigkill:
            # The migration in progress decides: without its checkpoint confirmed it
            # fails and re-queues the job from its restore point; with it, it goes on.
            return
        job.exit_code = req.exit_code
        restarts = await repo.transitions_with_reason(s, job.id, KILLED) if sigkill else 0
        where = (f"resumes from its checkpoint {job.restore_checkpoint}" if job.restore_checkpoint
                 else "starts again from step 0 (no checkpoint yet)")
        if req.exit_code == EXIT_MIGRATED:
            await repo.requeue(s, job, now, "stopped with a checkpoint; re-placing")
        elif req.reason == "stopped":
            # The current launch of a job still placed there, stopped by its helper on
            # its own: the helper is shutting down (SIGTERM, `systemctl restart`). Not
            # the job's failure: it used to fail every job of a helper restarted cleanly.
            who = (f"its process on {req.server} was stopped mid-migration" if state is JobState.MIGRATING
                   else f"its helper on {req.server} stopped (shutting down)")
            await repo.requeue(s, job, now, f"{who}: it {where}")
        elif sigkill and restarts < KILLED_RESTARTS:
            await repo.requeue(s, job, now, f"{KILLED} (out of memory?), not by Gandiva: it {where} "
                               f"(restart {restarts + 1} of {KILLED_RESTARTS}; then it fails)")
        else:
            await self._ends_by_exit(s, job, req, now, state, sigkill)

    async def _ends_by_exit(self, s: AsyncSession, job: Job, req: helper_pb2.ProcessExitRequest, now: float,
                            state: JobState, sigkill: bool = False, late: str = "") -> None:
        """The job's end that its current launch's exit says: status 0 SUCCEEDED (unless it
        was SUSPENDED: its process exited while suspended), else FAILED with the exit's reason
        (a SIGKILL past its restarts said so); ``late`` added to the reason."""
        job.exit_code = req.exit_code
        if req.exit_code == 0 and state is not JobState.SUSPENDED:
            await repo.finish(s, job, JobState.SUCCEEDED, now,
                              self._finished(job, req.reason or "finished", req.steps) + late)
            return
        why = req.reason or f"exited with status {req.exit_code}"
        if sigkill:
            why += f" (out of memory?), not by Gandiva, {KILLED_RESTARTS + 1} times"
        if state is JobState.SUSPENDED and req.exit_code == 0:
            why = "its process exited while suspended"
        job.steps = max(job.steps, self.steps_seen(job.id, job.incarnation), req.steps)
        await repo.finish(s, job, JobState.FAILED, now, why + late)

    async def _settles_lost_launch(self, s: AsyncSession, job: Job, req: helper_pb2.ProcessExitRequest,
                                   now: float) -> bool:
        """A job re-queued when its server went down (silent past the heartbeat timeout: a
        host cut off, before the lease froze it), whose launch ended meanwhile: its exit
        comes once the link is back, with the helper's registration (its outbox's exits) or
        after it. While nothing has launched the job since (its incarnation is still that
        launch's), that exit settles it as it would have then: SUCCEEDED or FAILED. Before,
        it was passed over ("already re-queued") and the job ran a second time, from its
        checkpoint or from step 0 (tests/multihost/test_ended_while_cut.py). An exit that
        says nothing of the program's end (stopped by its helper, a planned stop, killed by
        SIGKILL, told to exit by this scheduler as lost: EXIT_KILLED) leaves it queued, as before."""
        key = (job.id, req.incarnation)
        if self._lost_launches.get(key) != req.server:
            return False
        if req.reason == "stopped" or req.exit_code in (EXIT_MIGRATED, EXIT_KILLED, -signal.SIGKILL):
            return False
        del self._lost_launches[key]
        await self._ends_by_exit(s, job, req, now, JobState.QUEUED,
                                 late=f"; its exit came from {req.server} after the server was taken for lost")
        log.warning("job %s: its launch %s on %s ended while the server was taken for lost; settled by its "
                    "late exit (%s), not run again", job.id, req.incarnation, req.server, req.reason)
        return True

    def steps_seen(self, job_id: str, incarnation: str) -> int:
        """The highest step that launch of the job reported (0: none)."""
        return self._steps_seen.get((job_id, incarnation), 0)

    def _finished(self, job: Job, reason: str, exit_steps: int = 0) -> str:
        """The reason of a job whose program exited 0: with the step it reported last when
        that is short of the total it was submitted with (--steps) or its program announced
        (a loop that ended early, a caught exception, a data set smaller than thought):
        it used to read "finished" like a job that ran every mini-batch."""
        # Its last reports, written or not (those of a migration's destination that ended
        # before the migration's end was recorded were not), and the count its runtime sent
        # with the exit (`exit_steps`, 0: not said): reports that never arrived (the
        # scheduler away, or its database down, as the program ended) are in it.
        reached = max(job.steps, self.steps_seen(job.id, job.incarnation), exit_steps)
        job.steps = reached
        total = job.total_steps or 0
        if not 0 < reached < total:
            return reason
        given = "given at submission (--steps)" if job.total_steps_from == "spec" else "its program announced"
        # Said as what the scheduler knows: a launch whose last reports never arrived (its
        # scheduler unreachable as its program ended) looks the same.
        return (f"{reason} with {reached:,} of the {total:,} mini-batches {given} reported: its program "
                f"exited with status 0 short of them, or its last reports were lost; see its output "
                f"(gandiva logs {job.id})")

    async def mark_stale_servers_down(self) -> list[str]:
        """Servers silent for `down_after_s` go down; their jobs return to the queue.
        After a (re)start, none goes down before the scheduler has itself been up for
        `down_after_s`: a helper that could not reach a stopped scheduler was silent for
        that reason, and its jobs are still expected where they run. Silence is what this
        process heard (``_heard``, recorded in the database or not), on the monotonic
        clock: the servers' recorded `last_heartbeat` (wall clock) is for people."""
        self._check_stall()
        if self.monotonic() - self.started_mono < self.settings.down_after_s:
            return []
        # Every scheduling round asks; only an actual change takes the write lock.
        async with self.tx(read=True) as s:
            if not self._unheard(await repo.up_servers(s)):
                return []
        now = self.clock()
        async with self.tx() as s:
            # Looked at again once the transaction has the database: it may have waited
            # for it (locked by another process) while heartbeats came in.
            stale = self._unheard(await repo.up_servers(s))
            names = [srv.name for srv in stale]
            stops: list[tuple[str, str, str]] = []
            lost: list[tuple[str, str]] = []
            for srv in stale:
                # The server's lease ran out before now (Settings): nothing of it trains.
                await self._take_down(s, srv, now, f"no heartbeat for {self._silence(srv.name):.0f}s",
                                      "went down", stops, lost)
        self._after_down(names, stops, lost)
        return names

    async def watch_stalls(self, every_s: float = 0.25) -> None:
        """Note, a few times a second, that this process runs (the live engine runs it):
        see _check_stall."""
        self._alive_at = self.monotonic()
        while True:
            await asyncio.sleep(every_s)
            self._check_stall()

    def _check_stall(self) -> None:
        """A process that did not run for a while (SIGSTOP, a paused VM, an event loop
        blocked, a machine swapping) heard nothing meanwhile. As after a restart, every
        server then gets a whole `down_after_s` to be heard again, instead of being called
        down (every job in the cluster re-queued) by the first round after the stall,
        before the helpers' heartbeats, delayed by their reconnections, come in. Whichever
        runs first after the stall (watch_stalls, or a round's mark_stale_servers_down)
        sees it."""
        if self._alive_at is None:
            return
        mono = self.monotonic()
        gap, self._alive_at = mono - self._alive_at, mono
        if gap > max(1.0, self.settings.down_after_s / 4):
            log.warning("this scheduler did not run for %.1fs (stopped, paused or starved?): every server "
                        "gets %gs to be heard again before it is called down", gap, self.settings.down_after_s)
            self.started_mono = mono

    def silent(self, name: str) -> bool:
        """Whether the server would be called down now (mark_stale_servers_down): not heard
        from for `down_after_s`, this scheduler itself up (and running) that long."""
        return (self.monotonic() - self.started_mono >= self.settings.down_after_s
                and self._silence(name) >= self.settings.down_after_s)

    def heard_ago(self, name: str, recorded_ago: float) -> float:
        """Seconds since the server was last heard from, on the monotonic clock. One this
        scheduler has not heard since it started: `recorded_ago` (now less its recorded
        `last_heartbeat`, wall-clock times), but at least the time since this start: written
        by a scheduler whose clock kept time through a step back, that heartbeat read an hour
        in the future, and a job waited for its checkpoint's server that hour."""
        heard = self._heard.get(name)
        if heard is None:
            return max(recorded_ago, self.monotonic() - self.started_mono)
        return self.monotonic() - heard

    def _silence(self, name: str) -> float:
        """Seconds since the server was last heard from (or since this scheduler started)."""
        return self.monotonic() - self._heard.get(name, self.started_mono)

    def _unheard(self, servers: Sequence[Server]) -> list[Server]:
        """Of the servers up, those not heard from for `down_after_s`. Heartbeats that
        arrived while the database was unreachable (a PostgreSQL restart) or locked could
        not be recorded: every server used to be marked down the moment it was back, and
        every job in the cluster restarted."""
        # Looked at here, with no await between it and the verdict: a stall (SIGSTOP, a
        # paused VM) that began while the caller awaited the database was not seen by the
        # caller's own check, and every server was called down the moment it ended.
        self._check_stall()
        if self.monotonic() - self.started_mono < self.settings.down_after_s:
            return []
        return [srv for srv in servers if self._silence(srv.name) >= self.settings.down_after_s]

    async def server_leaving(self, name: str, instance: str = "") -> bool:
        """The server's helper is stopping and runs no job any more (HeartbeatRequest.
        leaving): the server goes down now, its jobs back to the queue, and its name is
        free for the next helper. False (nothing done) from a helper that is not the
        name's holder, or for a server already down."""
        now = self.clock()
        if not self._claim_name(name, instance, self.monotonic()):
            return False
        if instance:
            # Its last word: the name is free for its successor from now on, even when the
            # server cannot be marked down yet (the database unreachable). Before, a helper
            # restarted during an outage was refused its name for the heartbeat timeout, and
            # a server not heard from meanwhile was called down as soon as the database was
            # back, before the new helper could register (with the exits its predecessor left).
            # Still the holder in name, so that a successor's registration replaces it.
            self._instances[name] = (instance, -math.inf)
        stops: list[tuple[str, str, str]] = []
        lost: list[tuple[str, str]] = []
        async with self.tx() as s:
            srv = await s.get(Server, name)
            if srv is None or not srv.up:
                return False
            await self._take_down(s, srv, now, "its helper stopped", "stopped its helper", stops, lost)
        # Unless its successor claimed the name meanwhile (it may, from its last word on: a
        # systemd restart while this write waited for the database): that claim was dropped
        # here, and a third helper given the same name was let in beside the live one.
        if self._instances.get(name, (instance,))[0] == instance:
            self._instances.pop(name, None)
        self._after_down([name], stops, lost)
        return True

    async def _take_down(self, s: AsyncSession, srv: Server, now: float, event: str, verb: str,
                         stops: list[tuple[str, str, str]], lost: list[tuple[str, str]]) -> None:
        """Mark `srv` down in transaction `s`, its active jobs back to the queue; the
        launches to stop elsewhere (a migration's destination, a fallback) go to `stops`,
        the (job, incarnation) of the launches lost with the server to `lost`."""
        srv.up = False
        await repo.server_down(s, srv.name, now)
        repo.add_event(s, now, "server.down", event, server=srv.name)
        for job in await repo.jobs_on_server(s, srv.name):
            if JobState(job.state) in ACTIVE:
                why = f"its server {srv.name} {verb}"
                migration = await repo.get_migration(s, job.id)
                if migration is not None:
                    stops.append((migration.dest_server, job.id, migration.dest_incarnation))
                    if migration.step >= 0 and migration.checkpoint_path:
                        # The source confirmed its migration checkpoint (and exited):
                        # the job resumes from that step, not from an older checkpoint
                        # or step 0. Through a shared mount it lies at the destination.
                        why += f" mid-migration; {await repo.resume_from_migration(s, job, migration)}"
                        stops.append((srv.name, job.id, migration.fallback_incarnation))
                lost.append((job.id, job.incarnation))
                if migration is None and JobState(job.state) is JobState.RUNNING and job.incarnation:
                    remember(self._lost_launches, (job.id, job.incarnation), srv.name, 10_000)
                if self.runtimes.answers(job.id, job.incarnation, self.settings.lease):
                    # Its host answers, its helper does not (stopped, hung): the lease that
                    # freezes a cut-off server's jobs is the helper's, so this copy trains on.
                    why += "; its process still answers (its helper does not): told to exit"
                await repo.requeue(s, job, now, why)

    def _after_down(self, names: Sequence[str], stops: Sequence[tuple[str, str, str]],
                    lost: Sequence[tuple[str, str]]) -> None:
        for server, job_id, incarnation in stops:
            self.stop_on(server, job_id, incarnation, "its source server went down mid-migration")
        # A command sent to a lost launch's shim (a periodic checkpoint, a suspend) over a
        # cut link is answered by nobody: it fails now. It used to hold the job "in flight",
        # unplaceable, until its timeout or the stream's death (15-60 s after the server
        # was marked down; a job re-placed a heartbeat timeout after its host was lost).
        now = self.monotonic()
        self._old_copies = {j: c for j, c in self._old_copies.items() if c[1] > now}  # (killed jobs')
        for job_id, incarnation in lost:
            self.runtimes.fail_pending(job_id, incarnation, "its server went down")
            left = self.runtimes.answers(job_id, incarnation, self.settings.lease)
            if left:
                # Told to exit below: it does at its mini-batch's end (its stream then ends).
                self._old_copies[job_id] = (incarnation, now + min(left, self.settings.command_timeout_s))
            # A copy that still answers (its helper stopped or hung, its host fine) is told
            # to exit at its next mini-batch boundary: its job is placed again elsewhere,
            # and without this both trained at once until the helper came back.
            if self.runtimes.kill_stale(job_id, incarnation, "its server went down: the job runs elsewhere"):
                log.warning("job %s: its process still answers though its server is down; told to exit", job_id)
        for n in names:
            self.helpers.fail_all(n, f"server {n} went down")
        if names:
            self.poke()

    def note_fence(self, job_id: str, fenced_until: float, now: float) -> None:
        """The job was just fenced until `fenced_until` (the database's time, on `clock`, read
        as `now`): from here it runs its length on the monotonic clock (fence_holds)."""
        if fenced_until > now:
            remember(self._fence_ends, (job_id, fenced_until), self.monotonic() + fenced_until - now, FENCES_KEPT)

    async def requeue_fenced(self, session: AsyncSession, job: Job, now: float, reason: str, fenced_until: float) -> None:
        """`repo.requeue` with a fence, noted to run its length on the monotonic clock
        (note_fence): every requeue that fences a job goes through here."""
        await repo.requeue(session, job, now, reason, fenced_until=fenced_until)
        self.note_fence(job.id, job.fenced_until, now)

    def fence_holds(self, job_id: str, fenced_until: float, now: float, mono: float | None = None) -> bool:
        """Whether the job's fence (`fenced_until`, as written) still holds at `now` (on
        `clock`) and `mono` (the monotonic clock's; now by default). It runs its length on
        the monotonic clock from its writing (note_fence), or, one written before this
        scheduler started (or not noted), from the first time it is looked at. A step of
        the wall clock forward (NTP, `date -s`: `clock` follows one at once) ended every
        fence in progress at once, and a job fenced until the lease of a launch that did
        not answer had run out was placed again beside that copy, still training. One not
        noted runs at most the heartbeat timeout (no fence is longer): written by a scheduler
        whose clock kept time through a step back, it was an hour ahead of this one's."""
        if fenced_until <= 0.0:
            return False
        mono = self.monotonic() if mono is None else mono
        key = (job_id, fenced_until)
        ends = self._fence_ends.get(key)
        if ends is None:
            if fenced_until <= now:
                return False
            ends = mono + min(fenced_until - now, self.settings.down_after_s)
            remember(self._fence_ends, key, ends, FENCES_KEPT)
        return mono < ends

    def old_copy_wait(self, job_id: str) -> str:
        """Why the job is not placed yet, or "": a copy of it that still answered when its
        server went down (its helper stopped or hung, its host fine) was told to exit at
        its next mini-batch boundary; until its runtime stream ends (at most until two of
        its mini-batches and a second, or the lease, after it was last heard: a cut-off
        host's stream may look open) no new copy starts. Before, the job was placed again
        at once and both trained until the old copy's mini-batch ended."""
        got = self._old_copies.get(job_id)
        if got is None:
            return ""
        incarnation, until = got
        left = until - self.monotonic()
        if left <= 0 or not self.runtimes.connected(job_id, incarnation):
            del self._old_copies[job_id]
            return ""
        return (f"waits for its previous copy (launch {incarnation}), whose helper does not answer, to exit at "
                f"its next mini-batch boundary as told: {left:.0f}s more at most")

    # ---- runtime progress -----------------------------------------------------

    async def record_progress(
        self, job_id: str, incarnation: str, steps: int, rate: float, last_step_s: float, metrics: dict[str, float],
        other_run: bool = False, step_at: float = 0.0,
    ) -> None:
        """Progress of every job is coalesced and written in one transaction per
        `progress_flush_s`, not one per report: with many jobs this is the busiest write.
        `other_run`: the shim is in a run that is not a mini-batch (scheduler/hangs.py).
        `step_at`: the runtime's time of `steps` (0: none), for its rate alone."""
        self.hangs.progress(job_id, incarnation, steps, rate, last_step_s, other_run)
        self.alone_rates.report(job_id, incarnation, steps, self.clock(), rate, step_at)
        # Bounded (launches whose exit never came): the least recently reporting out first.
        # (All were cleared at once: a job ending just then, its last reports not yet written
        # and its exit without a count, read "finished with N of the M mini-batches".)
        key = (job_id, incarnation)
        remember(self._steps_seen, key, max(steps, self._steps_seen.get(key, 0)), STEPS_SEEN_KEPT)
        earlier = self._progress.get(job_id)
        merged = {**earlier[4], **metrics} if earlier is not None and earlier[0] == incarnation else metrics
        self._progress[job_id] = (incarnation, steps, rate, last_step_s, merged)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_progress_soon())

    async def _flush_progress_soon(self) -> None:
        # Reports that arrive while a flush is writing are flushed by the next turn of
        # this loop: no new flusher is started while this one runs, and the last
        # reports of a quiet cluster must not wait in memory for someone's next report.
        while True:
            await asyncio.sleep(self.settings.progress_flush_s)
            try:
                await self.flush_progress()
            except GandivaError as err:
                # Lost to a brief database outage; the next reports supersede these.
                log.warning("progress not recorded: %s", err)
            if not self._progress:
                return

    async def flush_progress(self) -> None:
        batch, self._progress = self._progress, {}
        if not batch:
            return
        now = self.clock()
        # Batched plain UPDATEs (no ORM objects), on SQLite off the event loop.
        await self.write_sync(lambda conn: repo.write_progress(conn, batch, now))

    async def record_total_steps(self, job_id: str, incarnation: str, total: int) -> None:
        """The program of the job's current launch said at which step it stops (its
        StopAtStepHook): its progress and ETA count against that, over what its submitter
        gave (--steps). One transaction; an older launch's word changes nothing."""
        async with self.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or JobState(job.state).terminal or \
                    (job.total_steps, job.total_steps_from) == (total, "program"):
                return
            given = f" (its submitter gave {job.total_steps:,})" if job.total_steps_from == "spec" and \
                job.total_steps != total else ""
            job.total_steps, job.total_steps_from = total, "program"
            repo.add_event(s, self.clock(), "job.progress", f"the program stops at step {total:,}{given}",
                           job_id=job_id)

    async def record_migratability(self, job_id: str, incarnation: str, migratable: bool, reason: str) -> None:
        """The runtime of launch ``incarnation`` ("": not told) said whether the job can
        resume from a checkpoint. Only the job's current launch writes it: before, a
        migration's pre-warmed destination set the job's flag for a launch that may never
        run (its migration failing, the job stayed marked by it at its source). Another
        launch's verdict stays with its connection, applied if that launch becomes the
        job's (apply_launch_verdict)."""
        async with self.tx() as s:
            # Locked: a migration making this launch current meanwhile commits first, and
            # this read then sees it (or that commit applies what the connection holds).
            job = await repo.get_job(s, job_id, for_update=True)
            if incarnation and job.incarnation != incarnation:
                return
            if not job.suspendable:
                # The job's current launch was found uncontrollable: its runtime's
                # connection keeps the verdict, applied when the mark is undone.
                return
            self._apply_verdict(s, job, migratable, reason)

    def apply_launch_verdict(self, s: AsyncSession, job: Job) -> None:
        """The job's launch changed (in ``s``: a migration's destination or fallback is now
        its current one): the verdict that launch's runtime said before, if any, is written."""
        verdict = self.runtimes.verdict(job.id, job.incarnation)
        if verdict is not None and job.suspendable:
            self._apply_verdict(s, job, *verdict)

    def _apply_verdict(self, s: AsyncSession, job: Job, migratable: bool, reason: str) -> None:
        """Write a runtime's migratability verdict into the job's row (in ``s``)."""
        if job.migratable != migratable:
            repo.add_event(
                s, self.clock(), "job.migratable", f"{'migratable' if migratable else 'not migratable'}: {reason}",
                job_id=job.id
            )
        # (Also when unchanged: an undone uncontrollable mark left its own note, or none.)
        job.migratable, job.control_note = migratable, "" if migratable else reason
        if not migratable and job.restore_checkpoint:
            # A checkpoint taken before the verdict (a periodic one in its first steps):
            # resumed from it after a host loss, such a job trained on other input (its
            # dropout's generator started over) and ended with other weights; from step
            # 0 it ends as an uninterrupted run would.
            repo.add_event(s, self.clock(), "job.checkpoint",
                           f"restore point step {job.restore_step} ({job.restore_checkpoint}) "
                           "dropped: the job is not migratable, so it cannot resume from a "
                           "checkpoint; lost, it starts again from step 0", job_id=job.id)
            job.restore_checkpoint, job.restore_server, job.restore_step = "", "", 0

    async def record_towers_changed(self, job_id: str, incarnation: str, towers: int,
                                    checkpoint_towers: int, devices: int) -> bool:
        """A launch of the job (`incarnation`: any, the current one or a migration's
        destination) refused to restore a checkpoint with `checkpoint_towers` tower
        copies into its graph of `towers`: the program builds one tower per device, so a
        grow or shrink changes its result. Grow-shrink is turned off for the job for good
        (one transaction, event `job.grow_shrink`); the policy then never grows it and
        shrinks it back if it is grown. False when it was off already."""
        reason = (f"the program builds one tower per device: growing it would change its result "
                  f"(launch {incarnation or '?'} on {devices or '?'} GPU(s) built {towers or '?'} tower(s), "
                  f"its checkpoint holds {checkpoint_towers or 'another count'}); use tf_runtime.towers "
                  "for fixed logical towers")
        async with self.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.grow_shrink_note or JobState(job.state).terminal:
                return False
            job.grow_shrink_note = reason
            repo.add_event(s, self.clock(), "job.grow_shrink", f"grow-shrink off: {reason}", job_id=job_id)
        self.poke()
        return True

    async def record_uncontrollable(self, job_id: str, incarnation: str, reason: str) -> bool:
        """The launch `incarnation` never connected a runtime: the job can be neither
        suspended nor migrated (one transaction). False when that launch is no longer
        current or the job no longer runs."""
        async with self.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state != JobState.RUNNING.value or not job.suspendable:
                return False
            job.suspendable, job.migratable, job.control_note = False, False, reason
            repo.add_event(s, self.clock(), "job.uncontrollable", reason, job_id=job_id)
            return True

    async def runtime_hello(self, job_id: str, incarnation: str) -> tuple[bool, bool, bool]:
        """A runtime says hello: NotFound unless the job exists. One small read; the write
        of record_runtime_connected only for a job marked uncontrollable (rare), so a
        thousand runtimes connecting at once do not queue a thousand write transactions.
        (whether that write is due, whether the job is RUNNING as this launch: its shim is
        told to resume, see RuntimeHub.resume_on_connect; whether the launch is stale: not
        the job's current one nor a migration's destination or fallback, or the job waits
        in the queue or ended: no launch of it should run)."""
        async with self.tx(read=True) as s:
            row = (await s.execute(select(Job.suspendable, Job.incarnation, Job.state)
                                   .where(Job.id == job_id))).first()
            if row is None:
                raise NotFound("job", job_id)
            suspendable, current, state = row
            this_launch = not incarnation or incarnation == current
            stale = JobState(state).terminal or state == JobState.QUEUED.value
            if not this_launch and not stale:
                m = await repo.get_migration(s, job_id)
                stale = m is None or incarnation not in (m.dest_incarnation, m.fallback_incarnation)
        return not suspendable and this_launch, this_launch and state == JobState.RUNNING.value, stale and bool(incarnation)

    async def record_runtime_connected(self, job_id: str, incarnation: str) -> None:
        """A runtime of the current launch connected after all: suspendable again, and
        migratable as its runtime last said. Its verdict may have come while the mark was
        written (recorded, then overwritten by the mark) or after (dropped by
        record_migratability): before, the job then stayed not migratable until its shim
        reconnected and said it again."""
        verdict = self.runtimes.verdict(job_id, incarnation)
        async with self.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.suspendable or (incarnation and job.incarnation != incarnation):
                return
            job.suspendable, job.control_note = True, ""
            repo.add_event(s, self.clock(), "job.controllable", f"runtime of launch {incarnation} connected", job_id=job_id)
            if verdict is not None:
                self._apply_verdict(s, job, *verdict)


def spec_of(job: Job) -> common_pb2.JobSpec:
    """The JobSpec a job was submitted with, rebuilt from its row."""
    return common_pb2.JobSpec(
        name=job.name,
        command=job.command,
        workdir=job.workdir,
        env=job.env or {},
        gpus=job.gpus,
        priority=job.priority,
        grow_shrink=job.grow_shrink,
        user=job.user,
        multi_job_id=job.multi_job_id or "",
        index=job.array_index,
        params=job.params or {},
        steps=job.total_steps if job.total_steps_from == "spec" else 0,
    )


def new_incarnation() -> str:
    return uuid.uuid4().hex[:12]
