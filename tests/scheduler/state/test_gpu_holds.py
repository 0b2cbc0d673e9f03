"""What each placement records in the GPUs' history (gpu_holds, since session 49), on SQLite
and PostgreSQL: its GPUs and times, a grow keeping the GPUs it held, and "which job was on
this GPU at that time, doing what" read back. Before, the placements table kept only the
present: no command could say who held a GPU at 03:12."""

from __future__ import annotations

import itertools

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
