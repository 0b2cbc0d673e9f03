"""Reactive placement follows Algorithm 1: affinity, unallocated, relaxed, oversubscribe, queue."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.policy import (
    GpuRef,
    Place,
    PolicyConfig,
    Queue,
    cluster_height,
    get_policy,
    server_affinity,
    server_height,
)
from scheduler.policy.cluster import Ledger
from scheduler.policy.types import ServerView


def _placed(decisions: list, jid: str) -> tuple[GpuRef, ...]:
    return next(d.gpus for d in decisions if isinstance(d, Place) and d.job_id == jid)


def test_heights_and_affinity_follow_the_paper_definitions(mk) -> None:
    s = mk.snap(0, mk.servers(2),
             mk.job("a", state="RUNNING", placement=mk.on("s0", 0)),
             mk.job("b", state="SUSPENDED", placement=mk.on("s0", 0)),
             mk.job("c", state="RUNNING", placement=mk.on("s0", 1, 2)),
             mk.job("d", state="RUNNING", placement=mk.on("s0", 3)))
    assert server_height(s, "s0") == 2  # 5 allocations on 4 GPUs
    assert server_height(s, "s1") == 0
    assert cluster_height(s) == 2
    assert server_affinity(s, "s0") == 1  # three 1-GPU jobs, one 2-GPU job
    assert server_affinity(s, "s1") is None


def test_new_job_goes_to_a_server_of_its_own_size_before_an_empty_one(mk) -> None:
    s = mk.snap(0, mk.servers(2), mk.job("a", state="RUNNING", placement=mk.on("s0", 0)), mk.job("new"))
    d = get_policy("gandiva").decide(s)
    assert _placed(d, "new")[0].server == "s0"
    assert "affinity" in next(x for x in d if isinstance(x, Place)).reason


def test_job_of_another_size_takes_an_empty_server_before_mixing(mk) -> None:
    s = mk.snap(0, mk.servers(2), mk.job("a", state="RUNNING", placement=mk.on("s0", 0)), mk.job("new", gpus=2))
    assert {g.server for g in _placed(get_policy("gandiva").decide(s), "new")} == {"s1"}


def test_without_same_affinity_or_empty_servers_any_free_gpus_are_used(mk) -> None:
    s = mk.snap(0, mk.servers(2), mk.job("a", state="RUNNING", placement=mk.on("s0", 0)),
             mk.job("b", state="RUNNING", placement=mk.on("s1", 0)), mk.job("new", gpus=2))
    d = get_policy("gandiva").decide(s)
    assert len(_placed(d, "new")) == 2
    assert "relaxed" in next(x for x in d if isinstance(x, Place)).reason


def test_full_cluster_time_shares_a_same_size_job_and_suspends_the_incumbent(mk) -> None:
    full = [mk.job(f"r{i}", state="RUNNING", placement=mk.on("s0", i)) for i in range(4)]
    d = get_policy("gandiva").decide(mk.snap(100, mk.servers(1), *full, mk.job("new", submitted_at=50)))
    assert mk.kinds(d) == [("Suspend", "r0"), ("Place", "new")]
    assert _placed(d, "new") == mk.on("s0", 0)


def test_full_cluster_without_a_group_of_the_same_size_queues_with_a_reason(mk) -> None:
    full = [mk.job(f"r{i}", state="RUNNING", placement=mk.on("s0", i)) for i in range(4)]
    d = get_policy("gandiva").decide(mk.snap(0, mk.servers(1), *full, mk.job("big", gpus=2)))
    (q,) = d
    assert isinstance(q, Queue) and "needs 2 GPUs, 0 free" in q.reason


def test_time_sharing_stops_at_max_jobs_per_gpu(mk) -> None:
    cfg = PolicyConfig(max_jobs_per_gpu=2, probe_slices=False)
    jobs = [mk.job("r", state="RUNNING", placement=mk.on("s0", 0)),
            mk.job("w", state="SUSPENDED", placement=mk.on("s0", 0)), mk.job("new")]
    d = get_policy("gandiva", cfg).decide(mk.snap(0, mk.servers(1, gpus=1), *jobs))
    assert mk.kinds(d) == [("Queue", "new")]


def test_higher_priority_queued_job_is_placed_first(mk) -> None:
    s = mk.snap(0, mk.servers(1, gpus=1), mk.job("early", submitted_at=0),
             mk.job("urgent", submitted_at=10, priority=5))
    d = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=1, probe_slices=False)).decide(s)
    assert mk.kinds(d) == [("Place", "urgent"), ("Queue", "early")]


def test_two_queued_jobs_never_get_the_same_free_gpu(mk) -> None:
    s = mk.snap(0, mk.servers(1), *[mk.job(f"j{i}") for i in range(4)])
    d = get_policy("gandiva").decide(s)
    gpus = [g for x in d if isinstance(x, Place) for g in x.gpus]
    assert len(gpus) == 4 and len(set(gpus)) == 4


def test_unknown_policy_names_the_valid_ones(mk) -> None:
    with pytest.raises(ValueError, match="gandiva, fifo, yarn-cs, tiresias"):
        get_policy("slurm")


def test_bad_config_is_refused_with_the_field_name(mk) -> None:
    with pytest.raises(ValueError, match="quantum_s"):
        PolicyConfig(quantum_s=0)


def test_reservation_keeps_free_gpus_for_a_job_that_waited_too_long(mk) -> None:
    busy = [mk.job(f"r{i}", state="RUNNING", placement=mk.on("s0", i)) for i in range(3)]
    big = mk.job("big", gpus=4, submitted_at=0)
    small = mk.job("small", submitted_at=4000)
    s = mk.snap(5000, mk.servers(1), *busy, big, small)
    assert mk.kinds(get_policy("gandiva").decide(s)) == [("Queue", "big"), ("Place", "small")]
    d = get_policy("gandiva", PolicyConfig(reserve_after_s=3600)).decide(s)
    # The small job time-shares GPU 0 instead of taking the free GPU 3.
    assert mk.kinds(d) == [("Queue", "big"), ("Suspend", "r0"), ("Place", "small")]
    assert d[2].gpus == mk.on("s0", 0) and "oversubscribe" in d[2].reason


def test_a_job_that_fits_one_server_is_never_spread_and_says_why(mk) -> None:
    busy = [mk.job(f"b{i}{k}", state="RUNNING", placement=mk.on(f"s{i}", k)) for i in range(2) for k in range(3)]
    d = get_policy("gandiva").decide(mk.snap(0, mk.servers(2), *busy, mk.job("pair", gpus=2)))
    # Two GPUs are free, one on each server: spreading would slow the job, so it waits.
    (q,) = [x for x in d if x.job_id == "pair"]
    assert isinstance(q, Queue)
    assert "2 free but no server has 2 free" in q.reason


def test_a_job_larger_than_a_server_spreads_over_the_fewest_servers(mk) -> None:
    busy = [mk.job("a", state="RUNNING", placement=mk.on("s0", 0)),
            mk.job("b", state="RUNNING", placement=mk.on("s1", 0)),
            mk.job("c", gpus=2, state="RUNNING", placement=mk.on("s2", 0, 1))]
    d = get_policy("gandiva").decide(mk.snap(0, mk.servers(3), *busy, mk.job("big", gpus=8)))
    gpus = _placed(d, "big")
    assert len(gpus) == 8 and len(set(gpus)) == 8
    assert "relaxed" in next(x for x in d if isinstance(x, Place)).reason


def test_yarn_cs_still_spreads_a_small_job_like_a_locality_unaware_allocator(mk) -> None:
    busy = [mk.job(f"b{i}{k}", state="RUNNING", placement=mk.on(f"s{i}", k)) for i in range(2) for k in range(3)]
    d = get_policy("yarn-cs").decide(mk.snap(0, mk.servers(2), *busy, mk.job("pair", gpus=2)))
    assert {g.server for g in _placed(d, "pair")} == {"s0", "s1"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), data=st.data())
def test_the_ledgers_servers_by_free_gpus_stay_those_a_full_count_gives(mk, sizes, data) -> None:
    """Best fit and the most free GPUs on one server are read from an index the ledger keeps
    as jobs are bound and unbound and servers held and released; after any such sequence
    it answers what counting every server's free GPUs answers."""
    srv = tuple(ServerView(f"s{i}", n) for i, n in enumerate(sizes))
    jobs = [mk.job(f"j{i}") for i in range(12)]
    ledger = Ledger.of(mk.snap(0, srv, *jobs))
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["bind", "bind", "unbind", "hold", "release"]))
        if op == "bind":
            s = data.draw(st.sampled_from(srv))
            idx = data.draw(st.lists(st.integers(0, s.num_gpus - 1), min_size=1, unique=True))
            ledger.bind(data.draw(st.sampled_from(jobs)).id, mk.on(s.name, *sorted(idx)), "RUNNING")
        elif op == "unbind":
            ledger.unbind(data.draw(st.sampled_from(jobs)).id)
        elif op == "hold":
            ledger.hold([data.draw(st.sampled_from(srv)).name], 16)
        else:
            ledger.release()
        for k in range(max(sizes) + 2):
            counted = sorted((n for n in ledger.servers if ledger.num_free(n) >= k),
                             key=lambda n: (ledger.num_free(n), n))
            assert list(ledger.servers_with_free(k)) == counted
        assert ledger.max_free() == max(ledger.num_free(n) for n in ledger.servers)
