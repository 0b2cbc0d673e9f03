"""A packing trial whose two jobs leave its GPUs without the policy moving them (their
server went down, an operator moved one) ends void with a reason that says so: rates the
jobs report apart are never taken for packed rates, and the pair is neither kept nor
rejected (found by the hosts engineer, s44: a pair sampled at 0.8x of time-slicing was
learned as "packed rate 2.00x of time-slicing: kept" after its server's loss)."""

from __future__ import annotations

import dataclasses

from scheduler.policy import get_policy
from scheduler.policy.types import Pack, Unpack

from .test_policy_introspective import PACK_ONLY, _packable, _packed


def _trial_sampled_bad(mk):
    """The policy with 'wait' packed beside 'run' on s0/0 at 10 (a 60-s trial), sampled
    in its second half at 45 at 0.4 + 0.4 of their rates alone (a bad pack)."""
    policy = get_policy("gandiva", PACK_ONLY)
    assert mk.kinds(policy.decide(_packable(mk))) == [("Pack", "wait")]
    assert policy.decide(_packed(mk, 4.0, now=45)) == []
    assert policy.state.trials["wait"].sample == (4.0, 4.0)
    return policy


def test_a_trial_whose_server_went_down_is_void_and_rates_apart_are_not_learned(mk) -> None:
    policy = _trial_sampled_bad(mk)
    # s0 goes down at 50: both jobs back in the queue, only s1 (2 GPUs) left.
    s1 = mk.servers(2, 2)[1:]
    queued = tuple(dataclasses.replace(j, state="QUEUED", placement=()) for j in _packed(mk, 4.0, now=50).jobs)
    d = policy.decide(mk.snap(50, s1, *queued))
    assert sorted(mk.kinds(d)) == [("Place", "run"), ("Place", "wait")]
    assert {x.gpus for x in d} == {mk.on("s1", 0), mk.on("s1", 1)}  # apart, each alone
    assert policy.state.trials == {}
    (verdict,) = policy.state.verdicts
    assert verdict.kept is None and verdict.gain is None and not verdict.unpacked
    assert verdict.reason == ("trial void: wait and run went back to the queue from s0 (a server went down, "
                              "or a re-queue) after 40.0s; the pair is not judged"), verdict.reason
    # Placed apart, each at its rate alone: before, these were sampled as packed rates and
    # the pair recorded at 75 as "packed rate 2.00x of time-slicing: kept".
    alone = tuple(dataclasses.replace(j, state="RUNNING", placement=x.gpus, rate=10.0)
                  for j, x in zip(queued, sorted(d, key=lambda x: x.job_id), strict=True))
    for now in (60, 75, 140):
        assert policy.decide(mk.snap(now, s1, *alone)) == []
    assert len(policy.state.verdicts) == 1 and policy.state.kept_pairs == {}
    assert policy.state.rejected == set()  # void: the pair may be tried again


def test_a_trial_whose_job_was_moved_off_its_gpus_is_void(mk) -> None:
    policy = _trial_sampled_bad(mk)
    s = _packed(mk, 10.0, now=50)
    moved = tuple(dataclasses.replace(j, placement=mk.on("s1", 0)) if j.id == "wait" else j for j in s.jobs)
    d = policy.decide(dataclasses.replace(s, servers=mk.servers(2, 1), jobs=moved))
    assert not any(isinstance(x, (Pack, Unpack)) for x in d), d
    (verdict,) = policy.state.verdicts
    assert verdict.kept is None and policy.state.trials == {} and policy.state.kept_pairs == {}
    assert verdict.reason.startswith("trial void: moved off the trial's GPUs on s0: wait to s1"), verdict.reason


def test_a_pair_moved_together_onto_other_gpus_is_unpacked_unjudged(mk) -> None:
    policy = _trial_sampled_bad(mk)
    s = _packed(mk, 10.0, now=50)
    both = tuple(dataclasses.replace(j, placement=mk.on("s1", 0)) for j in s.jobs)
    d = policy.decide(dataclasses.replace(s, servers=mk.servers(2, 1), jobs=both))
    assert mk.kinds(d) == [("Unpack", "wait")] and d[0].gpus == mk.on("s1", 0)
    assert "trial void: moved off the trial's GPUs on s0: wait to s1 and run to s1" in d[0].reason
    (verdict,) = policy.state.verdicts
    assert verdict.kept is None and verdict.unpacked and policy.state.kept_pairs == {}
