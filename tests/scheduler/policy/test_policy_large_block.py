"""``large_block_after_s`` (issue 11, ITP cluster07): jobs larger than a server always found a
time-slice group of their size with room, so the servers those groups held never freed up
while jobs that fit one server queued behind full groups. Once such a job has waited S,
jobs larger than a server queued after it queue instead of joining groups, while smaller
newcomers still time-share at once; the large groups drain and the servers they free go to the waiting job.

The cluster: four 2-GPU servers. s0+s1 hold one 4-GPU job (a group with room under the cap
of 2); s2 a 2-GPU group at the cap; s3 two 1-GPU jobs, each group with room. Queued: ``old``
(2 GPUs, submitted at 0: its group is full and no server is free) and two newcomers, a 4-GPU
and a 1-GPU job.
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy

CAP2 = PolicyConfig(max_jobs_per_gpu=2, enable_packing=False, enable_grow_shrink=False,
                    large_block_after_s=None, probe_slices=False)  # no first turns: who waits is the subject
RULE = dataclasses.replace(CAP2, large_block_after_s=3600.0)


def _cluster(mk, now: float, big_done: bool = False, large_new_at: str | None = None):
    """The cluster above at ``now``. ``big_done``: the 4-GPU incumbent has finished;
    ``large_new_at``: the 4-GPU newcomer is no longer queued but runs on s0+s1."""
    jobs = [mk.job("c", state="RUNNING", placement=mk.on("s2", 0, 1)),
            mk.job("c2", state="SUSPENDED", placement=mk.on("s2", 0, 1)),
            mk.job("one", state="RUNNING", placement=mk.on("s3", 0)),
            mk.job("one2", state="RUNNING", placement=mk.on("s3", 1)),
            mk.job("old", gpus=2, submitted_at=0.0),
            mk.job("small_new", gpus=1, submitted_at=now - 5)]
    if not big_done:
        jobs.append(mk.job("big", state="RUNNING", placement=mk.on("s0", 0, 1) + mk.on("s1", 0, 1)))
    if large_new_at:
        jobs.append(mk.job("large_new", state=large_new_at, placement=mk.on("s0", 0, 1) + mk.on("s1", 0, 1),
                           submitted_at=now - 5))
    else:
        jobs.append(mk.job("large_new", gpus=4, submitted_at=now - 5))
    return mk.snap(now, mk.servers(4, 2), *jobs)


def _placed(decisions: list) -> dict[str, set[str]]:
    return {d.job_id: {g.server for g in d.gpus} for d in decisions if type(d).__name__ == "Place"}


@pytest.mark.parametrize(("waited", "blocked"), [(0.0, False), (3000.0, False), (3600.0, True), (50000.0, True)])
def test_large_jobs_stop_joining_groups_once_a_job_that_fits_a_server_waited(mk, waited: float,
                                                                             blocked: bool) -> None:
    d = get_policy("gandiva", RULE).decide(_cluster(mk, waited))
    placed = _placed(d)
    # The small newcomer time-shares at once either way (early feedback kept).
    assert placed["small_new"] == {"s3"}
    queued = {x.job_id: x.reason for x in d if type(x).__name__ == "Queue"}
    assert "old" in queued
    if blocked:
        assert "large_new" not in placed
        reason = queued["large_new"]
        assert "job old fits one server" in reason and "larger than a server (2 GPUs) queued after it" in reason
    else:
        assert placed["large_new"] == {"s0", "s1"}  # it joins big's group, suspending big
        assert ("Suspend", "big") in mk.kinds(d)
    # Without the rule the large newcomer always joins the group.
    assert _placed(get_policy("gandiva", CAP2).decide(_cluster(mk, waited)))["large_new"] == {"s0", "s1"}


@pytest.mark.parametrize("waited", [3600.0, 20000.0])
def test_the_server_a_drained_large_group_frees_goes_to_the_waiting_job(mk, waited: float) -> None:
    """When the large group's last job ends, the waiting 2-GPU job takes one of its servers in
    the same call (placement runs before migration, so no suspended job takes it first); the
    blocked large job still waits for room. Without the rule the large newcomer had joined the
    group, which then never empties, and the old job keeps waiting."""
    policy = get_policy("gandiva", RULE)
    policy.decide(_cluster(mk, waited))
    d = policy.decide(_cluster(mk, waited + 600, big_done=True))
    placed = _placed(d)
    assert placed.get("old") in ({"s0"}, {"s1"})
    assert "large_new" not in placed
    plain = get_policy("gandiva", CAP2)
    plain.decide(_cluster(mk, waited))
    d = plain.decide(_cluster(mk, waited + 600, big_done=True, large_new_at="RUNNING"))
    assert "old" not in _placed(d)


def test_a_large_job_queued_before_the_waiting_job_still_joins_a_group(mk) -> None:
    """The block keeps later large jobs from overtaking the waiting job; one that has waited
    longer (queued first) is not held back for it."""
    snap = _cluster(mk, 9000.0)
    jobs = tuple(dataclasses.replace(j, submitted_at=-100.0) if j.id == "large_new" else j for j in snap.jobs)
    assert _placed(get_policy("gandiva", RULE).decide(dataclasses.replace(snap, jobs=jobs)))["large_new"] == {"s0", "s1"}


def test_a_job_larger_than_every_server_blocks_nobody(mk) -> None:
    """Only a queued job that fits one server can use a server a group frees."""
    snap = _cluster(mk, 9000.0)
    jobs = tuple(dataclasses.replace(j, gpus=6) if j.id == "old" else j for j in snap.jobs)
    d = get_policy("gandiva", RULE).decide(dataclasses.replace(snap, jobs=jobs))
    assert _placed(d)["large_new"] == {"s0", "s1"}


def test_the_rule_is_on_by_default_with_an_hour() -> None:
    assert PolicyConfig().large_block_after_s == 3600.0


def test_a_negative_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="large_block_after_s must not be negative"):
        PolicyConfig(large_block_after_s=-1.0)
