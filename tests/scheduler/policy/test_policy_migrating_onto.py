"""A job MIGRATING onto a time-slice group's GPUs counts as taken by it for that group.

Live, a moving job holds its source and its destination GPUs until the move ends (the
engine's snapshot binds it to both), so it is in no group while it moves. Found on a local
cluster (session 50): big1 was moved onto big2's two GPUs, big2 suspended for it; one round
later big2, alone in its group, was resumed as "its turn"; once big1 landed both ran on the
same GPUs for 90 s, never taking turns and never judged as a pack (all members running reads
as "a kept pack, or a lone job").
"""

from __future__ import annotations

import dataclasses

from scheduler.policy import Migrate, PolicyConfig, get_policy

# Plain slices (no growth): a slice is one quantum. No packing, moves or first turns to
# muddy the decisions.
CFG = PolicyConfig(quantum_s=6.0, slice_growth=0.0, enable_packing=False, enable_migration=False,
                   enable_grow_shrink=False, balance_sizes=False, probe_slices=False)


def _moving(mk, now: float, *extra):  # type: ignore[no-untyped-def]
    """big1 moving from s0/0,1 onto s1/0,1 (bound to both, as the live snapshot shows a
    move), big2 suspended on s1/0,1 for it at t=100."""
    big1 = mk.job("big1", gpus=2, state="MIGRATING", placement=mk.on("s0", 0, 1) + mk.on("s1", 0, 1),
                  attained_service_s=2000.0, submitted_at=0.0, last_state_change_at=100.0)
    big2 = mk.job("big2", gpus=2, state="SUSPENDED", placement=mk.on("s1", 0, 1),
                  attained_service_s=40.0, submitted_at=1.0, last_state_change_at=100.0)
    return mk.snap(now, mk.servers(2, 4), big1, big2, *extra)


def _landed(mk, now: float, where: str):  # type: ignore[no-untyped-def]
    """big1 running again, since t=120, on ``where``'s GPUs 0 and 1; big2 as before."""
    big1 = mk.job("big1", gpus=2, state="RUNNING", placement=mk.on(where, 0, 1), attained_service_s=2000.0,
                  reported_at=120.0, submitted_at=0.0, last_state_change_at=120.0)
    big2 = mk.job("big2", gpus=2, state="SUSPENDED", placement=mk.on("s1", 0, 1),
                  attained_service_s=40.0, submitted_at=1.0, last_state_change_at=100.0)
    return mk.snap(now, mk.servers(2, 4), big1, big2)


def test_a_suspended_job_waits_while_a_job_moves_onto_its_gpus_then_they_take_turns(mk) -> None:
    policy = get_policy("gandiva", CFG)
    for now in (101.0, 108.0, 114.0):  # before: Resume big2 at 101 ("its turn in the time-slice group")
        assert not any(d.job_id == "big2" for d in policy.decide(_moving(mk, now))), now
    # big1 lands at 120: it has its slice (one quantum), then big2 gets the GPUs.
    # (before: both ran from 120 on, and no later round rotated them)
    assert policy.decide(_landed(mk, 120.0, "s1")) == []
    assert policy.next_wakeup() == 126.0
    assert mk.kinds(policy.decide(_landed(mk, 126.0, "s1"))) == [("Suspend", "big1"), ("Resume", "big2")]


def test_a_job_whose_move_failed_leaves_the_group_and_its_mate_resumes_at_the_next_beat(mk) -> None:
    """Waiting for the move is not waiting for good: the group is looked at each beat, so
    when the move fails (the job runs on at its source) big2 resumes."""
    policy = get_policy("gandiva", CFG)
    assert not any(d.job_id == "big2" for d in policy.decide(_moving(mk, 101.0)))
    assert mk.kinds(policy.decide(_landed(mk, 120.0, "s0"))) == [("Resume", "big2")]


def test_a_newcomer_does_not_join_a_group_a_job_is_moving_onto(mk) -> None:
    """A 2-GPU newcomer, the cluster full, joins a 2-GPU group in turns: not big2's (big1
    lands there) but c's. Before: big2's (as few members, and first by GPUs), where it ran
    beside big1 once big1 landed."""
    c = mk.job("c", gpus=2, state="RUNNING", placement=mk.on("s1", 2, 3), submitted_at=2.0,
               last_state_change_at=50.0)
    d = mk.job("d", gpus=2, state="RUNNING", placement=mk.on("s0", 2, 3), submitted_at=3.0,
               last_state_change_at=50.0)
    new = mk.job("new", gpus=2, submitted_at=101.0)
    out = get_policy("gandiva", CFG).decide(_moving(mk, 101.0, c, d, new))
    placed = [x for x in out if x.job_id == "new" and hasattr(x, "gpus")]
    assert placed and all(g.server == "s0" or g.index in (2, 3) for g in placed[0].gpus), out


def test_a_hand_over_moves_no_job_into_a_group_a_job_is_moving_onto(mk) -> None:
    """balance_sizes' hand-over (and gather_large's) moves a donor's jobs into same-size
    groups: not into big2's while big1 is moving there (before: it was a target, the least
    full)."""
    from scheduler.policy.cluster import Ledger
    from scheduler.policy.migration import _handover_targets
    from scheduler.policy.state import GandivaState

    c = mk.job("c", gpus=2, state="RUNNING", placement=mk.on("s1", 2, 3), last_state_change_at=50.0)
    ledger = Ledger.of(_moving(mk, 101.0, c))
    assert sorted(gpus for gpus, _, _ in _handover_targets(ledger, GandivaState(), 2)) == [mk.on("s1", 2, 3)]


def test_the_hand_over_seen_on_the_local_cluster_then_its_next_rounds(mk) -> None:
    """The whole sequence as the policy makes it (default slices, balance_sizes on; 3 servers
    of 2 GPUs as `gandiva demo --servers 3`): ten 1-GPU jobs crowd s0, so s1 goes to them,
    big1 moving into big2's group (big2 suspended for it). The next rounds, as the live engine
    shows them (movers bound to both ends): big2 waits; big1 lands, and they take turns."""
    cfg = PolicyConfig(quantum_s=6.0, enable_packing=False, enable_grow_shrink=False, probe_slices=False)
    small = [mk.job(f"small{g}.{k}", state="RUNNING" if k == 0 else "SUSPENDED", placement=mk.on("s0", g),
                    attained_service_s=60.0 * (k + 1), submitted_at=0.0, last_state_change_at=0.0)
             for g in range(2) for k in range(5)]
    bigs = [mk.job(n, gpus=2, state="RUNNING", placement=mk.on(s, 0, 1), attained_service_s=600.0,
                   submitted_at=0.0, last_state_change_at=0.0) for n, s in (("big1", "s1"), ("big2", "s2"))]
    srv = mk.servers(3, 2)
    policy = get_policy("gandiva", cfg)
    first = policy.decide(mk.snap(100.0, srv, *small, *bigs))
    assert mk.kinds(first)[:2] == [("Suspend", "big2"), ("Migrate", "big1")]
    moves = {d.job_id: d.to_gpus for d in first if isinstance(d, Migrate)}
    views = {j.id: j for j in (*small, *bigs)}
    views["big2"] = dataclasses.replace(views["big2"], state="SUSPENDED", last_state_change_at=100.0)

    def moving(now: float, landed: bool):  # type: ignore[no-untyped-def]
        out = dict(views)
        for jid, to in moves.items():
            was = views[jid]
            out[jid] = dataclasses.replace(was, state="RUNNING", placement=to, last_state_change_at=120.0,
                                           reported_at=120.0) if landed else \
                dataclasses.replace(was, state="MIGRATING", placement=was.placement + to, last_state_change_at=100.0)
        return mk.snap(now, srv, *out.values())

    for now in (101.0, 108.0, 114.0):  # before: Resume big2 at 101
        assert not any(d.job_id == "big2" for d in policy.decide(moving(now, False))), now
    assert not any(d.job_id in ("big1", "big2") for d in policy.decide(moving(120.0, True)))
    # before: no later round rotated them (both running, "a kept pack, or a lone job")
    for now in range(126, 400, 6):
        turn = [d for d in policy.decide(moving(float(now), True)) if d.job_id in ("big1", "big2")]
        if turn:
            assert mk.kinds(turn) == [("Suspend", "big1"), ("Resume", "big2")]
            break
    else:
        raise AssertionError("big1 and big2 never took turns")
