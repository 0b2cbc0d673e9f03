"""lower_spread: a suspended job larger than a server takes free GPUs scattered over
partly used servers, as placement would give it when queued (docs/simulator.md, "Idle GPUs
while jobs wait")."""

from __future__ import annotations

import dataclasses

from scheduler.policy import Migrate, PolicyConfig, get_policy

# Moves only: no packing trials or grow-shrink to muddy the decisions.
MOVES = PolicyConfig(enable_packing=False, enable_grow_shrink=False, balance_sizes=False,
                     probe_slices=False)


def _cluster(mk):
    """Two 8-GPU jobs take turns on s0+s1; s2..s5 each run one 2-GPU job, so 8 GPUs are
    free, two on each of four servers, and no server is idle."""
    pair = mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3)
    jobs = [mk.job("big-run", state="RUNNING", placement=pair, last_state_change_at=0.0, submitted_at=0.0),
            mk.job("big-wait", state="SUSPENDED", placement=pair, last_state_change_at=0.0, submitted_at=1.0)]
    jobs += [mk.job(f"small{i}", state="RUNNING", placement=mk.on(f"s{i}", 0, 1), submitted_at=2.0)
             for i in range(2, 6)]
    return mk.snap(30, mk.servers(6, 4), *jobs)


def test_a_suspended_large_job_takes_scattered_free_gpus(mk) -> None:
    d = get_policy("gandiva", dataclasses.replace(MOVES, lower_spread=True)).decide(_cluster(mk))
    moves = [x for x in d if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["big-wait"]
    assert sorted(moves[0].to_gpus) == sorted(
        g for i in range(2, 6) for g in mk.on(f"s{i}", 2, 3))  # the 8 idle GPUs, 2 on each server
    assert "lower the height" in moves[0].reason


def test_without_lower_spread_it_waits_for_its_turn_while_8_gpus_stand_idle(mk) -> None:
    d = get_policy("gandiva", MOVES).decide(_cluster(mk))
    assert not any(isinstance(x, Migrate) for x in d)
