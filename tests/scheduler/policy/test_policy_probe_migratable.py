"""``probe_slices`` and jobs that cannot be restarted from a checkpoint.

A newcomer let into a full time-slice group for its first turn is parked once the turn is
over: checkpointed, its process ended, queued again to resume from the checkpoint. A
TensorFlow program whose input position is in no checkpoint (a ``tf.data`` iterator, an
input queue) is reported not migratable by its runtime during that turn; parking it would
make it train on other data after its restart (live, the runtime refuses the park). Such a
job stays in the group as an ordinary member, suspended and resumed in place like the rest.
"""

from __future__ import annotations

import pytest

from scheduler.policy import PolicyConfig, get_policy

CFG = PolicyConfig(max_jobs_per_gpu=1, probe_slices=True, enable_migration=False, enable_packing=False,
                   enable_grow_shrink=False)


@pytest.mark.parametrize(("migratable", "suspendable"), [(True, True), (False, True), (True, False)])
def test_a_probe_found_not_migratable_is_not_parked(mk, migratable: bool, suspendable: bool) -> None:
    """``suspendable`` False: none of the job's processes is under the runtime (a wrapper
    that hides python, say), so it cannot be checkpointed either."""
    policy = get_policy("gandiva", CFG)
    gpu = mk.on("s0", 0)
    first = policy.decide(mk.snap(
        100.0, mk.servers(1, 1),
        mk.job("old", state="RUNNING", placement=gpu, attained_service_s=5000.0, submitted_at=0.0,
               reported_at=100.0, last_state_change_at=0.0, steps=20_000, rate=4.0),
        mk.job("new", submitted_at=99.0),
    ))
    # The group is full (a cap of 1), so the newcomer gets a probe turn: the incumbent yields.
    assert mk.kinds(first) == [("Suspend", "old"), ("Place", "new")]
    assert "probe slice" in first[1].reason
    # A quantum later the newcomer has its first 100 mini-batches: its turn is over.
    now = 100.0 + CFG.quantum_s + 1.0
    later = policy.decide(mk.snap(
        now, mk.servers(1, 1),
        mk.job("old", state="SUSPENDED", placement=gpu, attained_service_s=5000.0, submitted_at=0.0,
               last_state_change_at=100.0, steps=20_000, rate=4.0),
        mk.job("new", state="RUNNING", placement=gpu, attained_service_s=CFG.quantum_s + 1.0, submitted_at=99.0,
               reported_at=now, last_state_change_at=100.0, steps=250, rate=4.0, migratable=migratable,
               suspendable=suspendable),
    ))
    parks = [j for kind, j in mk.kinds(later) if kind == "Park"]
    if migratable and suspendable:
        assert parks == ["new"]
        assert ("Resume", "old") in mk.kinds(later)
    else:
        # Kept as a member: no park now, nor at any later call for this turn.
        assert parks == []
        again = policy.decide(mk.snap(
            now + 1.0, mk.servers(1, 1),
            mk.job("old", state="SUSPENDED", placement=gpu, attained_service_s=5000.0, submitted_at=0.0,
                   last_state_change_at=100.0, steps=20_000, rate=4.0),
            mk.job("new", state="RUNNING", placement=gpu, attained_service_s=CFG.quantum_s + 2.0,
                   submitted_at=99.0, reported_at=now + 1.0, last_state_change_at=100.0, steps=254, rate=4.0,
                   migratable=migratable, suspendable=suspendable),
        ))
        assert "Park" not in {kind for kind, _ in mk.kinds(again)}
