"""What each placement records in the GPUs' history (gpu_holds, since session 49), on SQLite
and PostgreSQL: its GPUs and times, a grow keeping the GPUs it held, and "which job was on
this GPU at that time, doing what" read back. Before, the placements table kept only the
present: no command could say who held a GPU at 03:12."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy.orm import Session

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.core import SchedulerCore
from scheduler.lifecycle import JobState
from scheduler.observe import holds
from scheduler.state import repo


async def test_each_placement_is_kept_with_its_times_and_the_state_then(any_core: SchedulerCore) -> None:
    core = any_core
    gpus = [common_pb2.Gpu(index=i, model="virtual") for i in range(4)]
    await core.register_server(helper_pb2.RegisterServerRequest(name="b", gpus=gpus))
    job = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=2, name="r50"))).job
    async with core.tx() as s:
        j = await repo.get_job(s, job.id)
        await repo.place(s, j, [("b", 2), ("b", 3)], "i1", 100.0, "placed")
    async with core.tx() as s:
        j = await repo.get_job(s, job.id)
        await repo.transition(s, j, JobState.SUSPENDED, 200.0, "time slice over")
    async with core.tx() as s:  # grown: GPU 3 is kept, not closed and opened again
        await repo.set_placement(s, job.id, [("b", 3), ("b", 0)], 300.0)
    async with core.tx() as s:
        j = await repo.get_job(s, job.id)
        await repo.requeue(s, j, 400.0, "server down")

    def read(s: Session) -> dict[str, object]:
        def at(t: float) -> list[tuple[str, int, str]]:
            return [(h.server, h.gpu, h.state_at) for h in holds.read(s, t, t).holds]
        return {"spans": [(h.gpu, h.start_at, h.end_at) for h in holds.read(s, 1.0, 1000.0).holds],
                **{f"at {t:.0f}": at(t) for t in (50.0, 150.0, 250.0, 350.0, 400.0)},
                "b/0": [(h.job_id, h.name) for h in holds.read(s, 350.0, 350.0, server="b", gpu=0).holds],
                "kept": holds.kept_since(s)}

    got = await core.read_sync(read)
    assert got["spans"] == [(2, 100.0, 300.0), (3, 100.0, 400.0), (0, 300.0, 400.0)], got
    assert got["at 150"] == [("b", 2, "running"), ("b", 3, "running")], got
    assert got["at 250"] == [("b", 2, "suspended"), ("b", 3, "suspended")], got
    assert got["at 350"] == [("b", 3, "suspended"), ("b", 0, "suspended")], got
    assert got["at 400"] == [] and got["at 50"] == [], got
    assert got["b/0"] == [(job.id, "r50")] and got["kept"] == 100.0, got


async def test_a_servers_time_up_is_kept_with_its_gpus(any_core: SchedulerCore) -> None:
    """server_spans (since session 49): the cluster's capacity over time, for `gandiva get
    usage`'s cluster line; the servers table keeps only the present."""
    from sqlalchemy import select

    from scheduler.state.models import ServerSpan

    core = any_core
    clock = itertools.count(100.0, 10.0)
    core.clock = lambda: next(clock)  # 100, 110, ...: each call its own time
    gpus = [common_pb2.Gpu(index=i, model="virtual") for i in range(4)]
    await core.register_server(helper_pb2.RegisterServerRequest(name="b", gpus=gpus))
    await core.register_server(helper_pb2.RegisterServerRequest(name="b", gpus=gpus))  # again: goes on
    core.monotonic = lambda: 10**10  # silence is measured on the monotonic clock
    assert await core.mark_stale_servers_down() == ["b"]
    await core.register_server(helper_pb2.RegisterServerRequest(name="b", gpus=gpus[:2]))  # back, a GPU count less

    def spans(s: Session) -> list[tuple[int, bool]]:
        rows = s.execute(select(ServerSpan.gpus, ServerSpan.end_at).order_by(ServerSpan.id)).all()
        return [(gpus, end is not None) for gpus, end in rows]

    assert await core.read_sync(spans) == [(4, True), (2, False)]


async def test_a_move_of_a_running_job_is_attained_service_as_gandiva_get_usage_counts_it(any_core: SchedulerCore) -> None:
    """A running job moved trains on at its source while its copy pre-warms (10-30 s a move in
    `gandiva demo`): its attained service (`describe`'s GPU time, `gandiva get users`, the
    policy's least-attained-service input) left the move out, 40 of 80 GPU-seconds below. A
    suspended job's move, and one that ends in the queue, are not counted; `gandiva get usage`
    reads the same figure from the state changes (scheduler.lifecycle.trains, one rule)."""
    from scheduler.observe.usage import report

    core = any_core
    await core.register_server(helper_pb2.RegisterServerRequest(
        name="b", gpus=[common_pb2.Gpu(index=i, model="virtual") for i in range(4)]))
    job = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=2))).job
    steps: list[tuple[float, JobState | tuple[int, int], str]] = [
        (100.0, (0, 1), "placed"), (110.0, JobState.MIGRATING, "defragment: b -> b"),
        (130.0, (2, 3), "migrated to b at step 9 (training paused 0.20s)"), (140.0, JobState.SUSPENDED, "time slice"),
        (150.0, JobState.MIGRATING, "lower the height"), (160.0, JobState.RUNNING, "pre-warm at b failed"),
        (160.0, JobState.SUSPENDED, "still suspended"),
        (170.0, JobState.RUNNING, "its turn"), (180.0, JobState.MIGRATING, "make room"),
        (190.0, JobState.QUEUED, "its server b went down")]
    t = core.clock()  # (after its submission: the accounting counts from there)
    for at, to, why in ((t + at, to, why) for at, to, why in steps):
        async with core.tx() as s:
            j = await repo.get_job(s, job.id)
            if isinstance(to, tuple):
                await repo.place(s, j, [("b", i) for i in to], f"i{at - t:.0f}", at, why)
            else:
                await repo.transition(s, j, to, at, why)
    async with core.tx(read=True) as s:
        attained = (await repo.get_job(s, job.id)).attained_service_s
    # Running 100-110, 130-140, 170-180; moved while running 110-130; not 150-160 nor 180-190.
    assert attained == pytest.approx((10 + 20 + 10 + 10) * 2), attained
    used = await core.read_sync(lambda s: report(s, t, t + 1000.0, None, True, 10))
    assert [u.gpu_seconds for u in used.jobs if u.job_id == job.id] == [pytest.approx(attained)]
    # HELD-H and the cluster's busy line, from the GPUs' history in SQL: the move's training on
    # its source GPUs (0, 1: held until its arrival at 130) counts, its destination's does not.
    assert ([u.held_gpu_seconds for u in used.jobs if u.job_id == job.id], used.busy_gpu_seconds) == (
        [pytest.approx(attained)], pytest.approx(attained))
