"""``gittins_slices`` and ``fifo_after_measured`` (issue 11): inside a time-slice group the unit with the highest Gittins
index of its attained service runs next, the index computed from the service with which
jobs left the cluster. Where lengths are light-tailed (every job about as long) the job
that has run longest is the nearest to its end and keeps the GPU; where they are
heavy-tailed the newcomer runs first, as under least attained service. The cheaper
``fifo_after_measured`` gets there with service buckets whose boundary is where the
departures' mean residual service peaks.

Departures reach the policy as they do live and in the simulator: jobs present in one
snapshot and gone from the next.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from scheduler.policy import PolicyConfig, ServerView, get_policy
from scheduler.policy.gittins import COLD_START, HISTORY, WINDOW, GittinsTable, ServiceWindow

HOUR = 3600.0
GITTINS = PolicyConfig(las_slices=True, gittins_slices=True, slice_growth=0.0, enable_migration=False,
                       enable_packing=False, enable_grow_shrink=False)
MEASURED = dataclasses.replace(GITTINS, gittins_slices=False, fifo_after_measured=True)
RULES = pytest.mark.parametrize("config", [GITTINS, MEASURED], ids=["gittins", "measured-buckets"])


def light(n: int) -> list[float]:
    """Every job 5-7 hours (evenly spread)."""
    return [5 * HOUR + 2 * HOUR * (i + 0.5) / n for i in range(n)]


def heavy(n: int) -> list[float]:
    """Pareto lengths, shape 0.8, from 5 minutes (at evenly spread quantiles)."""
    return [300.0 * (1 - (i + 0.5) / n) ** (-1 / 0.8) for i in range(n)]


def _decide_after_departures(mk, config: PolicyConfig, lengths: list[float], old_s: float, new_s: float):
    """A one-GPU group on s0: ``old`` (``old_s`` of service, running since 0) and ``new``
    (``new_s``, suspended). At 30 s jobs of ``lengths`` run on s1 (one GPU each); by the
    slice's end (61 s) they have left. Returns the decisions then."""
    srv = (ServerView("s0", 1), ServerView("s1", max(1, len(lengths))))

    def group(now: float):
        return (mk.job("old", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=old_s + now,
                       reported_at=now, submitted_at=0.0, last_state_change_at=0.0),
                mk.job("new", state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=new_s,
                       submitted_at=10.0, last_state_change_at=0.0))

    leaving = [mk.job(f"d{i}", state="RUNNING", placement=mk.on("s1", i), attained_service_s=s,
                      reported_at=30.0, submitted_at=0.0, last_state_change_at=0.0)
               for i, s in enumerate(lengths)]
    policy = get_policy("gandiva", config)
    assert policy.decide(mk.snap(30.0, srv, *group(30.0), *leaving)) == []
    return policy.decide(mk.snap(61.0, srv, *group(61.0)))


@RULES
@pytest.mark.parametrize(("old_h", "new_s"), [(5.0, 120.0), (5.5, 0.0), (6.5, 3000.0)])
def test_light_tailed_departures_let_the_more_served_job_keep_the_gpu(mk, config: PolicyConfig, old_h: float,
                                                                      new_s: float) -> None:
    d = _decide_after_departures(mk, config, light(200), old_h * HOUR, new_s)
    assert d == []  # old keeps running: it is closer to its end than new
    # Least attained service (the default) would switch to the newcomer.
    plain = dataclasses.replace(GITTINS, gittins_slices=False)
    assert mk.kinds(_decide_after_departures(mk, plain, light(200), old_h * HOUR, new_s)) == [
        ("Suspend", "old"), ("Resume", "new")]


@RULES
@pytest.mark.parametrize(("old_h", "new_s"), [(5.0, 120.0), (1.0, 0.0), (20.0, 1000.0)])
def test_heavy_tailed_departures_run_the_newcomer_first(mk, config: PolicyConfig, old_h: float,
                                                        new_s: float) -> None:
    d = _decide_after_departures(mk, config, heavy(200), old_h * HOUR, new_s)
    assert mk.kinds(d) == [("Suspend", "old"), ("Resume", "new")]


@RULES
def test_before_enough_jobs_have_left_the_order_is_least_attained_service(mk, config: PolicyConfig) -> None:
    d = _decide_after_departures(mk, config, light(COLD_START - 1), 5 * HOUR, 120.0)
    assert mk.kinds(d) == [("Suspend", "old"), ("Resume", "new")]
    assert _decide_after_departures(mk, config, light(COLD_START), 5 * HOUR, 120.0) == []


@pytest.mark.parametrize(("lengths", "shape"), [(light(1000), "rises"), (heavy(1000), "falls"),
                                                ([HOUR * (i + 0.5) / 100 for i in range(100)] * 10, "rises")])
def test_the_index_rises_with_service_for_light_tails_and_falls_for_heavy_ones(lengths: list[float],
                                                                               shape: str) -> None:
    """Past a quarter of an hour (Pareto's scale is 5 minutes), up to where at least 20
    departures are left to tell (``end``)."""
    table = GittinsTable.of(lengths)
    pts = [(g, i) for g, i in zip(table.grid, table.index, strict=True) if g >= HOUR / 4]
    values = [i for _, i in pts]
    assert len(values) >= 3
    if shape == "falls":
        values.reverse()
    # Rising (read backwards: falling) from point to point, but for sampling noise (5%),
    # and by a factor of 3 over the range.
    assert all(b >= a * 0.95 for a, b in itertools.pairwise(values)) and values[-1] > 3 * values[0]
    # A unit's index changes only at the next grid point; past ``end`` it has none.
    assert table.next_change(pts[0][0]) == pts[1][0]
    assert table.next_change(table.grid[-1]) == table.end
    assert table.at(table.end) is None and table.at(table.end - 1) == table.index[-1]
    assert sum(s > table.end for s in lengths) < 20 <= sum(s > table.grid[-1] for s in lengths)


@pytest.mark.parametrize(("lengths", "peak_h"), [
    (light(1000), 0.0),  # the mean residual falls from the start: first come first served throughout
    (heavy(1000), None),  # still rising where the departures end: least attained service throughout
    # Half the jobs a few minutes, half 10-11 hours: it rises until the short ones are done.
    ([300.0 + i for i in range(500)] + [10 * HOUR + 7.2 * i for i in range(500)], 0.22),
])
def test_the_measured_bucket_boundary_is_where_the_mean_residual_service_peaks(lengths: list[float],
                                                                                peak_h: float | None) -> None:
    peak = GittinsTable.of(lengths).mrl_peak
    assert (peak is None) if peak_h is None else peak == pytest.approx(peak_h * HOUR, rel=0.2)


def test_the_measured_buckets_without_las_slices_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="fifo_after_measured .* las_slices"):
        PolicyConfig(las_slices=False, fifo_after_measured=True)
    # gittins_slices (a default) refines las_slices's order: without it, round-robin as asked.
    assert PolicyConfig(las_slices=False).gittins_slices


def test_measured_and_fixed_bucket_boundaries_together_are_refused() -> None:
    with pytest.raises(ValueError, match="fifo_after_measured .* fifo_after_s .* set one"):
        PolicyConfig(fifo_after_measured=True, fifo_after_s=3600.0)


@pytest.mark.parametrize("lengths", [light(1000), heavy(1000)], ids=["light", "heavy"])
def test_without_jobs_present_the_censored_estimate_is_the_plain_one(lengths: list[float]) -> None:
    plain, censored = GittinsTable.of(lengths), GittinsTable.censored(lengths, [])
    assert censored.grid == plain.grid and censored.end == plain.end and censored.mrl_peak == plain.mrl_peak
    assert censored.index == pytest.approx(plain.index, rel=1e-9)


def test_jobs_still_running_extend_the_index_past_the_short_ones_that_left() -> None:
    """gittins_censored: early in a light-tailed trace (jobs of 5-7 hours) the 100 jobs that
    have left were mostly the shortest; 300 still run, at 3-8 hours. From departures alone
    the index ends near 6 h (fewer than 20 left later), so a job at 6.5 h has none and waits
    behind every job with one; with the running jobs counted, censored where they are, the
    estimate reaches the last departure (7 h) and that job has an index."""
    left = light(1000)[:90] + light(1000)[-10:]
    running = [3 * HOUR + 5 * HOUR * (i + 0.5) / 300 for i in range(300)]
    plain = GittinsTable.of(left)
    censored = GittinsTable.censored(left, running)
    assert plain.end < 6.5 * HOUR and plain.at(6.5 * HOUR) is None
    assert 6.5 * HOUR < censored.end and censored.at(6.5 * HOUR) > 0
    # Past the last departure the estimate says nothing, however many jobs run there.
    assert censored.at(7.5 * HOUR) is None


def test_the_history_keeps_an_even_bounded_sample_of_the_departures_before_the_window() -> None:
    """gittins_history: after 5,000 departures the window holds the latest 1,000; the history
    keeps at most 1,000 of all 5,000, every 8th (0, 8, 16, ...), and of those the ones
    before the window (numbers 0-3,999: 500) join the table, none of the window's twice."""
    window = ServiceWindow()
    for i in range(5000):
        window.add(float(i), history=True)
    assert len(window.samples) == WINDOW and len(window.history) <= HISTORY
    assert window.stride == 8 and [n for n, _ in window.history[:3]] == [0, 8, 16]
    older = window.older()
    assert older == [float(n) for n in range(0, 4000, 8)]


def _decide_after_two_waves(mk, history: bool, old_s: float = 5.5 * HOUR, new_s: float = 2 * HOUR):
    """A one-GPU group on s0: ``old`` (``old_s`` of service, running) and ``new`` (``new_s``,
    suspended). 1,000 light-tailed jobs (5-7 hours) run at 30 s and are gone at 45 s, then a
    burst of 1,000 five-minute jobs, gone at 61 s: the window of the latest 1,000 departures
    holds only the burst.
    Returns the decisions at the slice's end (61 s)."""
    srv = (ServerView("s0", 1), ServerView("s1", 1000))
    config = dataclasses.replace(GITTINS, gittins_history=history)

    def group(now: float):
        return (mk.job("old", state="RUNNING", placement=mk.on("s0", 0), attained_service_s=old_s + now,
                       reported_at=now, submitted_at=0.0, last_state_change_at=0.0),
                mk.job("new", state="SUSPENDED", placement=mk.on("s0", 0), attained_service_s=new_s,
                       submitted_at=10.0, last_state_change_at=0.0))

    def wave(name: str, lengths: list[float], now: float):
        return [mk.job(f"{name}{i}", state="RUNNING", placement=mk.on("s1", i), attained_service_s=s,
                       reported_at=now, submitted_at=0.0, last_state_change_at=0.0)
                for i, s in enumerate(lengths)]

    policy = get_policy("gandiva", config)
    assert policy.decide(mk.snap(30.0, srv, *group(30.0), *wave("long", light(1000), 30.0))) == []
    assert policy.decide(mk.snap(45.0, srv, *group(45.0), *wave("burst", [300.0] * 1000, 45.0))) == []
    return policy.decide(mk.snap(61.0, srv, *group(61.0)))


def test_with_the_history_a_burst_of_short_jobs_does_not_erase_what_the_long_ones_told(mk) -> None:
    """Without the history the window (the burst alone) says nothing past a few minutes: both
    jobs are past its end and the less-served ``new`` runs next (least attained service).
    With it, the long jobs that left before the burst still count (5-7 hours): ``old``, at
    5.5 h, is nearer its end than ``new`` at 2 h and keeps the GPU."""
    assert mk.kinds(_decide_after_two_waves(mk, history=False)) == [("Suspend", "old"), ("Resume", "new")]
    assert _decide_after_two_waves(mk, history=True) == []


def test_the_refinements_without_gittins_slices_are_refused() -> None:
    for name in ("gittins_censored", "gittins_tail_fifo", "gittins_history"):
        with pytest.raises(ValueError, match=f"{name} .* turn gittins_slices on too"):
            PolicyConfig(gittins_slices=False, **{name: True})
