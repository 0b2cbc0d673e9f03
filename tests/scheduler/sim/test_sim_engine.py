"""The simulator replays workloads through the real policies with the documented mechanism costs."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from scheduler.policy import (
    ClusterSnapshot,
    Decision,
    GpuRef,
    JobView,
    Policy,
    PolicyConfig,
    get_policy,
)
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import makespan_bound, offered_load, scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec, read_trace

MODEL = MechanismModel.default()


def _run(jobs: list[JobSpec], cluster: str, policy: str | Policy, **kw: object) -> dict:
    p = get_policy(policy) if isinstance(policy, str) else policy
    return summarize(Simulator(jobs, make_cluster(cluster), p, MODEL, **kw).run())  # type: ignore[arg-type]


def _jct(jobs: list[JobSpec], cluster: str, policy: str) -> dict[str, float]:
    result = Simulator(jobs, make_cluster(cluster), get_policy(policy), MODEL).run()
    return {j.spec.id: j.finished_at - j.spec.submit_time for j in result.jobs}


@pytest.mark.parametrize("policy", ["gandiva", "fifo", "yarn-cs", "tiresias"])
def test_a_lone_job_takes_exactly_its_duration(policy: str) -> None:
    m = _run([JobSpec("a", 0.0, 2, "resnet50", duration_s=600)], "1x4", policy)
    assert m["avg_jct_s"] == pytest.approx(600, abs=1e-6)
    assert m["jobs_finished"] == 1 and m["utilization"] == pytest.approx(0.5)


def test_time_slicing_lets_a_short_job_finish_before_a_long_one() -> None:
    jobs = [JobSpec("long", 0.0, 1, "resnet50", duration_s=3600),
            JobSpec("short", 10.0, 1, "resnet50", duration_s=600)]
    fifo, gandiva = _jct(jobs, "1x1", "fifo"), _jct(jobs, "1x1", "gandiva")
    assert fifo["short"] == pytest.approx(3600 - 10 + 600)
    assert gandiva["short"] < 1300  # it shares the GPU in 60 s slices instead of waiting
    # Both finish; the suspend/resume round trips cost the long job only seconds.
    assert gandiva["long"] == pytest.approx(4200 - 0, abs=60)


def test_tiresias_preemption_pays_the_restart_cost() -> None:
    jobs = [JobSpec("hog", 0.0, 1, "resnet50", duration_s=20000),
            JobSpec("new", 10000.0, 1, "resnet50", duration_s=100)]
    jct = _jct(jobs, "1x1", "tiresias")
    assert jct["new"] == pytest.approx(100, abs=1e-6)
    assert jct["hog"] == pytest.approx(20000 + 100 + MODEL.costs.restart_s, abs=1e-6)


def test_compatible_jobs_stay_packed_and_incompatible_ones_are_unpacked() -> None:
    config = PolicyConfig(pack_trial_s=60)
    for model, kept in (("vae", True), ("lstm", False)):
        jobs = [JobSpec(f"{model}{i}", 0.0, 1, model, duration_s=3000) for i in range(2)]
        m = _run(jobs, "1x1", get_policy("gandiva", config))
        assert m["packs"] >= 1
        assert (m["unpacks"] == 0) is kept, model


def test_departure_triggers_a_migration_onto_the_freed_gpu() -> None:
    # a and b time-share server-0 while short runs on server-1; when short leaves,
    # one of them moves over instead of waiting for its turn.
    jobs = [JobSpec("a", 0.0, 1, "resnet50", duration_s=5000),
            JobSpec("short", 1.0, 1, "resnet50", duration_s=300),
            JobSpec("b", 2.0, 1, "resnet50", duration_s=5000)]
    m = _run(jobs, "2x1", "gandiva")
    assert m["migrations"] == 1 and m["jobs_finished"] == 3
    assert m["makespan_s"] < 5600  # without the move both would need ~10,000 s of GPU 0


class CheckedGandiva(Policy):
    """Gandiva, asserting on every snapshot what the cluster must never show."""

    name = "gandiva"

    def __init__(self) -> None:
        super().__init__()
        self.inner = get_policy("gandiva")
        self.calls = 0

    def next_wakeup(self) -> float | None:
        return self.inner.next_wakeup()

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        self.calls += 1
        running = Counter(g for j in snapshot.jobs if j.state == "RUNNING" for g in j.placement)
        assert max(running.values(), default=0) <= 2, "more than two jobs packed on a GPU"
        bound = Counter(g for j in snapshot.jobs for g in j.placement)
        assert max(bound.values(), default=0) <= PolicyConfig().max_jobs_per_gpu
        assert all(not j.placement for j in snapshot.jobs if j.state == "QUEUED")
        return self.inner.decide(snapshot)


def test_generated_workload_runs_to_completion_without_breaking_invariants() -> None:
    jobs = generate(150, seed=3, mean_interarrival_s=30, median_duration_s=600, max_gpus=8)
    policy = CheckedGandiva()
    m = _run(jobs, "4x4", policy)
    assert m["jobs_finished"] == 150 and m["jobs_unfinished"] == 0 and policy.calls > 150
    assert m["suspends"] > 0 and 0 < m["utilization"] <= 1


def test_same_seed_same_result_and_another_seed_differs() -> None:
    def once(seed: int) -> dict:
        return _run(generate(80, seed=seed, mean_interarrival_s=60, median_duration_s=600), "2x4",
                    "gandiva")
    assert once(1) == once(1)
    assert once(1) != once(2)


def test_target_load_scales_arrivals_to_the_requested_load() -> None:
    servers = make_cluster("4x4")
    jobs = generate(200, seed=0)
    scaled, factor = scale_to_load(jobs, servers, MODEL, 0.9)
    assert offered_load(scaled, servers, MODEL) == pytest.approx(0.9)
    assert factor == pytest.approx(offered_load(jobs, servers, MODEL) / 0.9)
    with pytest.raises(ValueError, match="positive"):
        scale_to_load(jobs, servers, MODEL, 0)


def test_jobs_larger_than_the_cluster_are_skipped_and_counted() -> None:
    m = _run([JobSpec("huge", 0.0, 64, duration_s=60), JobSpec("ok", 0.0, 1, duration_s=60)],
             "1x4", "yarn-cs")
    assert m["jobs_skipped"] == 1 and m["jobs_finished"] == 1


@pytest.mark.parametrize("policy", ["gandiva", "fifo", "yarn-cs", "tiresias", "yarn-cs-local"])
def test_a_first_arrival_left_unfinished_still_starts_the_makespan(policy: str) -> None:
    """The makespan ran from the first *finished* job's arrival: with the first arrival left
    unfinished (a 2-GPU job spread over 1-GPU servers at a spread factor of 0 never moves) it
    was 100 s, not 105 s, and utilization came out above 1 (1.07; 24 under tiresias). Now it
    runs from the first arrival of the jobs the replay ran (not the skipped one), as the
    makespan lower bound does, and --jobs-csv's rows give the same span."""
    from scheduler.sim.metrics import job_rows, utilization_series

    model = MechanismModel.default()
    model.fix_spread(0.0)
    jobs = [JobSpec("huge", 0.0, 8, duration_s=60), JobSpec("stuck", 5.0, 2, duration_s=100),
            JobSpec("b", 10.0, 1, duration_s=100)]
    result = Simulator(jobs, make_cluster("3x1"), get_policy(policy), model).run()
    m = summarize(result)
    assert (m["jobs_finished"], result.unfinished, result.skipped) == (1, ["stuck"], ["huge"])
    assert m["makespan_s"] == pytest.approx(110.0 - 5.0)
    assert 0.0 < m["utilization"] <= 1.0
    ys = utilization_series(result)[1]
    assert sum(ys) / len(ys) == pytest.approx(m["utilization"])  # utilization.png's mean
    rows = [r for r in job_rows(result, jobs, 100) if r["status"] in ("finished", "unfinished")]
    assert max(r["finished_s"] or 0.0 for r in rows) - min(r["submit_s"] for r in rows) == m["makespan_s"]


def test_generator_is_deterministic_and_philly_like() -> None:
    a, b = generate(2000, seed=7), generate(2000, seed=7)
    assert a == b and len(a) == 2000
    sizes = Counter(j.num_gpus for j in a)
    assert sizes[1] > 0.6 * len(a) and sizes[8] > 0 and sizes[4] > 0
    assert any(j.multi_job for j in a)
    durations = sorted(j.duration_s or 0 for j in a)
    assert durations[len(a) // 2] < durations[-1] / 20  # a heavy tail


@pytest.mark.parametrize(("spec", "message"), [("25", "SERVERSxGPUS"), ("0x4", "at least one")])
def test_bad_cluster_spec_is_explained(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_cluster(spec)


def test_utilization_series_stays_within_zero_and_one() -> None:
    from scheduler.sim.metrics import utilization_series

    jobs = generate(120, seed=5, mean_interarrival_s=60, median_duration_s=900, max_gpus=8)
    result = Simulator(jobs, make_cluster("4x4"), get_policy("gandiva"), MODEL).run()
    xs, ys = utilization_series(result)
    assert len(xs) == 200 and all(0.0 <= y <= 1.0 + 1e-9 for y in ys)
    # The series integrates to the same busy GPU-time as the summary.
    span = (result.busy_series[-1][0] - result.busy_series[0][0]) / 200
    assert sum(ys) * span * result.num_gpus == pytest.approx(result.busy_gpu_s, rel=1e-6)


def test_a_job_larger_than_a_server_sets_the_bound_at_its_spread_rate() -> None:
    jobs = [JobSpec("small", 0.0, 1, "resnet50", duration_s=7200),
            JobSpec("big", 100.0, 8, "lstm", duration_s=3600)]
    servers = make_cluster("3x4")
    bound, critical = makespan_bound(jobs, servers, MODEL)
    # 8 GPUs on 4-GPU servers always span two: its hour takes 1 / spread hours.
    assert critical is not None and critical.id == "big"
    assert bound == pytest.approx(100 + 3600 / MODEL.spread("lstm", 8))
    for policy in ("gandiva", "yarn-cs"):
        assert _run(jobs, "3x4", policy)["makespan_s"] == pytest.approx(bound, rel=1e-3)


@pytest.mark.parametrize("policy", ["gandiva", "fifo", "yarn-cs", "tiresias"])
def test_no_policy_beats_the_makespan_bound(policy: str) -> None:
    jobs, _ = scale_to_load(generate(150, seed=3), make_cluster("4x4"), MODEL, 1.2)
    bound, _ = makespan_bound(jobs, make_cluster("4x4"), MODEL)
    m = _run(jobs, "4x4", policy)
    assert m["jobs_finished"] == 150
    assert m["makespan_s"] >= bound * (1 - 1e-9)


def test_the_observer_sees_every_event_and_its_busy_time_adds_up() -> None:
    jobs, _ = scale_to_load(generate(60, seed=5), make_cluster("2x4"), MODEL, 1.0)
    seen: list[tuple[float, int]] = []

    def observe(now: float, active: dict) -> None:
        busy = {g for j in active.values() if j.state == "RUNNING" for g in j.placement}
        seen.append((now, len(busy)))

    result = Simulator(jobs, make_cluster("2x4"), get_policy("gandiva"), MODEL, observer=observe).run()
    assert len(seen) == result.decide_calls
    area = sum(busy * (t1 - t0) for (t0, busy), (t1, _) in itertools.pairwise(seen))
    assert area == pytest.approx(result.busy_gpu_s, rel=1e-9)


@pytest.mark.parametrize("policy", ["gandiva", "tiresias", "yarn-cs"])
def test_an_observer_that_follows_only_the_changed_jobs_sees_what_a_full_scan_sees(policy: str) -> None:
    """``Simulator.changed`` names every job whose state or placement an event changed, so an
    observer keeping its own copy from those alone (as benchmarks/sim_breakdown.py does)
    agrees with the simulator after every event."""
    servers = make_cluster("2x4")
    jobs, _ = scale_to_load(generate(80, seed=7, max_gpus=4, median_duration_s=1800), servers, MODEL, 1.5)
    kept: dict[str, tuple[str, tuple]] = {}
    checks: list[int] = []

    def observe(now: float, active: dict) -> None:
        for jid in sim.changed:
            job = active.get(jid)
            if job is None:
                kept.pop(jid, None)
            else:
                kept[jid] = (job.state, job.placement)
        assert kept == {jid: (j.state, j.placement) for jid, j in active.items()}, now
        checks.append(len(sim.changed))
        sizes.append(len(active))

    sizes: list[int] = []
    sim = Simulator(jobs, servers, get_policy(policy), MODEL, observer=observe)
    result = sim.run()
    assert len(checks) == result.decide_calls and not result.unfinished
    if policy != "yarn-cs":  # jobs were preempted too, not only started and finished
        assert result.counts["suspends"] > 0
    # An event names a few jobs, not every active one (the queue is long at load 1.5).
    assert sum(checks) < 0.5 * sum(sizes)


@pytest.mark.parametrize("fails", [False, True])
def test_a_simulation_leaves_the_callers_policy_config_as_it_was(fails: bool) -> None:
    """The simulator turns Queue reasons off only while it runs, also when the policy fails,
    so a policy object used for a replay still explains queued jobs afterwards."""
    jobs = [JobSpec(f"j{i}", submit_time=float(i), num_gpus=4, duration_s=600.0, model="resnet50")
            for i in range(3)]
    config = PolicyConfig()
    seen: list[bool] = []

    class Watching(Policy):
        name = "yarn-cs"

        def __init__(self) -> None:
            super().__init__(config)
            self.inner = get_policy("yarn-cs", config)

        def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
            seen.append(self.config.queue_reasons)
            if fails and len(seen) == 2:
                raise RuntimeError("policy broke")
            self.inner.config = self.config
            return self.inner.decide(snapshot)

    policy = Watching()
    sim = Simulator(jobs, make_cluster("1x4"), policy, MODEL)
    assert policy.config is config
    if fails:
        with pytest.raises(RuntimeError, match="policy broke"):
            sim.run()
    else:
        assert len(sim.run().jobs) == 3
    assert policy.config is config and config.queue_reasons
    assert seen and not any(seen)
    # The same policy object, used live afterwards, says why a job waits.
    servers = make_cluster("1x4")
    busy = JobView("busy", 4, state="RUNNING", placement=tuple(GpuRef(servers[0].name, i) for i in range(4)))
    out = policy.decide(ClusterSnapshot(0.0, servers, (busy, JobView("waits", 4))))
    assert [(type(d).__name__, d.job_id) for d in out] == [("Queue", "waits")] and out[0].reason


def test_jobs_submitted_at_the_same_second_start_in_the_traces_order(tmp_path: Path) -> None:
    """Twelve jobs at t=0 on one GPU: first come, first served means the trace's row order.
    Ties of submit time used to be broken by job id as text, so t-10 and t-11 ran before
    t-2 (ITP cluster07 has 4,843 jobs sharing a second with another)."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(f"0,1,{100 * (12 - i)}\n" for i in range(12)))
    for name in ("fifo", "yarn-cs", "tiresias", "gandiva"):
        result = Simulator(read_trace(trace), make_cluster("1x1"), get_policy(name, PolicyConfig()),
                           MechanismModel.default()).run()
        order = [j.spec.id for j in sorted(result.jobs, key=lambda j: (j.first_run_at, j.spec.id))]
        # Gandiva starts each newcomer at once (the one before it suspended): the last of a
        # burst runs first, then the rest take their turns in the trace's order.
        expected = [f"t-{i}" for i in range(12)]
        assert order == (expected[-1:] + expected[:-1] if name == "gandiva" else expected), name
        if name in ("fifo", "yarn-cs"):
            # Each runs alone to its end, in row order: JCTs are the running sums of
            # 1200, 1100, ..., 100 s.
            assert sum(j.finished_at for j in result.jobs) == 65000, name
