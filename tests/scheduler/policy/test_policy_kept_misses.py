"""Gandiva remembers across calls that a GPU count found no place (so a long queue costs
nothing while the cluster stands still), and forgets it as soon as something a placement
filter reads changes, though no job was bound or unbound: an incumbent that becomes
controllable, or finishes migrating, lets a waiting newcomer time-slice with it at once."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import ClusterSnapshot, PolicyConfig, get_policy
from scheduler.policy.types import SnapshotDelta

NO_MOVES = PolicyConfig(enable_migration=False, enable_packing=False, enable_grow_shrink=False)


def blocked(mk, why: str):  # type: ignore[no-untyped-def]
    """The only GPU's job, which a newcomer may not time-slice with (yet)."""
    if why == "uncontrollable":
        return mk.job("old", state="RUNNING", placement=mk.on("s0", 0), suspendable=False)
    return mk.job("old", state="MIGRATING", placement=mk.on("s0", 0))


@pytest.mark.parametrize("hint", [True, False], ids=["with-delta", "full-compare"])
@pytest.mark.parametrize("why", ["uncontrollable", "migrating"])
def test_a_newcomer_that_found_no_place_is_placed_once_the_incumbent_can_take_turns(mk, why: str,
                                                                                     hint: bool) -> None:
    srv = mk.servers(1, 1)
    old, new = blocked(mk, why), mk.job("new", submitted_at=5.0)
    policy = get_policy("gandiva", NO_MOVES)
    first = ClusterSnapshot(10.0, srv, (old, new), seq=1)
    assert [k for k in mk.kinds(policy.decide(first)) if k[0] != "Queue"] == []
    # Nothing changed: it still finds no place (the remembered answer).
    again = ClusterSnapshot(20.0, srv, (old, new), seq=2, delta=SnapshotDelta(1) if hint else None)
    assert [k for k in mk.kinds(policy.decide(again)) if k[0] != "Queue"] == []
    # The incumbent can now be suspended at a mini-batch boundary: same GPUs, no bind.
    ready = dataclasses.replace(old, state="RUNNING", suspendable=True, last_state_change_at=30.0)
    now = ClusterSnapshot(30.0, srv, (ready, new), seq=3,
                          delta=SnapshotDelta(2, changed=(ready,)) if hint else None)
    assert mk.kinds(policy.decide(now)) == [("Suspend", "old"), ("Place", "new")]

