"""``eldest_runs`` (issue 11, the makespan misses: Philly e13805, 6c71a0, ITP cluster05): under
least attained service the oldest of the longest jobs yields its GPUs to every newer job of
its size, and the trace's end waits for it. With the rule, the job submitted first of those
of its GPU count that hold GPUs runs ahead of its group and keeps its GPUs to itself until
it ends: the other members are parked (back in the queue, placed again elsewhere), and
neither placement nor first turns put a job onto its GPUs.

The cluster: one server of 2 GPUs. ``old`` (submitted at 0, 20 h of service) shares GPU 0
with ``mid`` (submitted at 100 s, less service, running now); ``young`` (submitted later,
suspended) shares it too; GPU 1 holds a group of three as large (``other0-2``). A newcomer
``new`` is queued: Algorithm 1 would put it into GPU 0's group (the same size, the lower index).
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy

BASE = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False)
RULE = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False, eldest_runs=True)
HOUR = 3600.0


def _gpu0(mk, now: float) -> tuple:
    """old, mid and young sharing GPU 0 of s0."""
    return (
        mk.job("old", state="SUSPENDED", placement=mk.on("s0", 0), submitted_at=0.0,
               attained_service_s=20 * HOUR, last_state_change_at=now - 600),
        mk.job("mid", state="RUNNING", placement=mk.on("s0", 0), submitted_at=100.0,
               attained_service_s=HOUR, last_state_change_at=now - 600),
        mk.job("young", state="SUSPENDED", placement=mk.on("s0", 0), submitted_at=200.0,
               attained_service_s=2 * HOUR, last_state_change_at=now - 600),
    )


def _cluster(mk, now: float):
    return mk.snap(
        now, mk.servers(1, 2), *_gpu0(mk, now),
        *(mk.job(f"other{i}", state="SUSPENDED" if i else "RUNNING", placement=mk.on("s0", 1),
                 submitted_at=300.0 + i, attained_service_s=HOUR, last_state_change_at=now - 600)
          for i in range(3)),
        mk.job("new", submitted_at=now - 5),
    )


def test_the_eldest_takes_its_gpu_back_and_keeps_it_to_itself(mk) -> None:
    now = 30 * HOUR
    d = get_policy("gandiva", RULE).decide(_cluster(mk, now))
    kinds = mk.kinds(d)
    # The slice ends: old (20 h of service) runs ahead of mid (1 h), least served or not.
    assert ("Suspend", "mid") in kinds and ("Resume", "old") in kinds
    # The newcomer time-shares at once, but not on old's GPU (it would without the rule).
    place = next(x for x in d if type(x).__name__ == "Place" and x.job_id == "new")
    assert {(g.server, g.index) for g in place.gpus} == {("s0", 1)}
    # young waits on old's GPU no longer: parked, back in the queue; mid (suspended in this
    # very call) goes at the next call.
    parks = {x.job_id: x.reason for x in d if type(x).__name__ == "Park"}
    assert set(parks) == {"young"}
    assert "job old, the eldest 1-GPU job, keeps these GPUs to itself" in parks["young"]
    d2 = get_policy("gandiva", RULE)
    d2.decide(_cluster(mk, now))
    later = d2.decide(mk.after(_cluster(mk, now), d, now + 60))
    assert ("Park", "mid") in mk.kinds(later)
    assert not any(x.job_id == "old" for x in later)  # it keeps running


def test_without_the_rule_the_least_served_job_keeps_the_gpu(mk) -> None:
    d = get_policy("gandiva", BASE).decide(_cluster(mk, 30 * HOUR))
    kinds = mk.kinds(d)
    assert ("Resume", "old") not in kinds and not any(k == "Park" for k, _ in kinds)
    place = next(x for x in d if type(x).__name__ == "Place" and x.job_id == "new")
    assert {(g.server, g.index) for g in place.gpus} == {("s0", 0)}


def test_the_rule_needs_las_slices() -> None:
    with pytest.raises(ValueError, match="eldest_runs changes the order las_slices sets"):
        PolicyConfig(las_slices=False, eldest_runs=True)


KEEP = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False, eldest_runs=True,
                    eldest_parks=False)


def test_without_parks_the_eldest_still_runs_and_its_group_waits_on_its_gpu(mk) -> None:
    """``eldest_parks`` False: old runs and keeps GPU 0 as with parks, no job comes onto it,
    but mid and young stay in its group, suspended, at this call and the next."""
    now = 30 * HOUR
    policy = get_policy("gandiva", KEEP)
    snap = _cluster(mk, now)
    d = policy.decide(snap)
    kinds = mk.kinds(d)
    assert ("Suspend", "mid") in kinds and ("Resume", "old") in kinds
    place = next(x for x in d if type(x).__name__ == "Place" and x.job_id == "new")
    assert {(g.server, g.index) for g in place.gpus} == {("s0", 1)}
    assert not any(k == "Park" for k, _ in kinds)
    later_snap = mk.after(snap, d, now + 60)
    later = policy.decide(later_snap)
    assert not any(k == "Park" for k, _ in mk.kinds(later))
    assert not any(x.job_id == "old" for x in later)  # it keeps running
    states = {j.id: (j.state, {(g.server, g.index) for g in j.placement}) for j in later_snap.jobs}
    assert states["mid"] == states["young"] == ("SUSPENDED", {("s0", 0)})


def test_eldest_parks_off_needs_eldest_runs() -> None:
    with pytest.raises(ValueError, match="eldest_parks false changes what eldest_runs does"):
        PolicyConfig(eldest_parks=False)


SECOND = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False, eldest_runs=True,
                      eldest_second_group=True)


def _one_gpu(mk, now: float):
    """_cluster's GPU 0 alone: old, mid and young share the cluster's only 1-GPU group."""
    return mk.snap(now, mk.servers(1, 1), *_gpu0(mk, now), mk.job("new", submitted_at=now - 5))


def test_second_group_the_only_group_of_its_size_keeps_taking_turns(mk) -> None:
    """Where the eldest's group is the only one of its GPU count (a job as large as a small
    cluster: Philly 23dbec's 8-GPU jobs on 2x4), ``eldest_runs`` alone makes the count first
    come first served: old takes the GPU and the newcomer waits for it to end (20 h and
    more). With ``eldest_second_group`` the group keeps its turns and the newcomer joins it."""
    now = 30 * HOUR
    alone = mk.kinds(get_policy("gandiva", RULE).decide(_one_gpu(mk, now)))
    assert ("Resume", "old") in alone and ("Place", "new") not in alone
    d = get_policy("gandiva", SECOND).decide(_one_gpu(mk, now))
    kinds = mk.kinds(d)
    assert ("Resume", "old") not in kinds and not any(k == "Park" for k, _ in kinds)
    place = next(x for x in d if type(x).__name__ == "Place" and x.job_id == "new")
    assert {(g.server, g.index) for g in place.gpus} == {("s0", 0)}


def test_second_group_beside_another_group_the_eldest_still_keeps_its_gpu(mk) -> None:
    """With a second 1-GPU group (GPU 1), ``eldest_second_group`` decides as ``eldest_runs``."""
    now = 30 * HOUR
    d = get_policy("gandiva", SECOND).decide(_cluster(mk, now))
    assert mk.kinds(d) == mk.kinds(get_policy("gandiva", RULE).decide(_cluster(mk, now)))
    assert ("Resume", "old") in mk.kinds(d) and ("Park", "young") in mk.kinds(d)


def test_second_group_needs_eldest_runs() -> None:
    with pytest.raises(ValueError, match="eldest_second_group bounds what eldest_runs does"):
        PolicyConfig(eldest_second_group=True)


FIRST = PolicyConfig(enable_packing=False, enable_grow_shrink=False, enable_migration=False, eldest_runs=True,
                     eldest_first_turns=True)


def test_first_turns_a_newcomer_with_no_other_place_gets_its_first_turn_then_the_eldest_runs(mk) -> None:
    """``eldest_first_turns``: on the one GPU the eldest holds, a never-run newcomer that would
    wait for old to end (``eldest_runs`` alone) takes its first turn there; once its slice is
    over the eldest has the GPU back (and the newcomer is parked at the next call)."""
    now = 30 * HOUR
    alone = mk.kinds(get_policy("gandiva", RULE).decide(_one_gpu(mk, now)))
    assert ("Place", "new") not in alone
    policy = get_policy("gandiva", FIRST)
    snap = _one_gpu(mk, now)
    d = policy.decide(snap)
    place = next(x for x in d if type(x).__name__ == "Place" and x.job_id == "new")
    assert {(g.server, g.index) for g in place.gpus} == {("s0", 0)}
    assert ("Suspend", "mid") in mk.kinds(d)
    placed = mk.after(snap, d, now)
    served = tuple(dataclasses.replace(j, attained_service_s=180.0, steps=300, reported_at=now + 180)
                   if j.id == "new" else j for j in placed.jobs)
    later = policy.decide(dataclasses.replace(placed, now=now + 180, jobs=served))
    assert ("Suspend", "new") in mk.kinds(later) and ("Resume", "old") in mk.kinds(later)


def test_first_turns_needs_eldest_runs_and_probe_slices() -> None:
    with pytest.raises(ValueError, match="eldest_first_turns gives first turns"):
        PolicyConfig(eldest_first_turns=True)
    with pytest.raises(ValueError, match="eldest_first_turns gives first turns"):
        PolicyConfig(eldest_runs=True, eldest_first_turns=True, probe_slices=False)
