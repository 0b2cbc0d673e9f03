"""``probe_slices``: whom a finished first turn parks, and jobs that cannot be restarted from a checkpoint.

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


def _full_group(mk, now: float, new: dict, old_parked: bool = False) -> object:
    """A cap of 2 on one GPU: "old" (20 h of service; or parked: queued, on no GPU) and
    "mid" (10 min) suspended, and the newcomer "new" (``new``: its state and progress)."""
    gpu = mk.on("s0", 0)
    old: dict = {"state": "QUEUED"} if old_parked else {"state": "SUSPENDED", "placement": gpu}
    return mk.snap(
        now, mk.servers(1, 1),
        mk.job("old", attained_service_s=72_000.0, submitted_at=0.0, last_state_change_at=50.0, steps=300_000,
               rate=4.0, **old),
        mk.job("mid", state="SUSPENDED", placement=gpu, attained_service_s=600.0, submitted_at=40.0,
               last_state_change_at=100.0, steps=2_400, rate=4.0),
        mk.job("new", placement=gpu, submitted_at=99.0, **new),
    )


@pytest.mark.parametrize("park_last", [False, True])
def test_a_finished_first_turn_parks_the_member_ranked_last(mk, park_last: bool) -> None:
    """Without ``probe_park_last`` the newcomer leaves once its turn is over; with it, the
    member the group's order would run last (20 hours of service) goes to disk instead and
    the newcomer stays, so the cap's places go to the jobs that have run least."""
    cfg = PolicyConfig(max_jobs_per_gpu=2, probe_slices=True, probe_park_last=park_last, enable_migration=False,
                       enable_packing=False, enable_grow_shrink=False)
    policy = get_policy("gandiva", cfg)
    gpu = mk.on("s0", 0)
    # "mid" runs; the newcomer finds the group full (2) and gets a first turn.
    first = policy.decide(mk.snap(
        100.0, mk.servers(1, 1),
        mk.job("old", state="SUSPENDED", placement=gpu, attained_service_s=72_000.0, submitted_at=0.0,
               last_state_change_at=50.0, steps=300_000, rate=4.0),
        mk.job("mid", state="RUNNING", placement=gpu, attained_service_s=600.0, submitted_at=40.0,
               reported_at=100.0, last_state_change_at=90.0, steps=2_400, rate=4.0),
        mk.job("new", submitted_at=99.0),
    ))
    assert mk.kinds(first) == [("Suspend", "mid"), ("Place", "new")]
    now = 100.0 + cfg.quantum_s + 1.0
    later = policy.decide(_full_group(mk, now, {
        "state": "RUNNING", "attained_service_s": cfg.quantum_s + 1.0, "reported_at": now,
        "last_state_change_at": 100.0, "steps": 250, "rate": 4.0}))
    parks = [d for d in later if type(d).__name__ == "Park"]
    assert [d.job_id for d in parks] == (["old"] if park_last else ["new"])
    if park_last:
        assert "newcomer new ranks ahead of it" in parks[0].reason
        # The newcomer is an ordinary member now: no later call parks it.
        again = policy.decide(_full_group(mk, now + cfg.quantum_s, {
            "state": "RUNNING", "attained_service_s": 2 * cfg.quantum_s, "reported_at": now + cfg.quantum_s,
            "last_state_change_at": 100.0, "steps": 500, "rate": 4.0}, old_parked=True))
        assert "Park" not in {type(d).__name__ for d in again}


@pytest.mark.parametrize(("now", "share_block", "placed"), [
    (100.0, None, {"small", "small2", "large"}),  # no block yet: every newcomer gets a first turn
    (4000.0, None, {"small", "small2"}),  # the large block holds: no large job joins a group
    (1000.0, 600.0, {"small"}),  # the share block holds: only the job it waits for joins one
])
def test_first_turns_respect_the_blocks_for_the_longest_waiting_job(mk, now: float, share_block: float | None,
                                                                     placed: set[str]) -> None:
    """Every group is full (a cap of 1): an 8-GPU group over s0 and s1, a 1-GPU job on each
    GPU of s2. Queued, never run: "small" (1 GPU, the first that fits a server, submitted at
    0), "small2" and "large" (8 GPUs). Once "small" has waited ``large_block_after_s`` (an
    hour), a first turn for "large" would keep the 8-GPU group from draining for it, so it
    gets none; once it has waited ``share_block_after_s``, no job behind it gets one."""
    cfg = PolicyConfig(max_jobs_per_gpu=1, probe_slices=True, share_block_after_s=share_block,
                       enable_migration=False, enable_packing=False, enable_grow_shrink=False)
    big = mk.job("big", state="RUNNING", placement=mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3),
                 attained_service_s=8 * now, submitted_at=0.0, reported_at=now, last_state_change_at=0.0,
                 steps=10_000, rate=4.0)
    ones = [mk.job(f"one{i}", state="RUNNING", placement=mk.on("s2", i), attained_service_s=now,
                   submitted_at=0.0, reported_at=now, last_state_change_at=0.0, steps=10_000, rate=4.0)
            for i in range(4)]
    queued = [mk.job("small", submitted_at=0.0), mk.job("small2", submitted_at=5.0),
              mk.job("large", 8, submitted_at=10.0)]
    d = get_policy("gandiva", cfg).decide(mk.snap(now, mk.servers(3), big, *ones, *queued))
    got = {x.job_id for x in d if type(x).__name__ == "Place"}
    assert got == placed
    assert all("probe slice" in x.reason for x in d if type(x).__name__ == "Place")
