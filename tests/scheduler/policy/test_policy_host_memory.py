"""Host memory bounds time-slicing on a server (PolicyConfig.host_memory_use).

A suspended job keeps its process, with its GPU state copied out, in its server's host
memory, and so does a running one. With a server's host memory known, the policy puts
no job's process on a server where it would not fit beside the jobs already there: a
newcomer queues (and says why) instead of joining a group, and no migration moves a job
onto a server whose memory is full. Unknown host memory (0) is not checked.
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.cluster import Ledger
from scheduler.policy.types import ClusterSnapshot, JobProfile, Migrate, Place, Queue, ServerView

GIB = 1 << 30
# probe_slices off: the cap and host memory alone decide who joins a group here.
CFG = PolicyConfig(enable_packing=False, enable_grow_shrink=False, probe_slices=False)


def _server(name: str, gpus: int, host_gib: float) -> ServerView:
    return ServerView(name, gpus, host_memory_bytes=int(host_gib * GIB))


def _measured(host_gib: float) -> JobProfile:
    return JobProfile(2 * GIB, 0.9, 0.1, host_memory_bytes=int(host_gib * GIB))


def _placed(decisions: list) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Place)]


@pytest.mark.parametrize(("host_gib", "fits"), [(0.0, 8), (20.0, 4), (40.0, 8), (9.0, 2)])
def test_a_servers_host_memory_bounds_how_many_jobs_share_its_gpu(mk, host_gib: float, fits: int) -> None:
    """Nine 1-GPU jobs not measured yet (4 GiB each assumed) arrive at a one-GPU server with
    a group cap of 8: 90% of 20 GiB holds four, of 9 GiB two; 90% of 40 GiB would hold nine,
    so the cap binds first (eight), as it does with unknown memory (0). The reason a job
    waits names the host memory only where memory held it back."""
    cfg = dataclasses.replace(CFG, max_jobs_per_gpu=8)
    jobs = [mk.job(f"j{i}", submitted_at=float(i)) for i in range(9)]
    d = get_policy("gandiva", cfg).decide(mk.snap(100.0, (_server("s0", 1, host_gib),), *jobs))
    placed = _placed(d)
    assert placed == [f"j{i}" for i in range(fits)]  # in queue order
    queued = {q.job_id: q.reason for q in d if isinstance(q, Queue)}
    assert sorted(queued) == sorted(f"j{i}" for i in range(fits, 9))
    for reason in queued.values():
        if host_gib and fits < 8:
            assert "host memory of s0 is full" in reason and "4.0 GiB" in reason
        else:
            assert "host memory" not in reason


def test_measured_host_memory_replaces_the_assumption(mk) -> None:
    """Jobs measured at 1 GiB: nine fit in 90% of 10 GiB where the assumed 4 GiB lets two in;
    one measured at 6 GiB does not fit beside them and waits."""
    small = [mk.job(f"m{i}", submitted_at=float(i), profile=_measured(1.0)) for i in range(9)]
    big = mk.job("big", submitted_at=20.0, profile=_measured(6.0))
    cfg = dataclasses.replace(CFG, max_jobs_per_gpu=16)
    d = get_policy("gandiva", cfg).decide(mk.snap(100.0, (_server("s0", 1, 10.0),), *small, big))
    assert _placed(d) == [f"m{i}" for i in range(9)]
    assert [q.job_id for q in d if isinstance(q, Queue)] == ["big"]


def test_a_job_larger_than_the_budget_still_runs_alone(mk) -> None:
    """A job measured at 30 GiB on a server of 16 GiB: nothing else is there, so it runs
    (it would never run otherwise); nothing joins it."""
    huge = mk.job("huge", submitted_at=0.0, profile=_measured(30.0))
    other = mk.job("other", submitted_at=1.0, profile=_measured(0.5))
    d = get_policy("gandiva", CFG).decide(mk.snap(10.0, (_server("s0", 1, 16.0),), huge, other))
    assert _placed(d) == ["huge"]
    assert [q.job_id for q in d if isinstance(q, Queue)] == ["other"]


def test_a_job_spread_over_servers_holds_memory_on_each(mk) -> None:
    """An 8-GPU job over two 4-GPU servers runs a process on each: each server counts its
    whole host memory (5.5 GiB). With 90% of 10 GiB per server, a second 8-GPU job (4 GiB
    assumed) cannot join the first's group; one measured at 3 GiB can."""
    srv = (_server("s0", 4, 10.0), _server("s1", 4, 10.0))
    first = mk.job("a", state="RUNNING", placement=mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3),
                   profile=_measured(5.5))
    ledger = Ledger.of(mk.snap(0.0, srv, first))
    assert ledger.host_used("s0", 4 * GIB) == ledger.host_used("s1", 4 * GIB) == 5.5 * GIB
    d = get_policy("gandiva", CFG).decide(mk.snap(10.0, srv, first, mk.job("b", gpus=8, submitted_at=5.0)))
    assert _placed(d) == []
    d = get_policy("gandiva", CFG).decide(mk.snap(10.0, srv, first, mk.job("c", gpus=8, submitted_at=5.0,
                                                                              profile=_measured(3.0))))
    assert _placed(d) == ["c"]


def test_the_ledger_charges_follow_binds_and_measurements(mk) -> None:
    """The ledger's account of a server's host memory follows the jobs as they come, move,
    leave and get measured; unmeasured ones are priced at the assumption when asked."""
    srv = (_server("s0", 2, 64.0), _server("s1", 2, 64.0))
    a = mk.job("a", state="RUNNING", placement=mk.on("s0", 0))
    b = mk.job("b", state="SUSPENDED", placement=mk.on("s0", 0), profile=_measured(3.0))
    ledger = Ledger.of(mk.snap(0.0, srv, a, b))
    assert ledger.host_used("s0", 4 * GIB) == 7 * GIB and ledger.host_used("s1", 4 * GIB) == 0
    # b moves to s1; a gets measured at 1 GiB; then a leaves.
    b2 = dataclasses.replace(b, state="RUNNING", placement=mk.on("s1", 1))
    a2 = dataclasses.replace(a, profile=_measured(1.0))
    ledger.sync(mk.snap(1.0, srv, a2, b2))
    assert ledger.host_used("s0", 4 * GIB) == 1 * GIB and ledger.host_used("s1", 4 * GIB) == 3 * GIB
    ledger.sync(mk.snap(2.0, srv, b2))
    assert ledger.host_used("s0", 4 * GIB) == 0 and ledger.host_used("s1", 4 * GIB) == 3 * GIB


def test_no_migration_moves_a_job_onto_a_server_whose_memory_is_full(mk) -> None:
    """balance_sizes hands s1 (one 4-GPU job) to crowded 1-GPU jobs when s2's 4-GPU group can
    take the 4-GPU job (tests/.../test_policy_balance_sizes.py). With s2's host memory full
    (its job measured at 15 GiB of 90% of 16), the hand-over has nowhere to send it: nothing
    moves. With room for it, the same cluster hands s1 over."""
    def cluster(s2_gib: float) -> ClusterSnapshot:
        jobs = []
        for gpu in range(4):
            for k in range(8):
                jobs.append(mk.job(f"small{gpu}.{k}", state="RUNNING" if k == 0 else "SUSPENDED",
                                   placement=mk.on("s0", gpu), attained_service_s=600.0 * (k + 1),
                                   last_state_change_at=0.0, profile=_measured(1.0)))
        for name, gib in (("s1", 2.0), ("s2", 15.0)):
            jobs.append(mk.job(f"big-{name}", state="RUNNING", placement=mk.on(name, 0, 1, 2, 3),
                               attained_service_s=4 * 36000.0, last_state_change_at=0.0, profile=_measured(gib)))
        srv = (_server("s0", 4, 64.0), _server("s1", 4, 64.0), _server("s2", 4, s2_gib))
        return mk.snap(1000.0, srv, *jobs)

    cfg = dataclasses.replace(CFG, balance_sizes=True)
    full = get_policy("gandiva", cfg).decide(cluster(16.0))
    assert not any(isinstance(d, Migrate) and d.job_id == "big-s1" for d in full)
    roomy = get_policy("gandiva", cfg).decide(cluster(64.0))
    assert any(isinstance(d, Migrate) and d.job_id == "big-s1" for d in roomy)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("host_memory_use", 0.0, "host_memory_use must be in"),
    ("host_memory_use", 1.5, "host_memory_use must be in"),
    ("job_host_memory_bytes", -1, "job_host_memory_bytes must not be negative"),
])
def test_bad_host_memory_settings_are_refused(field: str, value: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PolicyConfig(**{field: value})  # type: ignore[arg-type]
