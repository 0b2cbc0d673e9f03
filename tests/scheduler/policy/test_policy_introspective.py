"""Gandiva's introspective mode: time-slicing, packing trials, migration, grow-shrink."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import (
    Grow,
    Migrate,
    Pack,
    Place,
    PolicyConfig,
    Resume,
    Shrink,
    Unpack,
    get_policy,
)

# The paper's time-slicing: round-robin, one-quantum slices, at most 4 jobs per GPU.
PAPER = PolicyConfig(las_slices=False, slice_growth=0.0, max_jobs_per_gpu=4)
NO_MOVES = dataclasses.replace(PAPER, enable_migration=False, enable_packing=False, enable_grow_shrink=False)


def _group(mk, now_started: float = 0.0, priority: int = 1):
    return (mk.job("run", state="RUNNING", placement=mk.on("s0", 0), priority=priority,
                   last_state_change_at=now_started),
            mk.job("wait", state="SUSPENDED", placement=mk.on("s0", 0), last_state_change_at=0.0))


def test_running_job_keeps_the_gpu_until_its_quantum_is_over(mk) -> None:
    policy = get_policy("gandiva", NO_MOVES)
    assert policy.decide(mk.snap(30, mk.servers(1, 1), *_group(mk))) == []
    assert policy.next_wakeup() == 60  # slices end on the cluster-wide 60 s beat


def test_after_the_quantum_the_waiting_job_gets_its_turn(mk) -> None:
    d = get_policy("gandiva", NO_MOVES).decide(mk.snap(61, mk.servers(1, 1), *_group(mk)))
    assert mk.kinds(d) == [("Suspend", "run"), ("Resume", "wait")]
    assert d[1].gpus == mk.on("s0", 0)


def test_priority_two_gets_a_twice_as_long_slice(mk) -> None:
    policy = get_policy("gandiva", NO_MOVES)
    assert policy.decide(mk.snap(100, mk.servers(1, 1), *_group(mk, priority=2))) == []
    assert mk.kinds(policy.decide(mk.snap(121, mk.servers(1, 1), *_group(mk, priority=2))))[0] == (
        "Suspend", "run")


def test_quantum_is_configurable(mk) -> None:
    cfg = dataclasses.replace(NO_MOVES, quantum_s=10, slice_slack_s=0)
    d = get_policy("gandiva", cfg).decide(mk.snap(11, mk.servers(1, 1), *_group(mk)))
    assert mk.kinds(d) == [("Suspend", "run"), ("Resume", "wait")]


@pytest.mark.parametrize(("run_s", "wait_s", "switch"), [(500.0, 100.0, True), (100.0, 500.0, False),
                                                        (100.0, 100.0, False)])
def test_las_slices_give_the_gpu_to_the_least_served_job(mk, run_s: float, wait_s: float,
                                                         switch: bool) -> None:
    cfg = dataclasses.replace(NO_MOVES, las_slices=True)
    run, wait = _group(mk)
    run = dataclasses.replace(run, attained_service_s=run_s, reported_at=61.0)
    wait = dataclasses.replace(wait, attained_service_s=wait_s)
    d = get_policy("gandiva", cfg).decide(mk.snap(61, mk.servers(1, 1), run, wait))
    # A tie keeps the running job: no switch for nothing.
    assert mk.kinds(d) == ([("Suspend", "run"), ("Resume", "wait")] if switch else [])


def _packable(mk, rate_run: float = 10.0, rate_wait: float = 10.0, now: float = 10.0):
    run, wait = _group(mk)
    run = dataclasses.replace(run, profile=mk.profiled(4, 0.3), rate=rate_run, model="vae")
    wait = dataclasses.replace(wait, profile=mk.profiled(4, 0.2), rate=rate_wait, model="vae")
    return mk.snap(now, mk.servers(1, 1), run, wait)


PACK_ONLY = dataclasses.replace(NO_MOVES, enable_packing=True, pack_trial_s=60)


def test_overloaded_low_utilization_jobs_are_packed_for_a_trial(mk) -> None:
    d = get_policy("gandiva", PACK_ONLY).decide(_packable(mk))
    assert mk.kinds(d) == [("Pack", "wait")]
    assert isinstance(d[0], Pack) and d[0].gpus == mk.on("s0", 0)


def test_no_packing_when_memory_does_not_fit(mk) -> None:
    s = _packable(mk)
    big = tuple(dataclasses.replace(j, profile=mk.profiled(12, 0.2)) for j in s.jobs)
    assert get_policy("gandiva", PACK_ONLY).decide(dataclasses.replace(s, jobs=big)) == []


def test_pack_is_kept_when_the_measured_rates_beat_time_slicing(mk) -> None:
    policy = get_policy("gandiva", PACK_ONLY)
    policy.decide(_packable(mk))
    packed = _packable(mk, rate_run=8.0, rate_wait=8.0, now=80)  # 0.8 + 0.8 > 1
    packed = dataclasses.replace(packed, jobs=tuple(dataclasses.replace(j, state="RUNNING")
                                                    for j in packed.jobs))
    assert policy.decide(packed) == []


def test_pack_is_undone_when_worse_and_the_pair_is_not_tried_again(mk) -> None:
    policy = get_policy("gandiva", PACK_ONLY)
    policy.decide(_packable(mk))
    packed = _packable(mk, rate_run=4.0, rate_wait=4.0, now=80)  # 0.4 + 0.4 < 1
    packed = dataclasses.replace(packed, jobs=tuple(dataclasses.replace(j, state="RUNNING")
                                                    for j in packed.jobs))
    d = policy.decide(packed)
    assert mk.kinds(d) == [("Unpack", "wait")] and isinstance(d[0], Unpack)
    assert "no gain" in d[0].reason
    assert not any(isinstance(x, Pack) for x in policy.decide(_packable(mk, now=90)))


def test_no_packing_when_the_cluster_is_not_overloaded(mk) -> None:
    s = _packable(mk)
    alone = dataclasses.replace(s, servers=mk.servers(1, 2),
                                jobs=(s.jobs[0], dataclasses.replace(s.jobs[1], state="RUNNING",
                                                                     placement=mk.on("s0", 1))))
    assert get_policy("gandiva", PACK_ONLY).decide(alone) == []


def test_a_waiting_job_moves_to_gpus_freed_by_a_departure(mk) -> None:
    s = mk.snap(10, mk.servers(2, 1), *_group(mk))
    d = get_policy("gandiva").decide(s)
    assert mk.kinds(d) == [("Migrate", "wait")]
    assert isinstance(d[0], Migrate) and d[0].to_gpus == mk.on("s1", 0)


def test_a_spread_job_is_brought_onto_one_server_when_room_appears(mk) -> None:
    spread = mk.job("sp", state="RUNNING", placement=mk.on("s0", 2, 3) + mk.on("s1", 0, 1))
    other = mk.job("o", gpus=2, state="RUNNING", placement=mk.on("s0", 0, 1))
    d = get_policy("gandiva").decide(mk.snap(10, mk.servers(3), spread, other))
    assert mk.kinds(d) == [("Migrate", "sp")]
    assert {g.server for g in d[0].to_gpus} == {"s2"}


def test_defragmentation_empties_a_nearly_idle_server_when_jobs_wait(mk) -> None:
    lonely = mk.job("lonely", state="RUNNING", placement=mk.on("s0", 0))
    busy = [mk.job(f"b{i}", state="RUNNING", placement=mk.on("s1", i)) for i in range(2)]
    # A 4-GPU job waits for its turn on s2; no server has 4 free GPUs for it.
    group = [mk.job(j, state=st, placement=mk.on("s2", 0, 1, 2, 3), last_state_change_at=10)
             for j, st in (("x", "RUNNING"), ("y", "SUSPENDED"))]
    d = get_policy("gandiva").decide(mk.snap(10, mk.servers(3), lonely, *busy, *group))
    moves = [x for x in d if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["lonely"]
    assert moves[0].to_gpus[0].server == "s1" and "defragment" in moves[0].reason


def test_no_defragmentation_without_demand(mk) -> None:
    lonely = mk.job("lonely", state="RUNNING", placement=mk.on("s0", 0))
    busy = [mk.job(f"b{i}", state="RUNNING", placement=mk.on("s1", i)) for i in range(2)]
    assert get_policy("gandiva").decide(mk.snap(10, mk.servers(2), lonely, *busy)) == []


def test_opt_in_job_grows_after_the_idle_period_and_shrinks_for_a_newcomer(mk) -> None:
    cfg = PolicyConfig(grow_idle_s=100)
    policy = get_policy("gandiva", cfg)
    elastic = mk.job("e", state="RUNNING", placement=mk.on("s0", 0), grow_shrink=True)
    assert policy.decide(mk.snap(0, mk.servers(1), elastic)) == []
    (g,) = policy.decide(mk.snap(150, mk.servers(1), elastic))
    assert isinstance(g, Grow) and len(g.gpus) == 4
    grown = dataclasses.replace(elastic, gpus=4, base_gpus=1, placement=g.gpus)
    d = policy.decide(mk.snap(200, mk.servers(1), grown, mk.job("new")))
    assert mk.kinds(d) == [("Shrink", "e"), ("Place", "new")]
    assert isinstance(d[0], Shrink) and d[0].gpus == mk.on("s0", 0)


def test_a_job_grows_only_onto_gpus_idle_for_the_idle_period_not_onto_one_just_freed(mk) -> None:
    """`gandiva demo` in session 52's CI: the other server's GPUs had been idle for 18 s when
    the last sweep job beside ``solo`` ended; solo grew onto that GPU in the same round
    ("GPUs idle for 18s" for a GPU free for none), before the story's next jobs came, and
    the 2-GPU job that was to make it move time-sliced with it instead. Now the GPU it grows
    onto must itself have been free for ``grow_idle_s``; the policy wakes when it has."""
    policy = get_policy("gandiva", PolicyConfig(grow_idle_s=10))
    solo = mk.job("solo", state="RUNNING", placement=mk.on("s0", 0), grow_shrink=True)
    last = mk.job("last", state="RUNNING", placement=mk.on("s0", 1))
    assert policy.decide(mk.snap(0, mk.servers(2, 2), solo, last)) == []
    assert policy.decide(mk.snap(18, mk.servers(2, 2), solo, last)) == []  # s0 has no free GPU
    assert policy.decide(mk.snap(18.5, mk.servers(2, 2), solo)) == []  # "last" ended just now
    assert policy.next_wakeup() == 28.5
    (g,) = policy.decide(mk.snap(28.5, mk.servers(2, 2), solo))
    assert isinstance(g, Grow) and g.gpus == mk.on("s0", 0, 1) and g.reason == "GPUs idle for 10s"


def test_a_gpu_taken_and_freed_while_free_gpus_were_reserved_counts_idle_from_its_freeing(mk) -> None:
    """A round that reserves free GPUs for a waiting job makes no grow; it did not look at
    the GPUs either, so one taken then (``x`` on s0/1) and freed again counted as idle from
    before: solo grew onto it the moment it was freed ("GPUs idle for 60s")."""
    policy = get_policy("gandiva", PolicyConfig(grow_idle_s=10, reserve_after_s=5))
    solo = mk.job("solo", state="RUNNING", placement=mk.on("s0", 0), grow_shrink=True)
    busy = [mk.job(f"b{i}", state="RUNNING", placement=mk.on("s1", i)) for i in range(2)]
    assert policy.decide(mk.snap(0, mk.servers(2, 2), solo, *busy)) == []
    x = mk.job("x", state="RUNNING", placement=mk.on("s0", 1))
    waits = mk.job("q", gpus=2, submitted_at=0.0)
    assert mk.kinds(policy.decide(mk.snap(50, mk.servers(2, 2), solo, x, *busy, waits))) == [("Queue", "q")]
    assert policy.decide(mk.snap(60, mk.servers(2, 2), solo, *busy)) == []
    (g,) = policy.decide(mk.snap(70, mk.servers(2, 2), solo, *busy))
    assert isinstance(g, Grow) and g.reason == "GPUs idle for 10s"


@pytest.mark.parametrize("others", [0, 1])
def test_a_grown_job_whose_grow_shrink_was_turned_off_is_shrunk_back_and_never_grows_again(
        mk, others: int) -> None:
    # Its runtime found that a grow changes its result (one tower per device): the live
    # engine then shows it to the policy with grow_shrink off; idle GPUs or not, it goes
    # back to its own GPU count at once and stays there.
    policy = get_policy("gandiva", PolicyConfig(grow_idle_s=0))
    grown = mk.job("e", state="RUNNING", placement=mk.on("s0", 0, 1), gpus=2, base_gpus=1)
    busy = [mk.job(f"b{i}", state="RUNNING", placement=mk.on("s0", 2 + i)) for i in range(others)]
    (d,) = policy.decide(mk.snap(10, mk.servers(1), grown, *busy))
    assert isinstance(d, Shrink) and d.job_id == "e" and d.gpus == mk.on("s0", 0)
    assert "grow-shrink is off" in d.reason
    back = dataclasses.replace(grown, gpus=1, placement=d.gpus)
    for now in (20, 500):
        assert policy.decide(mk.snap(now, mk.servers(1), back, *busy)) == []


def test_jobs_that_did_not_opt_in_never_grow(mk) -> None:
    policy = get_policy("gandiva", PolicyConfig(grow_idle_s=0))
    plain = mk.job("p", state="RUNNING", placement=mk.on("s0", 0))
    assert policy.decide(mk.snap(0, mk.servers(1), plain)) == []
    assert policy.decide(mk.snap(500, mk.servers(1), plain)) == []


def test_a_pack_no_trial_judged_takes_turns_without_a_rate_alone(mk) -> None:
    """Two jobs running on one GPU that no trial put there (live: two moves that landed on
    it, a restarted scheduler that forgot its verdicts) and no rate alone to judge them by:
    they take turns. Before, read as a kept pack (every member running), they ran together
    unmeasured, and rotated as one unit."""
    packed = [mk.job(j, state="RUNNING", placement=mk.on("s0", 0), last_state_change_at=0) for j in ("a", "b")]
    waiting = mk.job("c", state="SUSPENDED", placement=mk.on("s0", 0))
    policy = get_policy("gandiva", PAPER)
    d = policy.decide(mk.snap(100, mk.servers(1, 1), *packed, waiting))
    assert mk.kinds(d) == [("Suspend", "b")] and "no packing trial" in d[0].reason
    assert policy.next_wakeup() == 180  # a keeps the GPU one more quantum, to the beat
    # Then c, which waited longest, runs.
    b = mk.job("b", state="SUSPENDED", placement=mk.on("s0", 0), last_state_change_at=101)
    d = policy.decide(mk.snap(180, mk.servers(1, 1), packed[0], b, waiting))
    assert mk.kinds(d) == [("Suspend", "a"), ("Resume", "c")]
    assert all(not isinstance(x, Resume) or x.gpus == mk.on("s0", 0) for x in d)


@pytest.mark.parametrize(("rate", "kept"), [(1.0, False), (3.0, True)])
def test_a_pack_no_trial_judged_is_kept_only_when_its_measured_rates_say_it_helps(mk, rate: float,
                                                                                   kept: bool) -> None:
    """The same pack, both jobs' rates alone known (4 mini-batches/s): a trial of it starts as
    it runs, and its measured rates decide: each at 1/s packed (0.5x of time-slicing) is
    undone, each at 3/s (1.5x) kept, and the kept pair then takes its turns as one unit."""
    def pair(r: float | None) -> list:
        return [mk.job(j, state="RUNNING", placement=mk.on("s0", 0), last_state_change_at=0, alone_rate=4.0, rate=r)
                for j in ("a", "b")]
    waiting = mk.job("c", state="SUSPENDED", placement=mk.on("s0", 0))
    policy = get_policy("gandiva", PAPER)
    assert policy.decide(mk.snap(100, mk.servers(1, 1), *pair(None), waiting)) == []
    assert policy.next_wakeup() == 100 + PAPER.pack_trial_s
    for now in (170.0, 221.0):
        d = policy.decide(mk.snap(now, mk.servers(1, 1), *pair(rate), waiting))
    if not kept:
        assert mk.kinds(d) == [("Unpack", "b")] and "no gain" in d[0].reason
        assert "found running together, not packed by the policy" in d[0].reason  # no `pack` line came before
        return
    assert mk.kinds(d) == [("Suspend", "a"), ("Suspend", "b"), ("Resume", "c")]



def test_a_co_run_kept_by_its_trial_leaves_the_kept_pair_one_of_its_jobs_was_in(mk) -> None:
    """a and b a kept pair; a found running beside c (b's resume not applied, an operator's
    resume of c) is judged with c, and kept: a's pair is now a and c. Before, b was left
    a's partner on its own side (kept_pairs b -> a, a -> c): b, alone, was held as one of a
    kept pair, never moved, packed or parked until a ended."""
    def jobs(rate: float | None) -> list:
        return [mk.job(j, state="RUNNING", placement=mk.on("s0", 0), last_state_change_at=at, alone_rate=4.0,
                       rate=rate) for j, at in (("a", 0), ("c", 5))] + [
            mk.job("b", state="SUSPENDED", placement=mk.on("s0", 0), last_state_change_at=1, alone_rate=4.0)]
    policy = get_policy("gandiva", PAPER)
    policy.state.keep_pair("a", "b")
    for now, rate in ((100.0, None), (170.0, 3.0), (221.0, 3.0)):
        d = policy.decide(mk.snap(now, mk.servers(1, 1), *jobs(rate)))
    assert mk.kinds(d) == [("Suspend", "a"), ("Suspend", "c"), ("Resume", "b")]  # the kept pair's turn ends
    assert policy.state.kept_pairs == {"a": "c", "c": "a"}


def test_a_server_is_emptied_for_a_queued_job_that_no_server_has_room_for(mk) -> None:
    lonely = mk.job("lonely", state="RUNNING", placement=mk.on("s0", 0))
    two = [mk.job(f"t{i}", state="RUNNING", placement=mk.on("s1", i)) for i in range(2)]
    three = [mk.job(f"h{i}", state="RUNNING", placement=mk.on("s2", i)) for i in range(3)]
    waiting = mk.job("four", gpus=4, submitted_at=5)
    policy = get_policy("gandiva")
    d = policy.decide(mk.snap(10, mk.servers(3), lonely, *two, *three, waiting))
    # 6 GPUs are free (3 + 2 + 1) but no server has 4: the lonely job moves to the fullest server.
    moves = [x for x in d if isinstance(x, Migrate)]
    assert [m.job_id for m in moves] == ["lonely"]
    assert moves[0].to_gpus == mk.on("s2", 3) and "make room for job four" in moves[0].reason
    assert policy.next_wakeup() is not None and policy.next_wakeup() <= 15
    # Next round, with the move carried out, the job gets the emptied server.
    moved = mk.job("lonely", state="RUNNING", placement=mk.on("s2", 3))
    d = policy.decide(mk.snap(16, mk.servers(3), moved, *two, *three, waiting))
    (place,) = [x for x in d if isinstance(x, Place)]
    assert place.job_id == "four" and {g.server for g in place.gpus} == {"s0"}


def test_no_server_is_emptied_when_its_jobs_would_have_to_time_share(mk) -> None:
    jobs = [mk.job(f"j{i}{k}", state="RUNNING", placement=mk.on(f"s{i}", k)) for i in range(2) for k in range(3)]
    d = get_policy("gandiva").decide(mk.snap(10, mk.servers(2), *jobs, mk.job("two", gpus=2)))
    # 1 + 1 free GPUs: emptying either server needs 3 free GPUs on the other, and there is 1.
    assert not [x for x in d if isinstance(x, Migrate)]


def test_a_server_is_emptied_onto_one_as_full_when_that_lets_the_job_in(mk) -> None:
    # Two-GPU servers with one job each: the 2-GPU job fits neither, though 2 GPUs are free.
    jobs = [mk.job(f"j{i}", state="RUNNING", placement=mk.on(f"s{i}", 0)) for i in range(2)]
    d = get_policy("gandiva").decide(mk.snap(10, mk.servers(2, gpus=2), *jobs, mk.job("two", gpus=2)))
    (move,) = [x for x in d if isinstance(x, Migrate)]
    assert move.job_id == "j0" and move.to_gpus == mk.on("s1", 1)
    assert move.reason == "make room for job two: empty s0"


def test_rejected_pairs_of_ended_jobs_are_forgotten_model_verdicts_kept() -> None:
    from scheduler.policy.state import GandivaState

    state = GandivaState(rejected={frozenset({"job:a", "job:b"}), frozenset({"job:a", "job:c"}),
                                   frozenset({"model:vae", "model:lstm"})})
    state.forget_missing({"a", "c"})
    assert state.rejected == {frozenset({"job:a", "job:c"}), frozenset({"model:vae", "model:lstm"})}


def _packed(mk, rate: float, now: float, *, without: str = ""):
    """The pair of _packable packed (both running) at ``now``, each at ``rate``; ``without``
    a job that has finished."""
    s = _packable(mk, rate_run=rate, rate_wait=rate, now=now)
    return dataclasses.replace(s, jobs=tuple(dataclasses.replace(j, state="RUNNING") for j in s.jobs
                                             if j.id != without))


@pytest.mark.parametrize(("rate", "kept"), [(8.0, True), (4.0, False)])  # 0.8 + 0.8 > 1; 0.4 + 0.4 < 1
def test_a_trial_cut_short_by_a_finished_job_is_judged_by_its_second_half_rates(mk, rate: float,
                                                                                 kept: bool) -> None:
    policy = get_policy("gandiva", PACK_ONLY)
    assert mk.kinds(policy.decide(_packable(mk))) == [("Pack", "wait")]
    assert policy.decide(_packed(mk, rate, now=30)) == []  # first half: no sample yet
    assert policy.decide(_packed(mk, rate, now=45)) == []  # second half: sampled
    # The host finished before the trial's end (70): nothing to unpack, but a verdict.
    assert policy.decide(_packed(mk, rate, now=50, without="run")) == []
    verdict = policy.state.verdicts[-1]
    assert (verdict.job_id, verdict.partner_id, verdict.kept) == ("wait", "run", kept)
    assert verdict.gain == pytest.approx(2 * rate / 10) and "job run ended" in verdict.reason
    assert not policy.state.trials
    # A pair of these models found no better is not tried again (model verdicts outlive jobs).
    again = policy.decide(_packable(mk, now=200))
    assert any(isinstance(d, Pack) for d in again) == kept


def test_a_trial_cut_short_before_its_rates_settled_is_void_and_may_be_tried_again(mk) -> None:
    policy = get_policy("gandiva", PACK_ONLY)
    policy.decide(_packable(mk))
    assert policy.decide(_packed(mk, 4.0, now=30, without="run")) == []  # 20 s of 60: no sample
    verdict = policy.state.verdicts[-1]
    assert verdict.kept is None and verdict.gain is None and "void" in verdict.reason
    assert any(isinstance(d, Pack) for d in policy.decide(_packable(mk, now=200)))


def test_a_pack_suspended_for_a_newcomer_is_judged_and_a_good_pair_stays_together(mk) -> None:
    policy = get_policy("gandiva", PACK_ONLY)
    policy.decide(_packable(mk))
    policy.decide(_packed(mk, 8.0, now=45))
    newcomer = mk.job("new", submitted_at=50)
    packed = _packed(mk, 8.0, now=50)
    d = policy.decide(dataclasses.replace(packed, jobs=(*packed.jobs, newcomer)))
    assert sorted(mk.kinds(d)) == [("Place", "new"), ("Suspend", "run"), ("Suspend", "wait")]
    verdict = policy.state.verdicts[-1]
    assert verdict.kept is True and "time-slice with new job new" in verdict.reason
    assert policy.state.kept_pairs == {"run": "wait", "wait": "run"}


def test_a_suspended_kept_pack_does_not_wait_while_gpus_stand_idle(mk) -> None:
    # A kept pair suspended for a newcomer takes its turns together in its group: by default
    # lower_height never moves a kept pair's member, so with GPUs free elsewhere the pair
    # waits (a Philly replay under fifo_after_s ended with 70 of 100 GPUs idle beside 100
    # such jobs); lower_kept_pairs moves it.
    policy = get_policy("gandiva", dataclasses.replace(PACK_ONLY, enable_migration=True, lower_kept_pairs=True))
    policy.decide(_packable(mk))
    policy.decide(_packed(mk, 8.0, now=45))
    packed = _packed(mk, 8.0, now=50)
    busy = dataclasses.replace(packed, jobs=(*packed.jobs, mk.job("new", submitted_at=50)))
    d = policy.decide(busy)
    assert sorted(mk.kinds(d)) == [("Place", "new"), ("Suspend", "run"), ("Suspend", "wait")]
    assert policy.state.kept_pairs == {"run": "wait", "wait": "run"}
    # A second GPU frees up (here: a server joins): a member of the pair moves there at once,
    # the pair ends, and the reason says so.
    later = mk.after(busy, d, 60)
    d = policy.decide(dataclasses.replace(later, servers=mk.servers(2, 1)))
    moves = [x for x in d if isinstance(x, Migrate)]
    assert [(m.job_id in ("run", "wait"), m.to_gpus) for m in moves] == [(True, mk.on("s1", 0))]
    assert "kept pack" in moves[0].reason and "ends" in moves[0].reason
    assert policy.state.kept_pairs == {}

    # Off (the default), the pair keeps waiting for its turn.
    policy = get_policy("gandiva", dataclasses.replace(PACK_ONLY, enable_migration=True))
    policy.decide(_packable(mk))
    policy.decide(_packed(mk, 8.0, now=45))
    d = policy.decide(busy)
    d = policy.decide(dataclasses.replace(mk.after(busy, d, 60), servers=mk.servers(2, 1)))
    assert not any(isinstance(x, Migrate) for x in d) and policy.state.kept_pairs == {"run": "wait", "wait": "run"}


def test_a_grown_job_is_shrunk_only_for_a_job_its_freed_gpus_place(mk) -> None:
    """A shrink whose beneficiary is placed elsewhere in the same round: ``solo`` grown from
    1 to 2 GPUs on s1, a 2-GPU newcomer ``x`` with no free GPUs. Every grown job was shrunk
    for the first job that did not fit: solo gave up s1/1, x fit none of it and time-sliced
    with ``a`` on s0, s1/1 stood idle, and solo could not grow back while x and a waited.
    Now solo stays grown for x, and is shrunk for a 1-GPU job behind it, which takes s1/1."""
    solo = mk.job("solo", state="RUNNING", placement=mk.on("s1", 0, 1), gpus=2, base_gpus=1, grow_shrink=True)
    a = mk.job("a", state="RUNNING", placement=mk.on("s0", 0, 1), submitted_at=1)
    x = mk.job("x", gpus=2, submitted_at=50)
    d = get_policy("gandiva").decide(mk.snap(100, mk.servers(2, 2), solo, a, x))
    assert mk.kinds(d) == [("Suspend", "a"), ("Place", "x")], d  # was a Shrink of solo first
    assert d[1].gpus == mk.on("s0", 0, 1)
    y = mk.job("y", submitted_at=60)
    d = get_policy("gandiva").decide(mk.snap(100, mk.servers(2, 2), solo, a, x, y))
    assert mk.kinds(d) == [("Suspend", "a"), ("Place", "x"), ("Shrink", "solo"), ("Place", "y")], d
    assert d[2].reason == "job y needs GPUs" and d[2].gpus == mk.on("s1", 0)  # was "job x needs GPUs"
    assert d[3].gpus == mk.on("s1", 1)
    # Two grown jobs, one newcomer: only the one whose freed GPU it takes is shrunk.
    other = mk.job("other", state="RUNNING", placement=mk.on("s0", 0, 1), gpus=2, base_gpus=1, grow_shrink=True)
    d = get_policy("gandiva").decide(mk.snap(100, mk.servers(2, 2), solo, other, y))
    shrinks, places = [e for e in d if isinstance(e, Shrink)], [e for e in d if not isinstance(e, Shrink)]
    assert len(shrinks) == 1 and mk.kinds(places) == [("Place", "y")], d
    freed = set(mk.on("s0", 1) if shrinks[0].job_id == "other" else mk.on("s1", 1))
    assert set(places[0].gpus) == freed, d


def test_a_job_placed_on_gpus_a_shrink_frees_waits_for_that_shrink_not_time_sliced_elsewhere(mk) -> None:
    """Demo of session 52, 17:20:12: three newcomers, ``solo`` grown to both GPUs of s1. The
    round placed late1 and late2 on s0 and shrank solo for late3, placed on the GPU it frees.
    Live, late3's start waits for the shrink (a move) to end, solo seen MIGRATING on both
    GPUs meanwhile; the next round time-sliced late3 with late1 on s0 (late1 suspended), and
    once the shrink ended late1 was moved onto the freed GPU: a suspend and a move for
    nothing. Now late3 waits for the shrink made for it, then takes the freed GPU."""
    policy = get_policy("gandiva", PolicyConfig(queue_reasons=True))
    solo = mk.job("solo", state="RUNNING", placement=mk.on("s1", 0, 1), gpus=2, base_gpus=1, grow_shrink=True)
    late = [mk.job(f"late{i}", submitted_at=90 + i) for i in (1, 2, 3)]
    d = policy.decide(mk.snap(100, mk.servers(2, 2), solo, *late))
    assert mk.kinds(d) == [("Place", "late1"), ("Place", "late2"), ("Shrink", "solo"), ("Place", "late3")]
    assert d[2].reason == "job late3 needs GPUs" and d[3].gpus == mk.on("s1", 1)
    started = [dataclasses.replace(late[i], state="RUNNING", placement=mk.on("s0", i), last_state_change_at=100)
               for i in (0, 1)]
    moving = dataclasses.replace(solo, state="MIGRATING", last_state_change_at=100)
    for now in (101, 120):
        d = policy.decide(mk.snap(now, mk.servers(2, 2), moving, *started, late[2]))
        assert mk.kinds(d) == [("Queue", "late3")], d  # was Suspend late1, Place late3 on s0/0
        assert d[0].reason == "waits for the GPUs that job solo frees (shrunk back for it)"
    landed = dataclasses.replace(solo, gpus=1, placement=mk.on("s1", 0), last_state_change_at=125)
    d = policy.decide(mk.snap(125, mk.servers(2, 2), landed, *started, late[2]))
    assert mk.kinds(d) == [("Place", "late3")] and d[0].gpus == mk.on("s1", 1)
    # A shrink that failed (solo back on both GPUs, grown): late3 is placed as any job again.
    policy.decide(mk.snap(101, mk.servers(2, 2), moving, *started, late[2]))
    d = policy.decide(mk.snap(130, mk.servers(2, 2), solo, *started, late[2]))
    assert mk.kinds(d) == [("Shrink", "solo"), ("Place", "late3")], d
