"""Host memory on the scheduler's side: what helpers report is stored (SQLite and
PostgreSQL) and reaches the policy's views; a profile with host memory alone never
reads as measured GPU memory; the policy options take sizes."""

from __future__ import annotations

import pytest

from gandiva_cli.main import main
from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.cli.serve import policy_options
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.policy import ClusterSnapshot, GpuRef, JobProfile, JobView, ServerView, get_policy
from scheduler.policy.types import Pack, PolicyConfig
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine

GIB = 1 << 30


async def test_reports_are_stored_and_reach_the_policy(db_url: str) -> None:
    engine = make_engine(db_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        live = LiveEngine(core, config=PolicyConfig(job_host_memory_bytes=GIB // 2))
        gpus = [common_pb2.Gpu(index=i, memory_total_bytes=16 * GIB) for i in range(2)]
        await core.register_server(helper_pb2.RegisterServerRequest(name="s1", gpus=gpus, host_memory_bytes=64 * GIB))
        await core.register_server(helper_pb2.RegisterServerRequest(name="s2", gpus=gpus[:1]))
        ids = [(await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id for _ in range(4)]
        async with core.tx() as s:
            for k, job_id in enumerate(ids[:3]):
                await repo.place(s, await repo.get_job(s, job_id, for_update=True), [("s1", k % 2)], f"inc{k}", 1.0, "test")
        await core.gpu_samples(helper_pb2.GpuSamplesRequest(server="s1", host_memory=[
            helper_pb2.JobHostMemory(job_id=ids[0], incarnation="inc0", rss_bytes=3 * GIB),
            helper_pb2.JobHostMemory(job_id=ids[1], incarnation="stale", rss_bytes=9 * GIB),  # an old launch
            helper_pb2.JobHostMemory(job_id=ids[3], incarnation="inc3", rss_bytes=9 * GIB),  # not placed (queued)
            helper_pb2.JobHostMemory(job_id="job-unknown", incarnation="x", rss_bytes=9 * GIB),
        ]))
        assert [(await core.get_job(j)).host_memory_bytes for j in ids] == [3 * GIB, 0, 0, 0]
        # A resident set that drifts by pages is not rewritten; one that moved is.
        for rss, stored in [(3 * GIB + (8 << 20), 3 * GIB), (2 * GIB, 2 * GIB), (3 * GIB, 3 * GIB)]:
            await core.gpu_samples(helper_pb2.GpuSamplesRequest(server="s1", host_memory=[
                helper_pb2.JobHostMemory(job_id=ids[0], incarnation="inc0", rss_bytes=rss)]))
            assert (await core.get_job(ids[0])).host_memory_bytes == stored
        assert [d.host_memory_bytes for d in await core.list_jobs()] == [3 * GIB, 0, 0, 0]
        loads = {ld.server.name: ld for ld in await core.list_servers()}
        assert loads["s1"].server.host_memory_bytes == 64 * GIB and loads["s2"].server.host_memory_bytes == 0
        # The measured job at what it holds, the two not measured at the policy's assumption.
        assert loads["s1"].host_used(GIB // 2) == 4 * GIB
        assert core.host_memory_budget == (0.9, GIB // 2)
        # A job spread over two servers holds its whole host memory on each (its processes there).
        async with core.tx() as s:
            await repo.place(s, await repo.get_job(s, ids[3], for_update=True), [("s1", 0), ("s2", 0)], "inc3", 2.0, "test")
        await core.gpu_samples(helper_pb2.GpuSamplesRequest(server="s2", host_memory=[
            helper_pb2.JobHostMemory(job_id=ids[3], incarnation="inc3", rss_bytes=GIB)]))
        loads = {ld.server.name: ld for ld in await core.list_servers()}
        assert (loads["s1"].host_used(GIB // 2), loads["s2"].host_used(GIB // 2)) == (5 * GIB, GIB)

        snap = await live.snapshot()
        assert {s.name: s.host_memory_bytes for s in snap.servers} == {"s1": 64 * GIB, "s2": 0}
        views = {j.id: j for j in snap.jobs}
        measured = views[ids[0]].profile
        assert measured is not None and measured.host_memory_bytes == 3 * GIB and not measured.gpu_measured
        assert views[ids[1]].profile is None and views[ids[3]].profile.host_memory_bytes == GIB  # type: ignore[union-attr]
        # GPU memory measured later joins the host memory in one profile.
        await core.gpu_samples(helper_pb2.GpuSamplesRequest(server="s1", samples=[helper_pb2.GpuSample(
            gpu_index=0, job_id=ids[0], job_memory_bytes=2 * GIB, utilization=0.4)]))
        profile = {j.id: j for j in (await live.snapshot()).jobs}[ids[0]].profile
        assert profile == JobProfile(2 * GIB, 0.4, None, host_memory_bytes=3 * GIB) and profile.gpu_measured
    finally:
        await core.dispose()
        await engine.dispose()


def _pair(profile: JobProfile) -> ClusterSnapshot:
    gpu = (GpuRef("s0", 0),)
    jobs = tuple(JobView(j, 1, state=state, placement=gpu, rate=10.0, profile=profile, submitted_at=i,
                         last_state_change_at=0.0) for i, (j, state) in enumerate([("a", "RUNNING"), ("b", "SUSPENDED")]))
    return ClusterSnapshot(100.0, (ServerView("s0", 1, host_memory_bytes=64 * GIB),), jobs)


@pytest.mark.parametrize(("profile", "packs"), [
    (JobProfile(2 * GIB, 0.2, 0.1, host_memory_bytes=GIB), True),
    # Host memory measured, GPU memory not (0): no packing on a guess.
    (JobProfile(0, 0.2, 0.1, host_memory_bytes=GIB), False),
])
def test_packing_needs_measured_gpu_memory(profile: JobProfile, packs: bool) -> None:
    policy = get_policy("gandiva", PolicyConfig())
    decisions = [d for t in (100.0, 101.0, 102.0) for d in policy.decide(
        ClusterSnapshot(t, _pair(profile).servers, _pair(profile).jobs))]
    assert any(isinstance(d, Pack) for d in decisions) == packs


def test_policy_options_take_sizes_and_fractions() -> None:
    got = policy_options(["host_memory_use=0.8", "job_host_memory_bytes=2GiB"])
    assert got == {"host_memory_use": 0.8, "job_host_memory_bytes": 2 * GIB}
    assert PolicyConfig(**got).job_host_memory_bytes == 2 * GIB
    assert policy_options(["job_host_memory_bytes=1073741824"]) == {"job_host_memory_bytes": GIB}
    with pytest.raises(ValueError, match=r"job_host_memory_bytes=lots.*'lots' is not a size"):
        policy_options(["job_host_memory_bytes=lots"])
    with pytest.raises(ValueError, match="host_memory_use=x'.*not a float"):
        policy_options(["host_memory_use=x"])


def test_balance_park_is_on_live_as_in_the_simulator_and_can_be_turned_off() -> None:
    """A parked job relaunched on another server has its checkpoint fetched there first
    (tests/scheduler/api/test_fencing.py), so the live default is the simulator's."""
    assert PolicyConfig(**policy_options([])).balance_park
    assert not PolicyConfig(**policy_options(["balance_park=false"])).balance_park


@pytest.mark.parametrize(("option", "says"), [
    ("host_memory_use=1.5", "host_memory_use must be in (0, 1]"),
    ("job_host_memory_bytes=2 parsecs", "is not a size"),
])
def test_scheduler_refuses_bad_host_memory_options(option: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scheduler", "--policy-option", option]) == 2
    assert says in capsys.readouterr().err  # errors on stderr (since 1b81b76)
