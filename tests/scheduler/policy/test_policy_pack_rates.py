"""A packing trial is judged by each job's own measured rate: a rate a job reports cannot
keep a packing that hurts its partner (docs/security.md, Known limits)."""

from __future__ import annotations

import dataclasses

from scheduler.policy import Pack, PolicyConfig, Unpack, get_policy

PACK_ONLY = PolicyConfig(las_slices=False, slice_growth=0.0, max_jobs_per_gpu=4, enable_migration=False,
                         enable_grow_shrink=False, pack_trial_s=60)
NO_LOSER = dataclasses.replace(PACK_ONLY, pack_no_loser=True)


def _pair(mk, now: float, rate_run: float | None = 10.0, rate_wait: float | None = 10.0, packed: bool = False):
    """Job ``run`` running and ``wait`` time-sliced with it on one GPU, both 10 mini-batches/s
    alone; ``packed``: both running (the trial), at the given rates."""
    run = mk.job("run", state="RUNNING", placement=mk.on("s0", 0), profile=mk.profiled(4, 0.3),
                 rate=rate_run, model="vae")
    wait = mk.job("wait", state="RUNNING" if packed else "SUSPENDED", placement=mk.on("s0", 0),
                  profile=mk.profiled(4, 0.2), rate=rate_wait, model="lstm")
    return mk.snap(now, mk.servers(1, 1), run, wait)


def _trial(mk, config: PolicyConfig, rate_run: float | None, rate_wait: float | None, now: float = 80):
    """A trial started at 10 (it ends at 70); the decisions at ``now`` with these packed rates."""
    policy = get_policy("gandiva", config)
    assert mk.kinds(policy.decide(_pair(mk, 10))) == [("Pack", "wait")]
    return policy, policy.decide(_pair(mk, now, rate_run, rate_wait, packed=True))


def test_a_packed_rate_above_the_alone_rate_counts_as_the_alone_rate(mk) -> None:
    # The probe's figures: the guest reports 10^6 packed, its partner runs at 2.5 of 10.
    policy, d = _trial(mk, PACK_ONLY, rate_run=2.5, rate_wait=1e6)
    verdict = policy.state.verdicts[-1]
    assert verdict.gain == 1.25  # 1 (clipped) + 0.25, was 100000.25
    assert "wait's 100000.00x clipped at 1x" in verdict.reason
    assert verdict.kept is True and d == []  # 1.25 > 1.05: the sum alone still keeps it


def test_pack_no_loser_undoes_a_pair_whose_partner_falls_below_its_time_slice_share(mk) -> None:
    policy, d = _trial(mk, NO_LOSER, rate_run=2.5, rate_wait=1e6)
    assert mk.kinds(d) == [("Unpack", "wait")] and isinstance(d[0], Unpack)
    assert "but run kept 0.25x of its rate alone, under its time-slice share 0.50: undone" in d[0].reason
    assert policy.state.verdicts[-1].kept is False
    # The pair is not tried again.
    assert not any(isinstance(x, Pack) for x in policy.decide(_pair(mk, 200)))


def test_pack_no_loser_keeps_a_pair_where_each_job_keeps_its_share(mk) -> None:
    for config in (PACK_ONLY, NO_LOSER):
        policy, d = _trial(mk, config, rate_run=8.0, rate_wait=8.0)
        assert d == [] and policy.state.verdicts[-1].kept is True
        assert "clipped" not in policy.state.verdicts[-1].reason
    # 0.9 + 0.45 = 1.35 beats time-slicing, but run's partner is worse off than slicing.
    _, d = _trial(mk, PACK_ONLY, rate_run=9.0, rate_wait=4.5)
    assert d == []
    _, d = _trial(mk, NO_LOSER, rate_run=9.0, rate_wait=4.5)
    assert mk.kinds(d) == [("Unpack", "wait")] and "wait kept 0.45x" in d[0].reason


def test_a_trial_without_a_rate_at_its_end_is_void_after_a_grace(mk) -> None:
    # wait reports no rate (0 arrives as None: not measured) for the whole trial.
    policy, d = _trial(mk, PACK_ONLY, rate_run=2.5, rate_wait=None, now=80)
    assert d == [] and policy.state.trials  # past its end (70): a rate may still come
    assert policy.next_wakeup() is not None and policy.next_wakeup() <= 130
    d = policy.decide(_pair(mk, 131, 2.5, None, packed=True))  # 70 + one more pack_trial_s
    assert mk.kinds(d) == [("Unpack", "wait")] and isinstance(d[0], Unpack)
    assert "trial void: no rate measured from wait after 121.0s packed" in d[0].reason
    verdict = policy.state.verdicts[-1]
    assert verdict.kept is None and verdict.gain is None and not policy.state.trials
    # Void, not rejected: the pair may be tried again.
    assert any(isinstance(x, Pack) for x in policy.decide(_pair(mk, 300)))


def _three(mk, now: float, wait_rate: float, packed: float | None = None):
    """``new`` has run alone on s0/0 since 90 at 10/s; ``run`` and ``wait`` are suspended
    there, each last reporting ``wait_rate`` but measured 10/s alone before; ``packed``:
    ``wait`` runs beside ``new`` (the trial), both at that rate."""
    new = mk.job("new", state="RUNNING", placement=mk.on("s0", 0), profile=mk.profiled(4, 0.3),
                 rate=packed or 10.0, alone_rate=10.0, model="mlp", last_state_change_at=90)
    run = mk.job("run", state="SUSPENDED", placement=mk.on("s0", 0), profile=mk.profiled(4, 0.3),
                 rate=wait_rate, alone_rate=10.0, model="vae")
    wait = mk.job("wait", state="RUNNING" if packed else "SUSPENDED", placement=mk.on("s0", 0),
                  profile=mk.profiled(4, 0.2), rate=packed or wait_rate, alone_rate=10.0, model="lstm")
    return mk.snap(now, mk.servers(1, 1), new, run, wait)


def test_a_trial_after_a_void_one_is_judged_against_rates_measured_alone(mk) -> None:
    """A trial cut short in its first half by a newcomer is void: both jobs are suspended
    with their packed rates (2.5/s, a quarter of their 10/s alone) as their last rates.
    The next trial took that packed rate as the guest's rate alone: a pair halving both
    jobs' rates was judged "packed rate 1.25x of time-slicing: kept" (wait 2.5 packed vs
    2.5 alone). Now its baseline is its rate measured alone (JobView.alone_rate): 0.50x,
    undone."""
    policy = get_policy("gandiva", PACK_ONLY)
    pair = _pair(mk, 10)
    pair = dataclasses.replace(pair, jobs=tuple(dataclasses.replace(j, alone_rate=10.0) for j in pair.jobs))
    assert mk.kinds(policy.decide(pair)) == [("Pack", "wait")]
    packed = _pair(mk, 30, 2.5, 2.5, packed=True)
    d = policy.decide(dataclasses.replace(packed, jobs=(*packed.jobs, mk.job("new", submitted_at=30, model="mlp"))))
    assert sorted(mk.kinds(d)) == [("Place", "new"), ("Suspend", "run"), ("Suspend", "wait")]
    assert "trial void" in policy.state.verdicts[-1].reason
    d = policy.decide(_three(mk, 100, wait_rate=2.5))
    assert mk.kinds(d) == [("Pack", "wait")]
    assert policy.state.trials["wait"].base_rates == (10.0, 10.0)  # was (2.5, 10.0)
    d = policy.decide(_three(mk, 170, wait_rate=2.5, packed=2.5))
    verdict = policy.state.verdicts[-1]
    assert verdict.kept is False and verdict.gain == 0.5, verdict.reason  # was kept at 1.25
    assert "wait 2.5 packed vs 10 alone, new 2.5 vs 10 mini-batches/s" in verdict.reason
    assert mk.kinds(d) == [("Unpack", "wait")]


def test_a_trial_waits_for_a_rate_measured_alone(mk) -> None:
    """A job that has only been measured beside another (or on other GPUs) and has no
    profiled step time is not packed until it has run alone; then it is."""
    policy = get_policy("gandiva", PACK_ONLY)
    unmeasured = dataclasses.replace(mk.profiled(4, 0.2), step_time_s=None)
    snap = _pair(mk, 10, rate_wait=2.5)
    jobs = [dataclasses.replace(j, alone_rate=10.0 if j.id == "run" else None,
                                profile=unmeasured if j.id == "wait" else j.profile) for j in snap.jobs]
    assert policy.decide(dataclasses.replace(snap, jobs=tuple(jobs))) == []
    jobs[1] = dataclasses.replace(jobs[1], alone_rate=10.0)
    assert mk.kinds(policy.decide(dataclasses.replace(snap, now=20, jobs=tuple(jobs)))) == [("Pack", "wait")]
    assert policy.state.trials["wait"].base_rates == (10.0, 10.0)


def test_a_rate_alone_measured_in_a_launchs_warm_up_keeps_no_pack_that_halves_both(mk) -> None:
    """Demo of session 52: h3, restarted at step 0, suspended before its first run and resumed,
    was packed 2.6 s later; its first run took about a second (the graph built, the first
    mini-batch), so its rate alone read 16.1/s where it ran 28-31/s: "30.2 packed vs 16.1
    alone", 1.88x (clipped). Here a job of 10/s whose first mini-batch takes 1 s read 8.0/s
    alone, and a pack halving both jobs' rates was kept (0.62 + 0.50 = 1.12x of
    time-slicing). A launch's first WARMUP_STEPS are not counted: 10/s, the pack is undone."""
    from scheduler.alone import AloneRates, JobRow

    rates, gpu = AloneRates(), (("s0", 0),)
    rows = [JobRow("run", "l2", "RUNNING", 10.02, gpu), JobRow("wait", "lw", "SUSPENDED", 5.0, gpu)]
    rates.acked("run", "l2", False, 0, 5.0)  # its new launch suspended before its first run
    rates.acked("run", "l2", True, 0, 10.0)  # resumed at step 0
    rates.observe(10.05, rows)
    for step in range(1, 37):  # its first mini-batch ends at 11.0, then 10/s; a report at each
        t = 11.0 + (step - 1) / 10
        rates.report("run", "l2", step, t, 10.0, t)
    alone = rates.observe(14.6, rows)["run"]
    assert abs(alone - 10.0) < 0.01, alone  # was 8.0: 36 steps over 4.5 s, its first run's second in

    def pair(now: float, packed: bool):
        run = mk.job("run", state="RUNNING", placement=mk.on("s0", 0), profile=mk.profiled(4, 0.3),
                     rate=5.0 if packed else 10.0, alone_rate=alone, model="vae")
        wait = mk.job("wait", state="RUNNING" if packed else "SUSPENDED", placement=mk.on("s0", 0),
                      profile=mk.profiled(4, 0.2), rate=5.0 if packed else 10.0, alone_rate=10.0, model="lstm")
        return mk.snap(now, mk.servers(1, 1), run, wait)

    policy = get_policy("gandiva", PACK_ONLY)
    assert mk.kinds(policy.decide(pair(10, packed=False))) == [("Pack", "wait")]
    d = policy.decide(pair(80, packed=True))
    verdict = policy.state.verdicts[-1]
    assert verdict.kept is False and abs(verdict.gain - 1.0) < 0.01, verdict.reason  # was kept at 1.12
    assert mk.kinds(d) == [("Unpack", "wait")]
