"""Two bounds on ``large_block_after_s``'s block, measured on issue 11 (docs/simulator.md,
"The block and the groups it waits on"): on Philly e13805 the block held 116 8-GPU newcomers
for 82 h behind one 2-GPU job, while every 8-GPU group still had jobs waiting their turns.

- ``large_block_one_group``: a held job larger than a server may still join a time-slice
  group of its count, but never the one closest to draining (fewest members);
- ``large_block_lapse``: the block holds only while some group of jobs larger than a server
  is down to one job.

The cluster: six 2-GPU servers. s0+s1 hold a 4-GPU group of one job (``a``), s2+s3 one of
two (``b`` running, ``b2`` suspended); s4 a 2-GPU group at the cap of 3; s5 two 1-GPU jobs.
Queued: ``old`` (2 GPUs, submitted at 0; its group is full and no server is free) and two
newcomers, a 4-GPU and a 1-GPU job.
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy

BLOCK = PolicyConfig(max_jobs_per_gpu=3, enable_packing=False, enable_grow_shrink=False, probe_slices=False)
ONE_GROUP = dataclasses.replace(BLOCK, large_block_one_group=True)
LAPSE = dataclasses.replace(BLOCK, large_block_lapse=True)


def _cluster(mk, now: float, a_members: int = 1):
    jobs = [mk.job("a", state="RUNNING", placement=mk.on("s0", 0, 1) + mk.on("s1", 0, 1)),
            mk.job("b", state="RUNNING", placement=mk.on("s2", 0, 1) + mk.on("s3", 0, 1)),
            mk.job("b2", state="SUSPENDED", placement=mk.on("s2", 0, 1) + mk.on("s3", 0, 1)),
            mk.job("c", state="RUNNING", placement=mk.on("s4", 0, 1)),
            mk.job("c2", state="SUSPENDED", placement=mk.on("s4", 0, 1)),
            mk.job("c3", state="SUSPENDED", placement=mk.on("s4", 0, 1)),
            mk.job("one", state="RUNNING", placement=mk.on("s5", 0)),
            mk.job("one2", state="RUNNING", placement=mk.on("s5", 1)),
            mk.job("old", gpus=2, submitted_at=0.0),
            mk.job("small_new", gpus=1, submitted_at=now - 5),
            mk.job("large_new", gpus=4, submitted_at=now - 5)]
    if a_members == 2:
        jobs.append(mk.job("a2", state="SUSPENDED", placement=mk.on("s0", 0, 1) + mk.on("s1", 0, 1)))
    return mk.snap(now, mk.servers(6, 2), *jobs)


def _placed(decisions: list) -> dict[str, set[str]]:
    return {d.job_id: {g.server for g in d.gpus} for d in decisions if type(d).__name__ == "Place"}


def _queued(decisions: list) -> dict[str, str]:
    return {d.job_id: d.reason for d in decisions if type(d).__name__ == "Queue"}


def test_a_held_large_job_joins_a_group_but_not_the_one_closest_to_draining(mk) -> None:
    snap = _cluster(mk, 7200.0)
    # The block alone: the 4-GPU newcomer queues behind old.
    d = get_policy("gandiva", BLOCK).decide(snap)
    assert "large_new" not in _placed(d) and "job old fits one server" in _queued(d)["large_new"]
    # With large_block_one_group it joins b's group (two members), never a's (one: draining).
    d = get_policy("gandiva", ONE_GROUP).decide(snap)
    assert _placed(d)["large_new"] == {"s2", "s3"}
    assert ("Suspend", "b") in mk.kinds(d) and ("Suspend", "a") not in mk.kinds(d)
    assert _placed(d)["small_new"] == {"s5"} and "old" in _queued(d)
    # Before the hour is up the block does not hold: it joins the smallest group, a's.
    assert _placed(get_policy("gandiva", ONE_GROUP).decide(_cluster(mk, 3000.0)))["large_new"] == {"s0", "s1"}


def test_with_one_group_of_its_count_a_held_large_job_still_queues(mk) -> None:
    """b's group is the only 4-GPU one (a's servers run 1-GPU jobs instead): it is left to drain."""
    snap = _cluster(mk, 7200.0)
    ones = tuple(mk.job(f"x{s}{i}", state="RUNNING", placement=mk.on(s, i)) for s in ("s0", "s1") for i in (0, 1))
    jobs = tuple(j for j in snap.jobs if j.id != "a") + ones
    d = get_policy("gandiva", ONE_GROUP).decide(dataclasses.replace(snap, jobs=jobs))
    assert "large_new" not in _placed(d)
    assert "closest to draining" in _queued(d)["large_new"]


@pytest.mark.parametrize(("a_members", "holds"), [(1, True), (2, False)])
def test_the_block_lapses_while_no_large_group_is_down_to_one_job(mk, a_members: int, holds: bool) -> None:
    d = get_policy("gandiva", LAPSE).decide(_cluster(mk, 7200.0, a_members))
    if holds:
        assert "large_new" not in _placed(d) and "job old fits one server" in _queued(d)["large_new"]
    else:  # a's and b's groups have two jobs each: the newcomer joins one
        assert _placed(d)["large_new"] in ({"s0", "s1"}, {"s2", "s3"})
    # Without the bound the block holds either way.
    assert "large_new" not in _placed(get_policy("gandiva", BLOCK).decide(_cluster(mk, 7200.0, a_members)))


def test_both_bounds_are_off_by_default() -> None:
    assert PolicyConfig().large_block_one_group is False and PolicyConfig().large_block_lapse is False


@pytest.mark.parametrize(("gpus", "reserved"), [(4, True), (2, False)])
def test_reserve_large_only_reserves_for_a_job_larger_than_a_server_alone(mk, gpus: int, reserved: bool) -> None:
    """``reserve_large_only``: the reservation of ``reserve_after_s`` is made for a job larger
    than a server (here 4 GPUs on 2-GPU servers), not for one that fits a server (the block
    serves those). Two GPUs are free, one per server; a 1-GPU newcomer takes one unless a
    reservation keeps them, when it time-shares a running 1-GPU job instead."""
    busy = [mk.job("r0", state="RUNNING", placement=mk.on("s0", 0)),
            mk.job("r1", state="RUNNING", placement=mk.on("s1", 0))]
    snap = mk.snap(5000, mk.servers(2, 2), *busy, mk.job("waiting", gpus=gpus, submitted_at=0),
                   mk.job("small", submitted_at=4000))
    base = dataclasses.replace(BLOCK, reserve_after_s=3600.0)
    for cfg, keeps in ((base, True), (dataclasses.replace(base, reserve_large_only=True), reserved)):
        d = get_policy("gandiva", cfg).decide(snap)
        assert "waiting" in _queued(d)
        small = next(x for x in d if x.job_id == "small" and type(x).__name__ == "Place")
        assert ("oversubscribe" in small.reason) is keeps
        assert (("Suspend", "r0") in mk.kinds(d) or ("Suspend", "r1") in mk.kinds(d)) is keeps


def test_each_bound_without_its_rule_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="reserve_large_only .* set reserve_after_s too"):
        PolicyConfig(reserve_large_only=True)
    for name in ("large_block_one_group", "large_block_lapse"):
        with pytest.raises(ValueError, match=f"{name} bounds large_block_after_s's block"):
            PolicyConfig(large_block_after_s=None, **{name: True})
    assert PolicyConfig().reserve_large_only is False
