"""A policy's move refused before it began is said once (a job.migration event "not started
..."), not again each round it is decided and refused the same way. The engine remembers the
last refusal of each job, bounded: past the bound the whole memory used to be cleared, so every
job still refused had its refusal said again. Now the oldest entry goes out (hubs.remember)."""

from __future__ import annotations

import pytest

from protos.gandiva.v1 import common_pb2
from scheduler.core import STEPS_SEEN_KEPT, SchedulerCore
from scheduler.engine import live as live_module
from scheduler.engine.live import MOVES_REFUSED_KEPT, LiveEngine
from scheduler.errors import FailedPrecondition
from scheduler.policy.types import GpuRef
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine


async def test_a_refused_move_is_said_once_past_the_memorys_bound(sqlite_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        live = LiveEngine(core)
        ids = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id for _ in range(2)]

        async def refused(core: SchedulerCore, job_id: str, to: list, reason: str) -> None:
            raise FailedPrecondition(f"job {job_id} has no runtime connected")

        monkeypatch.setattr(live_module, "begin_migration", refused)
        # Jobs refused earlier (long ended), as many as are kept.
        live._moves_refused.update((f"old-{i}", "not started") for i in range(MOVES_REFUSED_KEPT))
        for job_id in (ids[0], ids[1], ids[0]):  # the first job refused again, the same way
            with pytest.raises(FailedPrecondition):
                await live._policy_move(job_id, [GpuRef("s1", 0)], "lower the height")
        async with core.sessions() as s:
            said = await repo.list_events(s, job_id=ids[0], kinds=("job.migration",))
        # Before: the second job's refusal cleared the memory, and the first's was said twice.
        assert len(said) == 1 and said[0].message.startswith("not started (lower the height; to s1/0)")
        assert len(live._moves_refused) == MOVES_REFUSED_KEPT
    finally:
        await engine.dispose()


async def test_the_steps_of_a_launch_still_reporting_outlive_the_memorys_bound(sqlite_url: str) -> None:
    """The highest step each launch reported (what a job's end reads when its last reports
    were not written yet) is kept for STEPS_SEEN_KEPT launches. Past it, the whole memory was
    cleared: a launch reporting all along lost its count too. Now the launch that reported
    least recently goes out."""
    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        core._steps_seen.update(((f"old-{i}", "i1"), 5) for i in range(STEPS_SEEN_KEPT - 1))
        await core.record_progress("j-1", "i1", 900, 10.0, 0.1, {})
        await core.record_progress("j-2", "i1", 7, 10.0, 0.1, {})  # one past the bound: the oldest goes
        await core.record_progress("j-3", "i1", 7, 10.0, 0.1, {})
        assert core.steps_seen("j-1", "i1") == 900  # before: 0, cleared with the rest
        assert core.steps_seen("old-0", "i1") == 0 and len(core._steps_seen) == STEPS_SEEN_KEPT
    finally:
        await engine.dispose()


async def test_a_move_refused_again_as_before_is_not_done_in_the_decision_log(sqlite_url: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy decides a refused move again each round, and each round's `migrate` is in the
    decision log; the refusal is said once (above). The second and later decisions read "not
    known yet" for as long as the job lived (`gandiva top --decisions`)."""
    from scheduler.observe.metrics import SchedulerMetrics

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        live = LiveEngine(core)
        live.observer = metrics = SchedulerMetrics()
        job_id = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id

        async def refused(core: SchedulerCore, job_id: str, to: list, reason: str) -> None:
            raise FailedPrecondition(f"job {job_id} has no runtime connected")

        monkeypatch.setattr(live_module, "begin_migration", refused)
        for at in (1.0, 2.0):  # two rounds: each logs its decision, then carries it out
            metrics.log.add(at, "migrate", job_id, ("s1/0",), "lower the height")
            with pytest.raises(FailedPrecondition):
                await live._policy_move(job_id, [GpuRef("s1", 0)], "lower the height")
        assert [(r.kind, r.outcome) for r in metrics.log.records] == [
            ("migrate", "not done"), ("not-done", ""), ("migrate", "not done")]
    finally:
        await engine.dispose()
