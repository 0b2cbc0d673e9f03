"""``groupless_block`` (issue 11, held-out traces on 2x4, docs/heldout.md): a group of 8-GPU jobs
holds both servers of a 2x4 cluster, and every newly arriving 8-GPU job joins it, while a job of
another GPU count has no group to join, no free GPU and no first turn: it waits until the group
drains. With the rule, jobs larger than a server queued after it stop joining groups at once (not
after ``large_block_after_s``) while no time-slice group of its GPU count exists.

The cluster: s0 and s1 (4 GPUs each) hold one 8-GPU group of two members; a 1-GPU job has been
queued 100 s, then an 8-GPU job arrives. With ``ones`` a third server s2 holds full 1-GPU groups.
"""

from __future__ import annotations

import dataclasses

from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.types import ClusterSnapshot, Place, Queue

CFG = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False, probe_slices=False,
                   max_jobs_per_gpu=3, groupless_block=True)
BOTH = ("s0", "s1")


def _cluster(mk, ones: bool = False) -> ClusterSnapshot:
    eight = mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3)
    jobs = [mk.job("big0", state="RUNNING", placement=eight, attained_service_s=8 * 600.0, steps=100,
                   submitted_at=0.0, last_state_change_at=0.0),
            mk.job("big1", state="SUSPENDED", placement=eight, attained_service_s=8 * 300.0, steps=50,
                   submitted_at=10.0, last_state_change_at=0.0),
            mk.job("small", gpus=1, submitted_at=200.0),
            mk.job("big2", gpus=8, submitted_at=250.0)]
    if ones:
        for gpu in range(4):
            jobs += [mk.job(f"one{gpu}.{k}", state="RUNNING" if k == 0 else "SUSPENDED", placement=mk.on("s2", gpu),
                            attained_service_s=60.0 * (k + 1), steps=10, submitted_at=1.0, last_state_change_at=0.0)
                     for k in range(3)]
    return mk.snap(300.0, mk.servers(3 if ones else 2), *jobs)


def test_without_the_rule_a_new_8_gpu_job_joins_the_group_the_small_job_waits_for(mk) -> None:
    d = get_policy("gandiva", dataclasses.replace(CFG, groupless_block=False)).decide(_cluster(mk))
    placed = {x.job_id: x for x in d if isinstance(x, Place)}
    assert set(placed) == {"big2"} and "oversubscribe" in placed["big2"].reason
    assert {x.job_id for x in d if isinstance(x, Queue)} == {"small"}


def test_with_the_rule_it_waits_and_says_for_which_job(mk) -> None:
    """The 8-GPU job queues behind the 1-GPU job that has no group of its size, after 100 s
    (not an hour); the group it would have joined keeps its two members and drains."""
    d = get_policy("gandiva", CFG).decide(_cluster(mk))
    assert not [x for x in d if isinstance(x, Place)]
    why = {x.job_id: x.reason for x in d if isinstance(x, Queue)}
    assert set(why) == {"small", "big2"}
    assert "job small fits one server and no time-slice group of 1-GPU jobs exists" in why["big2"]


def test_a_count_that_has_a_group_blocks_nothing_before_the_hour(mk) -> None:
    """With full 1-GPU groups on s2 the 1-GPU job waits for room in its own groups, not for
    the 8-GPU group to drain: the 8-GPU job joins its group as without the rule."""
    d = get_policy("gandiva", CFG).decide(_cluster(mk, ones=True))
    placed = {x.job_id: x for x in d if isinstance(x, Place)}
    assert set(placed) == {"big2"} and {g.server for g in placed["big2"].gpus} == set(BOTH)
