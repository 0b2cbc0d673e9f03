"""A cordoned server (ServerView.schedulable False, `gandiva cordon`) takes no job: no
Place, Pack, Migrate, Grow or Resume brings a job to it that is not bound to it already;
the jobs on it keep running and taking their turns; uncordoned, it takes work again."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.policy import (
    POLICIES,
    ClusterSnapshot,
    GpuRef,
    Grow,
    JobView,
    Migrate,
    Pack,
    Park,
    Place,
    PolicyConfig,
    Resume,
    ServerView,
    Shrink,
    Suspend,
    Unpack,
    get_policy,
)
from scheduler.policy.cluster import Ledger

STARTS = (Place, Pack, Resume, Grow, Shrink, Migrate)


def _targets(d: object) -> tuple[GpuRef, ...]:
    return d.to_gpus if isinstance(d, Migrate) else d.gpus  # type: ignore[attr-defined]


def _onto_cordoned(snap: ClusterSnapshot, decisions: list) -> list:
    """The decisions that bring a job onto a GPU of a cordoned server it does not hold."""
    cordoned = {s.name for s in snap.servers if not s.schedulable}
    held = {j.id: set(j.placement) for j in snap.jobs}
    return [d for d in decisions if isinstance(d, STARTS)
            and any(g.server in cordoned and g not in held[d.job_id] for g in _targets(d))]


def _apply(snap: ClusterSnapshot, decisions: list, now: float) -> ClusterSnapshot:
    jobs = {j.id: j for j in snap.jobs}
    for d in decisions:
        j = jobs[d.job_id]
        if isinstance(d, (Suspend, Unpack)):
            jobs[d.job_id] = dataclasses.replace(j, state="SUSPENDED", last_state_change_at=now)
        elif isinstance(d, Park):
            jobs[d.job_id] = dataclasses.replace(j, state="QUEUED", placement=(), last_state_change_at=now)
        elif isinstance(d, STARTS):
            jobs[d.job_id] = dataclasses.replace(j, state="RUNNING", placement=tuple(sorted(_targets(d))),
                                                 last_state_change_at=now, rate=1.0)
    return ClusterSnapshot(now, snap.servers, tuple(jobs.values()))


def _cordon(snap: ClusterSnapshot, names: set[str]) -> ClusterSnapshot:
    servers = tuple(dataclasses.replace(s, schedulable=s.name not in names) for s in snap.servers)
    return ClusterSnapshot(snap.now, servers, snap.jobs)


def test_a_cordoned_server_takes_no_new_job_and_keeps_its_running_one() -> None:
    servers = (ServerView("a", 4, schedulable=False), ServerView("b", 4))
    running = JobView("r", 1, state="RUNNING", placement=(GpuRef("a", 0),), rate=1.0)
    queued = [JobView(f"q{i}", 1, submitted_at=float(i)) for i in range(6)]
    out = get_policy("gandiva").decide(ClusterSnapshot(10.0, servers, (running, *queued)))
    placed = [d for d in out if isinstance(d, Place)]
    assert len(placed) == 6 and all(g.server == "b" for d in placed for g in d.gpus)  # 2 time-sliced there
    assert not [d for d in out if d.job_id == "r"], "the job running on the cordoned server is left alone"


def test_a_cordoned_servers_time_slice_group_takes_no_newcomer() -> None:
    servers = (ServerView("a", 1, schedulable=False), ServerView("b", 1))
    pair = (JobView("x", 1, state="RUNNING", placement=(GpuRef("a", 0),), rate=1.0, last_state_change_at=0.0),
            JobView("y", 1, state="SUSPENDED", placement=(GpuRef("a", 0),), rate=1.0, last_state_change_at=0.0))
    busy = JobView("z", 1, state="RUNNING", placement=(GpuRef("b", 0),), rate=1.0)
    newcomer = JobView("n", 1, submitted_at=1.0)
    policy = get_policy("gandiva", PolicyConfig(quantum_s=5.0))
    out = policy.decide(ClusterSnapshot(100.0, servers, (*pair, busy, newcomer)))
    assert not _onto_cordoned(ClusterSnapshot(100.0, servers, (*pair, busy, newcomer)), out)
    assert all(g.server == "b" for d in out if d.job_id == "n" and isinstance(d, Place) for g in d.gpus)
    assert any(isinstance(d, Place) and d.job_id == "n" for d in out), "it joins b's job, not a's pair"


def test_uncordoned_the_server_takes_work_again() -> None:
    queued = tuple(JobView(f"q{i}", 2, submitted_at=float(i)) for i in range(2))
    policy = get_policy("gandiva")
    snap = ClusterSnapshot(1.0, (ServerView("a", 4, schedulable=False),), queued)
    assert not [d for d in policy.decide(snap) if isinstance(d, Place)]
    snap = _cordon(ClusterSnapshot(2.0, snap.servers, queued), set())
    assert {g.server for d in policy.decide(snap) if isinstance(d, Place) for g in d.gpus} == {"a"}


def test_the_ledger_never_offers_a_cordoned_servers_gpus_as_jobs_leave_it() -> None:
    servers = (ServerView("a", 4, schedulable=False), ServerView("b", 4))
    jobs = (JobView("r", 2, state="RUNNING", placement=(GpuRef("a", 0), GpuRef("a", 1))),)
    ledger = Ledger.of(ClusterSnapshot(0.0, servers, jobs))
    assert ledger.num_free("a") == 0 and "a" not in ledger.idle_servers
    ledger.unbind("r")
    assert ledger.num_free("a") == 0 and "a" not in ledger.idle_servers and ledger.total_free() == 4
    ledger.hold(["a", "b"], 8)
    ledger.release()
    assert ledger.num_free("a") == 0 and "a" not in ledger.idle_servers


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_policy_brings_a_job_onto_a_cordoned_server(name: str, data: st.DataObject) -> None:
    """Rounds of random arrivals, departures and cordons over 3 servers: no decision of any
    policy puts a job on a cordoned server's GPU it did not hold already."""
    draw = data.draw
    servers = tuple(ServerView(f"s{i}", draw(st.sampled_from([2, 4])), gpu_memory_bytes=16 << 30) for i in range(3))
    policy = get_policy(name, PolicyConfig(quantum_s=4.0, pack_trial_s=4.0, defrag_interval_s=2.0, grow_idle_s=2.0))
    snap = ClusterSnapshot(0.0, servers, ())
    now, n = 0.0, 0
    for _ in range(draw(st.integers(3, 12))):
        now += draw(st.sampled_from([1.0, 3.0, 7.0]))
        arrivals = tuple(JobView(f"j{n + k}", draw(st.sampled_from([1, 1, 2, 4])), submitted_at=now,
                                 grow_shrink=draw(st.booleans()), priority=draw(st.integers(1, 2)))
                         for k in range(draw(st.integers(0, 4))))
        n += len(arrivals)
        done = set(draw(st.lists(st.sampled_from([j.id for j in snap.jobs]), max_size=2))) if snap.jobs else set()
        jobs = tuple(j for j in snap.jobs if j.id not in done) + arrivals
        cordoned = set(draw(st.lists(st.sampled_from([s.name for s in servers]), max_size=2)))
        snap = _cordon(ClusterSnapshot(now, servers, jobs), cordoned)
        out = policy.decide(snap)
        assert not _onto_cordoned(snap, out), (cordoned, out)
        snap = _apply(snap, out, now)
