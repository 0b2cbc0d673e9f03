"""lower_spread: a suspended job larger than a server takes free GPUs scattered over
partly used servers, as placement would give it when queued (docs/simulator.md, "Idle GPUs
while jobs wait")."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import Migrate, Place, PolicyConfig, Queue, get_policy

# Moves only: no packing trials or grow-shrink to muddy the decisions.
MOVES = PolicyConfig(enable_packing=False, enable_grow_shrink=False, balance_sizes=False,
                     probe_slices=False)


def _cluster(mk, large=(("big-run", "RUNNING", 0.0, 0.0), ("big-wait", "SUSPENDED", 0.0, 1.0))):
    """8-GPU jobs take turns on s0+s1 (``large``: id, state, last state change, submit time;
    by default two); s2..s5 each run one 2-GPU job, so 8 GPUs are free, two on each of four
    servers, and no server is idle."""
    pair = mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3)
    jobs = [mk.job(name, state=state, placement=pair, last_state_change_at=changed, submitted_at=submitted)
            for name, state, changed, submitted in large]
    jobs += [mk.job(f"small{i}", state="RUNNING", placement=mk.on(f"s{i}", 0, 1), submitted_at=3.0)
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


# big-new (submitted second) has waited longest; big-old (submitted first: the eldest
# 8-GPU job) since t=10.
THREE = (("big-run", "RUNNING", 10.0, 2.0), ("big-new", "SUSPENDED", 0.0, 1.0), ("big-old", "SUSPENDED", 10.0, 0.0))


def test_lower_spread_eldest_spreads_only_the_eldest_of_its_count(mk) -> None:
    every = get_policy("gandiva", dataclasses.replace(MOVES, lower_spread=True)).decide(_cluster(mk, THREE))
    assert [m.job_id for m in every if isinstance(m, Migrate)] == ["big-new"]  # suspended longest
    eldest = dataclasses.replace(MOVES, lower_spread=True, lower_spread_eldest=True)
    d = get_policy("gandiva", eldest).decide(_cluster(mk, THREE))
    moves = [x for x in d if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["big-old"]
    assert sorted(moves[0].to_gpus) == sorted(g for i in range(2, 6) for g in mk.on(f"s{i}", 2, 3))
    # The eldest running (it holds the group's GPUs): no other 8-GPU job goes spread.
    assert not any(isinstance(x, Migrate) for x in get_policy("gandiva", eldest).decide(_cluster(mk)))


def test_lower_spread_idle_leaves_scattered_gpus_to_a_queued_job(mk) -> None:
    """lower_spread_idle: while a job is queued (a 16-GPU job waiting for its GPUs to add up,
    8 of them the free ones), the suspended 8-GPU job waits for its turn instead of taking
    them; with the queue empty it moves as under lower_spread alone."""
    idle = dataclasses.replace(MOVES, lower_spread=True, lower_spread_idle=True)
    queued = mk.job("wide", gpus=16, submitted_at=2.0)
    alone = _cluster(mk)
    waiting = mk.snap(30, alone.servers, *alone.jobs, queued)
    spread = get_policy("gandiva", dataclasses.replace(MOVES, lower_spread=True)).decide(waiting)
    assert [m.job_id for m in spread if isinstance(m, Migrate)] == ["big-wait"]  # lower_spread alone
    assert not any(isinstance(x, Migrate) for x in get_policy("gandiva", idle).decide(waiting))
    moves = [x for x in get_policy("gandiva", idle).decide(alone) if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["big-wait"]
    assert sorted(moves[0].to_gpus) == sorted(g for i in range(2, 6) for g in mk.on(f"s{i}", 2, 3))


def test_lower_spread_idle_needs_lower_spread() -> None:
    with pytest.raises(ValueError, match="lower_spread_idle bounds when lower_spread moves a job: turn lower_spread on too"):
        PolicyConfig(lower_spread_idle=True)


# A 2-GPU job waits suspended in a time-slice group: on s2, whose 2 free GPUs the spread
# would take; or on s6, full (its group-mate runs on s6's GPUs 0-1, another job on 2-3), so
# the spread takes none of its GPUs but it could move onto the free GPUs of s2..s5.
WAITERS = {
    "on-a-spread-server": (("waiter-mate", "RUNNING", "s2"), ("waiter", "SUSPENDED", "s2")),
    "elsewhere": (("waiter-mate", "RUNNING", "s6"), ("waiter", "SUSPENDED", "s6"), ("full", "RUNNING", "s6")),
}


@pytest.mark.parametrize("where", sorted(WAITERS))
def test_lower_spread_unwaited_leaves_scattered_gpus_to_a_suspended_smaller_job(mk, where) -> None:
    """lower_spread_unwaited: no job is queued, but a 2-GPU job waits suspended in its group.
    Under lower_spread_idle the suspended 8-GPU job (its group first: as many members, lower
    GPUs) takes the 8 scattered free GPUs and the 2-GPU job keeps waiting; with the rule the
    2-GPU job moves onto 2 of them and the 8-GPU job waits for its turn."""
    alone = _cluster(mk)
    extra = []
    for name, state, server in WAITERS[where]:
        gpus = (2, 3) if name == "full" else (0, 1)
        # s2's own small job is the waiter's group-mate there (s2's GPUs 0-1).
        extra.append(mk.job(name, gpus=2, state=state, placement=mk.on(server, *gpus),
                            last_state_change_at=0.0, submitted_at=4.0))
    jobs = [j for j in alone.jobs if not (where == "on-a-spread-server" and j.id == "small2")]
    servers = mk.servers(7, 4) if where == "elsewhere" else alone.servers
    snap = mk.snap(30, servers, *jobs, *extra)
    idle = dataclasses.replace(MOVES, lower_spread=True, lower_spread_idle=True)
    before = [x.job_id for x in get_policy("gandiva", idle).decide(snap) if isinstance(x, Migrate)]
    assert before == ["big-wait"]
    unwaited = dataclasses.replace(idle, lower_spread_unwaited=True)
    moves = [x for x in get_policy("gandiva", unwaited).decide(snap) if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["waiter"]
    assert len({g.server for g in moves[0].to_gpus}) == 1 and "lower the height" in moves[0].reason


def test_lower_spread_unwaited_needs_lower_spread_idle() -> None:
    with pytest.raises(ValueError, match="lower_spread_unwaited bounds when lower_spread_idle moves a job"):
        PolicyConfig(lower_spread=True, lower_spread_unwaited=True)


# lower_spread_yield_s: an 8-GPU job runs spread over s2..s5 (GPUs 2-3 of each), where
# full 2-GPU groups (a running and a suspended member, the cap 2 a GPU) hold GPUs 0-1; the
# 8-GPU group on s0+s1 has room for one more; a 2-GPU job is queued: no GPU is free.
YIELD = dataclasses.replace(MOVES, lower_spread=True, lower_spread_idle=True, lower_spread_unwaited=True,
                            max_jobs_per_gpu=2)


def _spread_held(mk, now: float, group_room: bool = True):
    pair = mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3)
    jobs = [mk.job("big-group", state="RUNNING", placement=pair, submitted_at=0.0)]
    if not group_room:
        jobs.append(mk.job("big-mate", state="SUSPENDED", placement=pair, submitted_at=0.5))
    jobs.append(mk.job("big-spread", state="RUNNING", submitted_at=1.0,
                       placement=tuple(g for i in range(2, 6) for g in mk.on(f"s{i}", 2, 3))))
    for i in range(2, 6):
        jobs += [mk.job(f"small{i}", state="RUNNING", placement=mk.on(f"s{i}", 0, 1), submitted_at=2.0),
                 mk.job(f"small{i}-mate", state="SUSPENDED", placement=mk.on(f"s{i}", 0, 1), submitted_at=2.0)]
    jobs.append(mk.job("newcomer", gpus=2, submitted_at=10.0))
    return mk.snap(now, mk.servers(6, 4), *jobs)


def test_lower_spread_yield_gives_scattered_gpus_back_to_a_queued_smaller_job(mk) -> None:
    """Without the rule the spread 8-GPU job keeps its 8 scattered GPUs however long the
    2-GPU job is queued. With lower_spread_yield_s=3600: an hour after the 2-GPU job was
    submitted, the spread job moves into its count's group on s0+s1 (it runs first there,
    the group's member suspended), and at the next call the 2-GPU job takes freed GPUs."""
    late = _spread_held(mk, now=10.0 + 3600)
    assert not any(isinstance(x, Migrate) for x in get_policy("gandiva", YIELD).decide(late))
    rule = dataclasses.replace(YIELD, lower_spread_yield_s=3600.0)
    d = get_policy("gandiva", rule).decide(late)
    d = [x for x in d if not isinstance(x, Queue)]
    assert mk.kinds(d) == [("Suspend", "big-group"), ("Migrate", "big-spread")]
    pair = mk.on("s0", 0, 1, 2, 3) + mk.on("s1", 0, 1, 2, 3)
    assert sorted(d[1].to_gpus) == sorted(pair)
    assert "job newcomer (2 GPUs) has waited 3600s" in d[1].reason and "lower_spread_yield_s" in d[1].reason
    policy = get_policy("gandiva", rule)
    policy.decide(late)
    nxt = policy.decide(mk.after(late, d, now=late.now + 5))
    placed = [x for x in nxt if isinstance(x, Place)]
    assert [p.job_id for p in placed] == ["newcomer"]
    assert len({g.server for g in placed[0].gpus}) == 1 and {g.index for g in placed[0].gpus} == {2, 3}


def test_lower_spread_yield_waits_its_bound_and_wakes_for_it(mk) -> None:
    """Before the bound the spread job keeps its GPUs, and the policy asks to be called when
    the queued job will have waited it (no event may come before; the quantum is long, so
    that no turn's end comes first)."""
    slow = dataclasses.replace(YIELD, quantum_s=1e6)
    without = get_policy("gandiva", slow)
    without.decide(_spread_held(mk, now=100.0))
    assert without.next_wakeup() is None or without.next_wakeup() > 3610.0
    policy = get_policy("gandiva", dataclasses.replace(slow, lower_spread_yield_s=3600.0))
    d = policy.decide(_spread_held(mk, now=100.0))
    assert not any(isinstance(x, Migrate) for x in d)
    assert policy.next_wakeup() == 3610.0


def test_lower_spread_yield_keeps_the_gpus_when_no_group_of_its_count_has_room(mk) -> None:
    """The 8-GPU group is full (two members, the cap 2): nowhere to go, the spread job stays
    (it is not parked: back in the queue ahead of the 2-GPU job, it would take the same
    scattered GPUs again)."""
    full = _spread_held(mk, now=10.0 + 7200, group_room=False)
    d = get_policy("gandiva", dataclasses.replace(YIELD, lower_spread_yield_s=3600.0)).decide(full)
    # Neither moved nor parked nor suspended: no decision about it at all (a Park passed the
    # check of no Migrate alone).
    assert [x for x in mk.kinds(d) if x[1] == "big-spread"] == []
    assert [x for x in mk.kinds(d) if x[1] == "newcomer"] == [("Queue", "newcomer")]


@pytest.mark.parametrize(("options", "message"), [
    ({"lower_spread": True, "lower_spread_yield_s": 60.0}, "lower_spread_yield_s gives back what lower_spread_idle"),
    ({"lower_spread": True, "lower_spread_idle": True, "lower_spread_yield_s": -1.0},
     "lower_spread_yield_s must not be negative, got -1.0"),
])
def test_lower_spread_yield_is_validated(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**options)


def test_lower_spread_yield_does_not_suspend_a_job_placed_this_call(mk) -> None:
    """A queued 8-GPU job (submitted before the 2-GPU one) joins the 8-GPU group on s0+s1 at
    this call as its newcomer, which runs first; the 2-GPU groups are full (cap 3). The spread
    job may not move into that group at the same call: it would suspend the newcomer it was
    just placed (Place and Suspend of one job in one call, its first turn never run)."""
    late = _spread_held(mk, now=10.0 + 3600)
    mates = tuple(mk.job(f"small{i}-mate2", state="SUSPENDED", placement=mk.on(f"s{i}", 0, 1), submitted_at=2.0)
                  for i in range(2, 6))
    late = dataclasses.replace(late, jobs=(*late.jobs, *mates, mk.job("new8", gpus=8, submitted_at=5.0)))
    rule = dataclasses.replace(YIELD, lower_spread_yield_s=3600.0, max_jobs_per_gpu=3)
    d = [x for x in get_policy("gandiva", rule).decide(late) if not isinstance(x, Queue)]
    assert ("Place", "new8") in mk.kinds(d)
    assert ("Suspend", "new8") not in mk.kinds(d)
    assert len({x.job_id for x in d}) == len(d), mk.kinds(d)


@pytest.mark.parametrize("field", ["lower_spread_yield_s", "large_block_after_s", "share_block_after_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_optional_seconds_refuse_what_is_not_a_finite_number(field, value) -> None:
    """A NaN bound compares false with any time: lower_spread_yield_s=nan gave the GPUs back at
    once, as 0 would (benchmarks' --config ...:nan, or PolicyConfig from Python); the live
    scheduler's --policy-option refused it, PolicyConfig itself did not."""
    with pytest.raises(ValueError, match=rf"{field} must be a finite number of seconds \(None turns it off\), got {value}"):
        PolicyConfig(lower_spread=True, lower_spread_idle=True, **{field: value})
