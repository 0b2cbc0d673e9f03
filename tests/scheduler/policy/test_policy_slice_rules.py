"""Gandiva's rules against starvation (issue 11), as pure policy calls: service buckets
(``fifo_after_s``) and a starvation limit (``starve_factor``) inside a time-slice group, and
a limit on how long newcomers may overtake a queued job by joining groups
(``share_block_after_s``).

Most tests build one time-slice group on a one-GPU server and ask the policy at a slice's
end who runs next: what a user sees as "whose job gets the GPU now".
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy

LAS = PolicyConfig(las_slices=True, slice_growth=0.0, enable_migration=False, enable_packing=False,
                   enable_grow_shrink=False, probe_slices=False)
HOUR = 3600.0


def _group(mk, now: float, running: tuple[str, float, float], *waiting: tuple[str, float, float, float]):
    """A running job (id, attained s, submitted at), started at 0, and suspended ones
    (id, attained s, submitted at, suspended since), all on GPU s0/0."""
    rid, rserved, rsub = running
    jobs = [mk.job(rid, state="RUNNING", placement=mk.on("s0", 0), attained_service_s=rserved,
                   reported_at=now, submitted_at=rsub, last_state_change_at=0.0)]
    for wid, served, sub, since in waiting:
        jobs.append(mk.job(wid, state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=served,
                           submitted_at=sub, last_state_change_at=since))
    return mk.snap(now, mk.servers(1, 1), *jobs)


@pytest.mark.parametrize(("run_h", "old_h"), [(2.0, 5.0), (1.0, 30.0), (10.0, 11.0), (3.0, 3.0)])
def test_in_the_long_bucket_the_job_submitted_first_gets_the_gpu(mk, run_h: float, old_h: float) -> None:
    """Both jobs have run past fifo_after_s: the older submission runs, however much more it
    has run; plain least-attained-service would keep the one that has run less."""
    snap = _group(mk, 61.0, ("young", run_h * HOUR, 1000.0), ("old", old_h * HOUR, 0.0, 0.0))
    buckets = dataclasses.replace(LAS, fifo_after_s=HOUR)
    assert mk.kinds(get_policy("gandiva", buckets).decide(snap)) == [("Suspend", "young"), ("Resume", "old")]
    if run_h < old_h:
        assert get_policy("gandiva", LAS).decide(snap) == []


@pytest.mark.parametrize("old_h", [1.0, 5.0, 40.0])
def test_the_job_running_in_the_long_bucket_keeps_the_gpu_over_later_submissions(mk, old_h: float) -> None:
    snap = _group(mk, 61.0, ("old", old_h * HOUR, 0.0), ("young", 1.5 * HOUR, 500.0, 0.0),
                  ("younger", 1.1 * HOUR, 900.0, 0.0))
    policy = get_policy("gandiva", dataclasses.replace(LAS, fifo_after_s=HOUR))
    assert policy.decide(snap) == []
    # It is not looked at again every beat: only at its slice's end (nothing else can win).
    assert policy.next_wakeup() == 120.0


@pytest.mark.parametrize("short_s", [0.0, 600.0, 3599.0])
def test_a_job_in_the_short_bucket_still_goes_before_the_long_ones(mk, short_s: float) -> None:
    snap = _group(mk, 61.0, ("old", 20 * HOUR, 0.0), ("new", short_s, 5000.0, 0.0))
    d = get_policy("gandiva", dataclasses.replace(LAS, fifo_after_s=HOUR)).decide(snap)
    assert mk.kinds(d) == [("Suspend", "old"), ("Resume", "new")]


def test_a_short_job_hands_over_when_it_enters_the_long_bucket(mk) -> None:
    """The running job has 3,000 s of service, the waiting one is in the long bucket but was
    submitted first: the runner keeps the GPU until the first beat after it reaches 3,600 s
    (before its own grown slice would end), then the older job runs."""
    cfg = dataclasses.replace(LAS, fifo_after_s=HOUR, slice_growth=1.0)
    policy = get_policy("gandiva", cfg)
    assert policy.decide(_group(mk, 2000.0, ("new", 3000.0, 500.0), ("old", 5 * HOUR, 0.0, 0.0))) == []
    assert policy.next_wakeup() == 2640.0  # 3,600 s of service at 2,600 s; the next beat
    later = _group(mk, 2640.0, ("new", 3640.0, 500.0), ("old", 5 * HOUR, 0.0, 0.0))
    assert mk.kinds(policy.decide(later)) == [("Suspend", "new"), ("Resume", "old")]


@pytest.mark.parametrize(("served_h", "waited_h", "starved"),
                         [(1.0, 1.9, False), (1.0, 2.1, True), (5.0, 9.0, False), (5.0, 10.5, True),
                          (0.001, 0.01, False)])
def test_a_job_suspended_for_k_times_its_service_runs_next(mk, served_h: float, waited_h: float,
                                                           starved: bool) -> None:
    """starve_factor 2: a suspended job that waited twice its service (and at least a quantum)
    gets the next slice, although the running job has run less."""
    now = waited_h * HOUR
    snap = _group(mk, now, ("short", 60.0, now - 100), ("long", served_h * HOUR, 0.0, 0.0))
    d = get_policy("gandiva", dataclasses.replace(LAS, starve_factor=2.0)).decide(snap)
    assert mk.kinds(d) == ([("Suspend", "short"), ("Resume", "long")] if starved else [])
    # Without the limit least-attained-service keeps the long job waiting.
    assert get_policy("gandiva", LAS).decide(snap) == []


@pytest.mark.parametrize(("factor", "wake"), [(0.1, 10980.0), (0.0, 11940.0)])
def test_the_starving_job_is_woken_for_at_its_limit(mk, factor: float, wake: float) -> None:
    """A job suspended at 7,000 s with 11 h of service starves at 10,960 s under factor 0.1:
    the policy asks to be woken at the beat after it, before the runner's 32-minute slice
    ends (11,940 s, when it would look next without the limit), and then switches."""
    policy = get_policy("gandiva", dataclasses.replace(LAS, starve_factor=factor, slice_growth=0.1))
    assert policy.decide(_group(mk, 10000.0, ("run", 10 * HOUR, 0.0), ("long", 11 * HOUR, 0.0, 7000.0))) == []
    assert policy.next_wakeup() == wake
    d = policy.decide(_group(mk, wake, ("run", 10 * HOUR + wake - 10000.0, 0.0), ("long", 11 * HOUR, 0.0, 7000.0)))
    # Without the limit the runner, still the less served, keeps the GPU then too.
    assert mk.kinds(d) == ([("Suspend", "run"), ("Resume", "long")] if factor else [])


@pytest.mark.parametrize(("field", "value"), [("fifo_after_s", -1.0), ("starve_factor", -0.5),
                                            ("share_block_after_s", -1.0)])
def test_negative_rule_values_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must not be negative"):
        PolicyConfig(**{field: value})  # type: ignore[arg-type]


def _blocked_cluster(mk, now: float, old_gpus: int = 2, free_gpu: bool = False):
    """s0: a 2-GPU group at its cap of 2; s1: two 1-GPU jobs (s1/1 idle if ``free_gpu``, else
    three); queued: ``old`` (submitted at 0, no place: its group is full) and ``new``, a
    1-GPU job that arrived just now."""
    jobs = [mk.job("big", state="RUNNING", placement=mk.on("s0", 0, 1)),
            mk.job("big2", state="SUSPENDED", placement=mk.on("s0", 0, 1)),
            mk.job("one", state="RUNNING", placement=mk.on("s1", 0))]
    if not free_gpu:
        jobs.append(mk.job("two", state="RUNNING", placement=mk.on("s1", 1)))
    jobs += [mk.job("old", gpus=old_gpus, submitted_at=0.0), mk.job("new", submitted_at=now - 5)]
    return mk.snap(now, mk.servers(2, 2), *jobs)


CAP2 = dataclasses.replace(LAS, max_jobs_per_gpu=2)


@pytest.mark.parametrize(("waited", "blocked"), [(3000.0, False), (3700.0, True), (50000.0, True)])
def test_after_a_job_waited_the_limit_later_jobs_do_not_join_time_slice_groups(mk, waited: float,
                                                                               blocked: bool) -> None:
    """share_block_after_s 3600: the 1-GPU newcomer would time-share on s1, ahead of the 2-GPU
    job queued for longer; once that one has waited an hour the newcomer queues behind it
    (and says why), so s1's groups drain instead of filling up."""
    d = get_policy("gandiva", dataclasses.replace(CAP2, share_block_after_s=3600.0)).decide(
        _blocked_cluster(mk, waited))
    placed = [x.job_id for x in d if type(x).__name__ == "Place"]
    assert placed == ([] if blocked else ["new"])
    queued = {x.job_id: x.reason for x in d if type(x).__name__ == "Queue"}
    assert "old" in queued
    if blocked:
        assert "job old has waited" in queued["new"] and "do not join time-slice groups" in queued["new"]
    # Without the rule the newcomer always time-shares at once.
    assert [x.job_id for x in get_policy("gandiva", CAP2).decide(_blocked_cluster(mk, waited))
            if type(x).__name__ == "Place"] == ["new"]


def test_the_block_leaves_free_gpus_to_later_jobs_and_ignores_jobs_larger_than_a_server(mk) -> None:
    cfg = dataclasses.replace(CAP2, share_block_after_s=3600.0)
    # A free GPU is no time-slice group: the newcomer takes it (nothing is reserved).
    d = get_policy("gandiva", cfg).decide(_blocked_cluster(mk, 9000.0, free_gpu=True))
    assert [(type(x).__name__, x.job_id) for x in d if type(x).__name__ != "Queue"] == [("Place", "new")]
    # A queued job larger than every server cannot use what a group frees: it blocks nobody.
    d = get_policy("gandiva", cfg).decide(_blocked_cluster(mk, 9000.0, old_gpus=4))
    assert "new" in [x.job_id for x in d if type(x).__name__ == "Place"]
