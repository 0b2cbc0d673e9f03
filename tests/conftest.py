"""Fixtures shared by the whole suite: a fresh database per test (SQLite, and
PostgreSQL when one is reachable), and a temporary GANDIVA_HOME."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every Python process the tests start runs tests/site/sitecustomize.py first: TensorFlow
# starts there without Keras's import of matplotlib (15% of a TensorFlow process's start-up
# CPU, in hundreds of them a run; the file says why that changes nothing a test checks).
# A test that gives a process a PYTHONPATH of its own adds TEST_SITE to it.
TEST_SITE = str(Path(__file__).resolve().parent / "site")
if TEST_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TEST_SITE, os.environ.get("PYTHONPATH")) if p)

# The admin URL of a PostgreSQL server whose role may CREATE DATABASE.
# scripts/pg-test-setup.sh makes this one; CI sets GANDIVA_REQUIRE_PG=1 so that a
# missing server fails the run instead of skipping the PostgreSQL tests.
PG_ADMIN_URL = os.environ.get(
    "GANDIVA_TEST_PG_URL", "postgresql+asyncpg://gandiva:gandiva@127.0.0.1:5432/gandiva"
)
# The same server, as asyncpg itself spells it.
PG_ADMIN_DSN = PG_ADMIN_URL.replace("postgresql+asyncpg://", "postgresql://")


def _pg_reachable() -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    import asyncio

    import asyncpg

    async def probe() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
        return None
    except Exception as exc:  # noqa: BLE001 - any failure to connect means: no server for these tests
        return f"PostgreSQL not reachable at {PG_ADMIN_URL} ({exc.__class__.__name__}: {exc}); run scripts/pg-test-setup.sh"


_PG_PROBE: list[str | None] = []


def pg_skip_reason() -> str | None:
    if not _PG_PROBE:
        _PG_PROBE.append(_pg_reachable())
    reason = _PG_PROBE[0]
    if reason and os.environ.get("GANDIVA_REQUIRE_PG") == "1":
        pytest.fail(reason)
    return reason


@pytest.fixture
def gandiva_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gandiva-home"
    home.mkdir()
    monkeypatch.setenv("GANDIVA_HOME", str(home))
    return home


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A brand-new PostgreSQL database for this test, dropped afterwards."""
    reason = pg_skip_reason()
    if reason:
        pytest.skip(reason)
    with fresh_pg_database() as url:
        yield url


@contextlib.contextmanager
def fresh_pg_database(options: str = "") -> Iterator[str]:
    """The URL of a new database on the tests' PostgreSQL (``options``: CREATE DATABASE's,
    e.g. another collation), dropped afterwards."""
    import asyncio

    import asyncpg

    name = f"gandiva_test_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}" {options}'.rstrip()))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        import time

        for attempt in range(5):
            try:
                asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                break
            except asyncpg.PostgresError:
                # A background process was in the database at that instant; it leaves soon.
                if attempt == 4:
                    raise
                time.sleep(0.5)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each state test runs once on SQLite and once on a real PostgreSQL."""
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


# ---- the default run and the full one ----------------------------------------------
# A test marked `full` is a further case of a family whose representative cases run by
# default, and whose mechanism another default test checks (each such mark says which):
# more parametrized program kinds and journeys of tests/tf_runtime, a second loop style
# of a live test. The default run (CI's, the README's) skips them, with this reason, to
# keep the suite near its 25-minute aim on 2 cores; GANDIVA_FULL_TESTS=1 runs them too.
FULL_TESTS = os.environ.get("GANDIVA_FULL_TESTS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL_TESTS:
        return
    skip = pytest.mark.skip(reason="a further case of a family the default run covers "
                                   "(GANDIVA_FULL_TESTS=1 runs it)")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


# ---- the root logger, as each test found it ---------------------------------------


@pytest.fixture(autouse=True)
def _root_logging_put_back() -> Iterator[None]:
    """An entry point run in this process (`main(["scheduler", ...])`, run_gandiva) sets up
    the root logger with a handler on the test's captured stderr, which pytest closes
    after the test. Every later test on the same worker then printed "--- Logging
    error ... I/O operation on closed file" into the stderr it captured whenever an
    in-process scheduler logged (test_db_outage's `gandiva top` stderr, CI of f53aeb0).
    Handlers a test added (other than pytest's own) are removed, and the level put back."""
    import logging

    root = logging.getLogger()
    handlers, level = set(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


# ---- a real scheduler -----------------------------------------------------------

import asyncio as _asyncio
import threading as _threading


class ThreadedScheduler:
    """A real scheduler (gRPC on 127.0.0.1, its own event loop in a thread), so that
    both subprocess CLIs and async tests can talk to it over a real socket."""

    def __init__(self, db_url: str, listen: str = "127.0.0.1:0", **kwargs: object) -> None:
        from scheduler.server import SchedulerServer

        self.db_url = db_url
        self.server = SchedulerServer(db_url=db_url, listen=listen, **kwargs)  # type: ignore[arg-type]
        self.loop = _asyncio.new_event_loop()
        self.thread = _threading.Thread(target=self.loop.run_forever, daemon=True)
        self.address = ""

    def call(self, coro, timeout: float = 60):  # type: ignore[no-untyped-def]
        """Run a coroutine on the scheduler's loop and wait for its result."""
        return _asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ThreadedScheduler:
        self.thread.start()
        self.address = self.call(self.server.start())
        return self

    def stop(self, grace: float = 1.0) -> None:
        async def drain() -> None:
            # Streams still open (a helper's commands, a watcher) end here, on a live loop.
            tasks = [t for t in _asyncio.all_tasks() if t is not _asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await _asyncio.gather(*tasks, return_exceptions=True)

        if not self.thread.is_alive():  # stopped already (a test's restart, then the fixture's end)
            return
        try:
            self.call(self.server.stop(grace=grace))
            self.call(drain())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


SQLITE_PREFIX = "sqlite+aiosqlite:///"

# The grace a fixture's scheduler gets at the test's end. A command still in flight then
# (a launch that the test's own helper never answers, a migration the test left midway)
# held the engine's stop for the whole grace: 1 s at the end of 44 of the 67 tests of
# test_fencing.py, test_runtime_api.py and test_host_faults.py. Nothing is asserted after
# the end; a test that stops its scheduler midway (a restart) still grants the full second.
TEARDOWN_GRACE_S = 0.1


@pytest.fixture(scope="session")
def sqlite_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file holding only the schema at the head revision (what a scheduler's own
    migration makes of an empty file), made once per session: a scheduler started on a
    brand-new SQLite file by the fixtures below starts on a copy of it instead of
    migrating (0.2 s or more per test). Starting on an empty file stays covered by every
    test that runs `gandiva scheduler` as a process, and tests/scheduler/state by
    migrating themselves."""
    import sqlite3

    from scheduler.state import migrate
    from scheduler.state.db import make_engine

    path = tmp_path_factory.mktemp("sqlite-schema") / "state.db"

    async def make() -> None:
        engine = make_engine(f"{SQLITE_PREFIX}{path}")
        try:
            await migrate.upgrade(engine)
        finally:
            await engine.dispose()

    _asyncio.run(make())
    with sqlite3.connect(path) as db:  # one self-contained file, as a new one is
        db.execute("PRAGMA journal_mode=DELETE")
    return path


def _on_schema(db_url: str, schema: Path) -> None:
    """A brand-new SQLite file starts as a copy of ``schema``; anything else is left alone."""
    import shutil

    if db_url.startswith(SQLITE_PREFIX):
        target = Path(db_url[len(SQLITE_PREFIX):])
        if not target.exists() and target.parent.is_dir():
            shutil.copyfile(schema, target)


@pytest.fixture
def scheduler_server(sqlite_url: str, gandiva_home: Path, sqlite_schema: Path) -> Iterator[ThreadedScheduler]:
    """A real in-process scheduler on a free port with a fresh SQLite database.
    Attributes: .address (host:port), .db_url, .server (SchedulerServer)."""
    _on_schema(sqlite_url, sqlite_schema)
    sched = ThreadedScheduler(sqlite_url, tick_s=0.2).start()
    try:
        yield sched
    finally:
        sched.stop(grace=TEARDOWN_GRACE_S)


@pytest.fixture
def make_scheduler(gandiva_home: Path, sqlite_schema: Path) -> Iterator:
    """Start real in-process schedulers on any database URL; all stopped at the end."""
    started: list[ThreadedScheduler] = []

    def start(db_url: str, **kwargs: object) -> ThreadedScheduler:
        _on_schema(db_url, sqlite_schema)
        sched = ThreadedScheduler(db_url, **kwargs).start()
        started.append(sched)
        return sched

    yield start
    for sched in started:
        sched.stop(grace=TEARDOWN_GRACE_S)


# How often `wait_for` asks: every 0.05 s for the first 2 s of a wait (most waits of the
# in-process tests end there), then every 0.1 s, half the fixtures' scheduling tick (0.2 s),
# so a state the scheduler holds for one round is still seen. A predicate is mostly a GetJob
# over gRPC: 4.4 ms of CPU in the test's process (client and in-process scheduler, measured
# at load 12), 9% of a core at 0.05 s. The live tests wait minutes on TensorFlow processes
# that way: 12.3 s of the 24.5 s of CPU of test_live_cluster.py -k oversubscribed was the
# test's own process.
WAIT_POLL_S, WAIT_POLL_LATER_S, WAIT_POLL_FAST_FOR_S = 0.05, 0.1, 2.0


def _wait_for(predicate, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    """Poll `predicate` until it returns something truthy; return that, or fail."""
    import time

    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        fast = time.monotonic() - start < WAIT_POLL_FAST_FOR_S
        time.sleep(WAIT_POLL_S if fast else WAIT_POLL_LATER_S)
    raise AssertionError(f"condition not met within {timeout:.0f}s")


@pytest.fixture(name="wait_for")
def wait_for_fixture():  # type: ignore[no-untyped-def]
    return _wait_for


# How the tests are spread over the three pytest-xdist workers (pyproject's addopts: -n 3).
# Three on a 2-core machine, because the live tests mostly wait on their processes: with two
# workers the cores were 68% busy (CI of 8c1f694). With three they were 84% busy, and CI on
# 8f7493b took 1,332 s instead of 1,698 s with two (2026-12-06). The run's summary says how
# busy the cores were (pytest_terminal_summary below).
# Each file of tests that run real processes (tests/multihost: a cluster in network
# namespaces, each test's named with a token of its own; tests/integration: a scheduler,
# helpers and TensorFlow jobs; tests/tf_runtime: real TensorFlow programs interrupted and
# compared) is a unit of its own, its tests run in order. Every other test is a unit of its
# own. The heaviest units are handed out first (the multihost files, then integration's,
# then tf_runtime's, then the unit and simulator tests in their order) to whichever worker
# is free, so the workers end together (within 5 s in that run), with one exception: while
# integration's or tf_runtime's units are left, only as many workers as there are beyond
# the cores (one of -n 3 on 2 cores) take multihost units. A multihost test mostly waits (a
# link shaped to 96 kbit/s, a heartbeat timeout): its CPU seconds (s48, single-process, at
# load 9-27) per second of its time in s47's quiet CI were 0.02 to 0.64, 0.58 over all 20
# default multihost tests (0.33 over the four longest), against 0.42 to 1.46 for
# integration's, 0.62 for a tf_runtime journey, 0.17 for test_fencing.py. A model of the
# run (benchmarks/ci_schedule.py: 2 cores shared by the running tests' demand, fitted to
# s47's durations and s46's 84% busy cores) puts this order at 1,243 -> 1,164 s of
# scheduled work with the multihost demand 0.33 (which gives s46's two-worker time within
# 1%), 1,215 s with 0.58 (11% off it); -n 4 at 1,072 or 1,114 s (two workers on the
# multihost files, the workers beyond the cores, as below; not measured). The multihost
# tests were one unit until session 46: about 1,385 s of the 1,488 s each worker had to do
# (the test durations of session 43's and 45's CI runs), so any growth of that directory
# made that one worker end last, alone; now, once integration's and tf_runtime's units are
# handed out, the multihost files left go to any worker before the unit tests, which end the
# run together. With integration and multihost as one unit, the suite was that unit alone
# (28.5 min), and the other worker sat idle for its last part. A scheduler of our own does
# the grouping: xdist's xdist_group marker renames each test's node id, which pytest 9 no
# longer allows.
_UNIT_PER_FILE = {"multihost": 3, "integration": 2, "tf_runtime": 1}  # the weight of their files' units
_MOSTLY_WAITING = 3  # the weight of the multihost files: one worker at a time, while heavier work is left


@functools.cache
def _unit_of(nodeid: str) -> tuple[str, int]:
    """The unit of work a test belongs to and how early that unit is handed out (higher:
    earlier; units of one weight go in collection order). A unit's own name (a file's path)
    gives the same answer."""
    parts = nodeid.split("/", 2)
    if len(parts) == 3 and parts[0] == "tests" and parts[1] in _UNIT_PER_FILE:
        return nodeid.split("::", 1)[0], _UNIT_PER_FILE[parts[1]]
    return nodeid, 0


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class HeaviestFirst(LoadScopeScheduling):
        """Units as _unit_of says, the heaviest handed out first to the worker that asks; a
        multihost unit, while an integration or tf_runtime unit is left, only while fewer
        other workers than the workers beyond the cores (at least one) have multihost tests
        left to run."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)[0]

        def _assign_work_unit(self, node: object) -> None:
            # Workers other than this one with multihost tests left to run, against the
            # workers beyond the cores (at least one): -n 3 on 2 cores, one; -n 4, two.
            holding = sum(
                any(_unit_of(scope)[1] == _MOSTLY_WAITING and not all(unit.values()) for scope, unit in units.items())
                for other, units in self.assigned_work.items() if other is not node)
            waiting_elsewhere = holding >= max(1, len(self.nodes) - (os.cpu_count() or 1))

            def weight(scope: str) -> float:
                # (the queue holds whole units, so the weight is read from any of its tests)
                w = _unit_of(next(iter(self.workqueue[scope])))[1]
                return 0.5 if w == _MOSTLY_WAITING and waiting_elsewhere else w

            # The first unit of the highest weight left (dicts keep insertion order).
            heaviest = max(self.workqueue, key=weight)
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)  # type: ignore[arg-type]

    config.option.loadscopereorder = False  # our order, not xdist's (by number of tests)
    return HeaviestFirst(config, log)


# ---- how busy the cores were --------------------------------------------------------


def _cpu_times() -> tuple[float, float] | None:
    """(busy, all) jiffies of every core since boot, from /proc/stat; None without it."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_CPU_AT_START] = _cpu_times()


def pytest_terminal_summary(terminalreporter: object, config: pytest.Config) -> None:
    """One line at the end of a run (the controller's, with -n): how busy the machine's cores
    were over it, whoever kept them so: the measure of how well the workers fill them."""
    start, end = config.stash.get(_CPU_AT_START, None), _cpu_times()
    if hasattr(config, "workerinput") or start is None or end is None or end[1] <= start[1]:
        return
    busy = (end[0] - start[0]) / (end[1] - start[1])
    cores = os.cpu_count() or 1
    secs = (end[1] - start[1]) / (os.sysconf("SC_CLK_TCK") * cores)
    terminalreporter.write_line(  # type: ignore[attr-defined]
        f"cores busy: {100 * busy:.0f}% of {cores} over {secs:.0f} s (the load beside the tests included)")


_CPU_AT_START = pytest.StashKey["tuple[float, float] | None"]()
