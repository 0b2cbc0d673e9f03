"""A job MIGRATING in the live scheduler, seen by the policy: bound to its source and its
destination GPUs until the move ends (the durable Migration row holds the destination), so
it is in no time-slice group while it moves. The group it lands in must not resume the job
suspended for it meanwhile (session 50, local cluster: both then ran on the same two GPUs
for 90 s, never taking turns and never judged as a pack)."""

from __future__ import annotations

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.lifecycle import JobState
from scheduler.policy import get_policy
from scheduler.policy.types import GpuRef, PolicyConfig
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine
from scheduler.state.models import Job, Migration, Placement


async def test_the_job_suspended_for_a_move_onto_its_gpus_waits_for_the_move(sqlite_url: str) -> None:
    # SQLite only: what is checked is how the engine's snapshot shows a move and what the
    # policy makes of it, the same code on PostgreSQL.
    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        cfg = PolicyConfig(quantum_s=6.0, enable_packing=False, enable_migration=False, probe_slices=False)
        live = LiveEngine(core, config=cfg)
        for name in ("s1", "s2"):
            await core.register_server(helper_pb2.RegisterServerRequest(
                name=name, gpus=[common_pb2.Gpu(index=0), common_pb2.Gpu(index=1)]))
        big1, big2 = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=2))).job.id
                      for _ in range(2)]
        now = core.clock()
        # big1 moving from s1 onto s2 (its prewarm begun), big2 suspended there for it.
        async with core.sessions() as s, s.begin():
            for jid, state, server in ((big1, "MIGRATING", "s1"), (big2, "SUSPENDED", "s2")):
                job = await s.get(Job, jid)
                assert job is not None
                await repo.transition(s, job, JobState.RUNNING, now - 30.0, "placed")
                await repo.transition(s, job, JobState(state), now - 1.0, "hand s1 over")
                s.add_all([Placement(job_id=jid, server_name=server, gpu_index=i) for i in (0, 1)])
            s.add(Migration(job_id=big1, phase="prewarm", was_state="RUNNING", reason="hand s1 over",
                            source_server="s1", source_incarnation="i0", dest_server="s2", dest_gpus=[0, 1],
                            dest_incarnation="i1", fallback_incarnation="i2", checkpoint_path="", step=-1,
                            started_at=now - 1.0, updated_at=now - 1.0))
        snap = await live.snapshot()
        views = {j.id: j for j in snap.jobs}
        assert views[big1].placement == tuple(GpuRef(n, i) for n in ("s1", "s2") for i in (0, 1))
        # Before: Resume big2 ("its turn in the time-slice group") onto the GPUs big1 lands on.
        assert [d for d in get_policy("gandiva", cfg).decide(snap) if d.job_id == big2] == []
    finally:
        await engine.dispose()
