"""Queue order in the live scheduler: what breaks ties of submit time."""

from __future__ import annotations

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.policy import get_policy
from scheduler.policy.cluster import arrival_key
from scheduler.policy.types import Place, PolicyConfig
from scheduler.state import migrate
from scheduler.state.db import make_engine


async def test_a_multi_jobs_members_queue_in_index_order(db_url: str) -> None:
    """The members of a multi-job (a sweep) are submitted at one time; the queues break that
    tie by member index. They went by job id (random), so a sweep of 12 started in any
    order under fifo, yarn-cs and gandiva."""
    engine = make_engine(db_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        live = LiveEngine(core, config=PolicyConfig())
        await core.register_server(helper_pb2.RegisterServerRequest(name="s1", gpus=[common_pb2.Gpu(index=0)]))
        specs = [common_pb2.JobSpec(command=["python", "t.py"], gpus=1, index=i) for i in range(12)]
        await core.submit_multi("sweep", specs)
        index = {d.job.id: d.job.array_index for d in await core.list_jobs()}
        snap = await live.snapshot()
        assert len({j.submitted_at for j in snap.jobs}) == 1
        assert [index[j.id] for j in sorted(snap.jobs, key=arrival_key)] == list(range(12))
        # fifo starts the first; gandiva places all twelve on the GPU (time-sliced), in order.
        assert [index[d.job_id] for d in get_policy("fifo").decide(snap) if isinstance(d, Place)] == [0]
        assert [index[d.job_id] for d in get_policy("gandiva").decide(snap) if isinstance(d, Place)] == list(range(12))
    finally:
        await engine.dispose()
