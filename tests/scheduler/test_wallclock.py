"""The scheduler's clock (scheduler.wallclock.StepFreeClock) against steps of the system's
wall clock. The live case (a real scheduler under libfaketime, two jobs time-sliced on
one GPU, its wall clock stepped an hour back): tests/migration_helper/
test_scheduler_clock_jump.py."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import SchedulerCore
from scheduler.wallclock import CATCH_UP_PACE, StepFreeClock


class Clocks:
    """A fake system: its wall clock (which may be stepped) and its monotonic clock."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_800_000_000.0, 5_000.0

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def make() -> tuple[Clocks, StepFreeClock]:
    clocks = Clocks()
    return clocks, StepFreeClock(lambda: clocks.wall, lambda: clocks.mono)


def test_without_steps_it_is_the_wall_clock() -> None:
    clocks, clock = make()
    for _ in range(100):
        clocks.run(0.37)
        assert clock() == clocks.wall


def test_a_step_back_of_an_hour_neither_turns_it_back_nor_stretches_a_time_slice(caplog: pytest.LogCaptureFixture) -> None:
    clocks, clock = make()
    clocks.run(10)
    ends = clock() + 60  # a 60-s slice in progress
    clocks.wall -= 3600  # NTP: the clock ran an hour ahead
    with caplog.at_level(logging.WARNING, "scheduler.wallclock"):
        readings = []
        for _ in range(70):
            clocks.run(1)
            readings.append(clock())
    assert readings == sorted(readings)
    # The slice ends within 60 / 0.9 s, not an hour later (as on the wall clock).
    assert sum(r < ends for r in readings) <= 60 / CATCH_UP_PACE
    assert [r.getMessage()[:38] for r in caplog.records] == ["the wall clock stepped back by 3600.0s"]
    # Caught up with the wall clock after 3600 / (1 - 0.9) s, and the wall clock again.
    clocks.run(36_000)
    assert clock() == clocks.wall
    clocks.run(1)
    assert clock() == clocks.wall


def test_a_step_forward_is_followed_at_once() -> None:
    clocks, clock = make()
    clocks.run(1)
    clocks.wall += 3600
    clocks.run(1)
    assert clock() == clocks.wall


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(-7200, 7200)), max_size=30))
def test_it_never_goes_back_nor_runs_slower_than_nine_tenths_or_behind_the_wall_clock(
        moves: list[tuple[float, float]]) -> None:
    clocks, clock = make()
    last = clock()
    for ran, step in moves:
        clocks.run(ran)
        clocks.wall += step
        now = clock()
        assert now >= last + CATCH_UP_PACE * ran - 1e-6
        assert now >= clocks.wall
        last = now


def test_the_scheduler_runs_on_it_unless_a_test_gives_its_own_clock(tmp_path: object) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine
    engine = create_async_engine("sqlite+aiosqlite://")
    assert isinstance(SchedulerCore(engine).clock, StepFreeClock)
    assert SchedulerCore(engine, clock=lambda: 5.0).clock() == 5.0


def test_a_fence_runs_its_length_on_the_monotonic_clock_through_a_step_forward() -> None:
    """A job's fence (queued until an unanswered launch's lease has run out) is a time on
    this clock in the database; a step forward ended it at once. The live case:
    tests/scheduler/api/test_clock_forward_fence.py."""
    from sqlalchemy.ext.asyncio import create_async_engine
    clocks = Clocks()
    core = SchedulerCore(create_async_engine("sqlite+aiosqlite://"), clock=lambda: clocks.wall,
                         monotonic=lambda: clocks.mono)
    now = core.clock()
    core.note_fence("j", now + 6, now)
    clocks.wall += 3600
    clocks.run(5.9)
    assert core.fence_holds("j", now + 6, core.clock())
    clocks.run(0.2)
    assert not core.fence_holds("j", now + 6, core.clock())
    # One written before this scheduler started runs from its first look.
    later = core.clock()
    assert core.fence_holds("k", later + 6, later)
    clocks.wall += 3600
    assert core.fence_holds("k", later + 6, core.clock())
    clocks.run(6.1)
    assert not core.fence_holds("k", later + 6, core.clock())
    assert not core.fence_holds("m", 0.0, core.clock())


def test_a_fence_read_after_a_restart_is_no_longer_than_any_fence_though_the_clock_was_stepped_back() -> None:
    """The wall clock stepped an hour back while a scheduler ran: its clock kept time (above),
    and a fence it wrote is a time an hour ahead of the system's wall clock. A scheduler started
    again on that database (its clock the system's again) held the job for that hour and the
    fence, where the lease it waits for had run out within the heartbeat timeout (no fence is
    longer). Now at most that timeout from its first look."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from scheduler.core import Settings
    clocks = Clocks()
    before = StepFreeClock(lambda: clocks.wall, lambda: clocks.mono)
    clocks.run(10)
    clocks.wall -= 3600  # NTP steps the system's clock back; `before` keeps time
    clocks.run(1)
    written = before()
    fenced_until = written + 6.0  # a 6-s heartbeat timeout's fence
    assert fenced_until - clocks.wall > 3600
    clocks.run(1)  # the scheduler restarted: its clock reads the system's again
    again = SchedulerCore(create_async_engine("sqlite+aiosqlite://"),
                          settings=Settings(heartbeat_interval_s=0.2, down_after_s=6.0),
                          clock=StepFreeClock(lambda: clocks.wall, lambda: clocks.mono),
                          monotonic=lambda: clocks.mono)
    assert again.fence_holds("j", fenced_until, again.clock())
    clocks.run(5.9)
    assert again.fence_holds("j", fenced_until, again.clock())
    clocks.run(0.2)
    assert not again.fence_holds("j", fenced_until, again.clock()), "held past any fence's length"


async def test_a_checkpoint_wait_read_after_a_restart_is_no_longer_than_the_wait_though_the_clock_was_stepped_back(
        ) -> None:
    """A queued job waits up to --checkpoint-wait (60 s) for the down server holding its
    checkpoint, counted from that server's last heartbeat. The wall clock stepped an hour back
    while a scheduler ran (its clock kept time) and it recorded that heartbeat; a scheduler
    started again (its clock the system's) read it an hour in the future: the job waited
    "3660s more at most" for the server, not 60 s. Real SQLite rows, the engine's own plan."""
    from types import SimpleNamespace

    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from scheduler.core import Settings
    from scheduler.engine.live import _restore_plan
    from scheduler.state.models import Base, Server

    clocks = Clocks()
    before = StepFreeClock(lambda: clocks.wall, lambda: clocks.mono)
    clocks.run(10)
    clocks.wall -= 3600
    clocks.run(1)
    heard = before()  # y's last heartbeat, as the scheduler before recorded it
    clocks.run(5)  # y goes down; the scheduler restarted: its clock reads the system's again
    db = create_async_engine("sqlite+aiosqlite://")
    async with db.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    again = SchedulerCore(db, settings=Settings(heartbeat_interval_s=0.2, down_after_s=6.0),
                          clock=StepFreeClock(lambda: clocks.wall, lambda: clocks.mono),
                          monotonic=lambda: clocks.mono)
    clocks.run(2)
    now = again.clock()
    job = SimpleNamespace(restore_checkpoint="/dev/shm/gandiva/j/ckpt-42", restore_server="y")
    async with async_sessionmaker(db)() as s:
        for name, up in (("x", True), ("y", False)):
            s.add(Server(name=name, address=f"{name}:1", num_gpus=1, ramdisk="/dev/shm/gandiva", up=up,
                         registered_at=heard, last_heartbeat=heard))
        await s.flush()
        plan = await _restore_plan(s, job, "x", now, 60.0, heard_ago=again.heard_ago)
    await db.dispose()
    assert 0 < plan.wait_until - now <= 60.0, plan.note
