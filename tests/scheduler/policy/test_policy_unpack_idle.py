"""unpack_idle: a kept pair running packed beside idle GPUs parts, each member then running
alone (docs/simulator.md, "Where the makespan misses lose their time": on Philly 6c71a0 the
last finishers ran packed for 680-930 h while GPUs stood idle)."""

from __future__ import annotations

import dataclasses

from scheduler.policy import Migrate, PolicyConfig, get_policy

# Moves only: no new packing trials, grow-shrink or first turns to muddy the decisions.
MOVES = PolicyConfig(enable_packing=False, enable_grow_shrink=False, balance_sizes=False, probe_slices=False)


def _cluster(mk, *extra):  # type: ignore[no-untyped-def]
    """On 2x4, a and b (1 GPU each) run packed on s0's GPU 0, c alone on its GPU 1: s0's
    GPUs 2 and 3 are free, s1 is idle."""
    jobs = [mk.job("a", state="RUNNING", placement=mk.on("s0", 0), submitted_at=0.0),
            mk.job("b", state="RUNNING", placement=mk.on("s0", 0), submitted_at=1.0),
            mk.job("c", state="RUNNING", placement=mk.on("s0", 1), submitted_at=2.0), *extra]
    return mk.snap(100, mk.servers(2, 4), *jobs)


def _decide(mk, config: PolicyConfig, *extra):  # type: ignore[no-untyped-def]
    policy = get_policy("gandiva", config)
    policy.state.keep_pair("a", "b")  # as a packing trial's verdict leaves it
    return policy, policy.decide(_cluster(mk, *extra))


def test_a_packed_pair_beside_free_gpus_parts_onto_its_own_servers_free_gpu(mk) -> None:
    """One member moves onto a free GPU of s0 (the server of its GPU count), never onto
    the idle s1 (kept whole for larger jobs), and the pair is no longer kept."""
    policy, d = _decide(mk, dataclasses.replace(MOVES, unpack_idle=True))
    moves = [x for x in d if isinstance(x, Migrate)]
    assert len(moves) == 1 and moves[0].job_id in ("a", "b")
    assert moves[0].to_gpus in (mk.on("s0", 2), mk.on("s0", 3))
    assert "kept pack" in moves[0].reason and "each runs faster alone" in moves[0].reason
    assert policy.state.kept_pairs == {}


def test_nothing_moves_while_a_job_is_queued(mk) -> None:
    """A queued job (8 GPUs: more than the 6 free) may be waiting for the free GPUs to add
    up: the pair stays packed."""
    big = mk.job("big", gpus=8, submitted_at=3.0)
    policy, d = _decide(mk, dataclasses.replace(MOVES, unpack_idle=True), big)
    assert not any(isinstance(x, Migrate) for x in d)
    assert policy.state.kept_pairs == {"a": "b", "b": "a"}


def test_nothing_moves_while_a_job_of_the_pairs_gpu_count_is_suspended(mk) -> None:
    """A suspended 1-GPU job that lower_height leaves where it is (c's group-mate, not
    migratable) waits for its turn: the pair stays packed (measured: parting pairs while
    such jobs waited cost Philly b436b2 its makespan goal)."""
    mate = mk.job("d", state="SUSPENDED", placement=mk.on("s0", 1), submitted_at=3.0, migratable=False)
    policy, d = _decide(mk, dataclasses.replace(MOVES, unpack_idle=True, enable_migration=True), mate)
    assert not any(isinstance(x, Migrate) and x.job_id in ("a", "b") for x in d)
    assert policy.state.kept_pairs == {"a": "b", "b": "a"}


def test_on_by_default_and_off_the_pair_stays_packed(mk) -> None:
    """On by default (no goal lost on the 19 traces of issue 11, five won held-out); with
    it off a kept pair stays packed beside the free GPUs, as before."""
    assert PolicyConfig().unpack_idle is True
    policy, d = _decide(mk, MOVES)
    assert [x.job_id in ("a", "b") for x in d if isinstance(x, Migrate)] == [True]
    policy, d = _decide(mk, dataclasses.replace(MOVES, unpack_idle=False))
    assert not any(isinstance(x, Migrate) for x in d)
    assert policy.state.kept_pairs == {"a": "b", "b": "a"}
