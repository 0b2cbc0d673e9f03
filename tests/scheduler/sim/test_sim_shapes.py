"""Valid but unusual workloads and clusters, through every policy.

What must hold for any input: no server runs more jobs on a GPU than the policy allows, every
job that fits the cluster finishes exactly once, no job finishes sooner than it can alone,
the GPU-seconds of service add up to the busy time, virtual time never goes back, the same
input gives the same result, and the summary agrees with the per-job times.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gandiva_cli.main import main
from scheduler.policy import POLICIES, GpuRef, PolicyConfig, get_policy
from scheduler.sim.backend import SimJob
from scheduler.sim.engine import SimResult, Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import (
    duration_alone,
    fastest_run_s,
    makespan_bound,
    offered_load,
    scale_to_load,
)
from scheduler.sim.metrics import summarize, utilization_series
from scheduler.sim.model import DEFAULT_MODELS, MechanismModel
from scheduler.sim.trace import JobSpec, TraceError, read_trace

MODEL = MechanismModel.default()


def test_target_load_is_the_load_of_the_jobs_replayed() -> None:
    """--target-load counted the work of jobs larger than the whole cluster, which the replay
    skips: ITP cluster02 on 8x4 (14 jobs of 64 GPUs) was replayed at load 0.75 for 0.9."""
    servers = make_cluster("2x4")
    jobs = generate(60, seed=1, max_gpus=8) + [JobSpec("wide", 500.0, 16, "resnet50", duration_s=7 * 86400)]
    scaled, _ = scale_to_load(jobs, servers, MODEL, 0.9)
    runs = [j for j in scaled if j.num_gpus <= 8]
    span = max(j.submit_time for j in runs) - min(j.submit_time for j in runs)
    demand = sum(j.num_gpus * (j.duration_s or 0.0) for j in runs)
    assert len(runs) == 60 and abs(demand / (8 * span) - 0.9) < 1e-9
    assert abs(offered_load(scaled, servers, MODEL) - 0.9) < 1e-9


def test_the_utilization_plot_starts_at_the_first_arrival() -> None:
    """The series began at virtual time 0: a trace whose first job arrives at 1e7 s (ITP
    cluster10's first arrives after 630 h) was plotted as idle GPUs for the first 99% of its
    x axis, and the plot's mean was not the table's utilization."""
    jobs = [JobSpec("a", 1e7, 2, "resnet50", duration_s=3600), JobSpec("b", 1e7 + 1800, 4, "vae", duration_s=3600)]
    result = Simulator(jobs, make_cluster("1x8"), get_policy("yarn-cs"), MODEL).run()
    xs, ys = utilization_series(result)
    assert 0 < xs[0] < xs[-1] < 1.5  # hours since the first arrival: the makespan is 1.5 h
    assert ys[0] == 0.25 and ys[-1] == 0.5  # busy from the first bucket on: 2 of 8 GPUs, then 4
    assert sum(ys) / len(ys) == pytest.approx(summarize(result)["utilization"], rel=1e-9)


# --- invariants over generated workloads and clusters, through every policy -----------------

CLUSTERS = ("1x1", "1x8", "64x1", "3x5", "2x3", "4x4", "200x8")
SIZES = (1, 1, 1, 2, 3, 4, 5, 7, 8, 12, 16)  # not only powers of two: Philly and ITP have 3, 12, 24
# Up to a day here; a year (the longest job a trace may have) in its own test below: a job
# waiting behind it wakes gandiva at its defragmentation pace for the whole year.
LENGTHS = (1.0, 59.0, 600.0, 3600.0, 86400.0)
YEAR = 365 * 86400.0
OFFSETS = (0.0, 0.0, 1.0, 30.0, 600.0, 7200.0)


@st.composite
def workloads(draw: st.DrawFn) -> list[JobSpec]:
    """Up to 12 jobs: all at once or apart, from t=0 or t=1e7, not in submit order, of any
    size up to 16 GPUs, from 1 s to a day, known and unknown models."""
    start = draw(st.sampled_from((0.0, 1e7)))
    at_once = draw(st.booleans())
    return [JobSpec(f"u{k % 3}/{k}", start if at_once else start + draw(st.sampled_from(OFFSETS)) * draw(
                        st.integers(0, 4)),
                    draw(st.sampled_from(SIZES)), draw(st.sampled_from((*sorted(DEFAULT_MODELS), "unknown"))),
                    duration_s=draw(st.sampled_from(LENGTHS)))
            for k in range(draw(st.integers(1, 12)))]


# Gandiva's rule sets besides the defaults: the paper's time-slicing, no probes, whole servers
# gathered for large jobs, or held for their first turns, service buckets with a starvation
# limit, blocks, one job per GPU.
RULES = (PolicyConfig(), PolicyConfig(las_slices=False, slice_growth=0, max_jobs_per_gpu=4),
         PolicyConfig(probe_slices=False, balance_sizes=False), PolicyConfig(gather_large=True),
         PolicyConfig(probe_large=True),
         PolicyConfig(fifo_after_s=3600, starve_factor=2, probe_park_last=True),
         PolicyConfig(share_block_after_s=600, large_block_after_s=None), PolicyConfig(max_jobs_per_gpu=1))


def _replay_checked(jobs: list[JobSpec], cluster: str, name: str, config: PolicyConfig) -> SimResult:
    """One replay, asserting at every event what no cluster may show."""
    servers = make_cluster(cluster)
    gpus = {GpuRef(s.name, i) for s in servers for i in range(s.num_gpus)}
    per_gpu = 2 if name == "gandiva" else 1  # only gandiva packs, two jobs at most
    last = [-math.inf]

    def observe(now: float, active: dict[str, SimJob]) -> None:
        assert now >= last[0], f"time went back from {last[0]} to {now}"
        last[0] = now
        running: Counter[GpuRef] = Counter()
        for job in active.values():
            assert set(job.placement) <= gpus and len(set(job.placement)) == len(job.placement)
            if job.state == "RUNNING":
                assert len(job.placement) == job.spec.num_gpus  # nobody grows: none asked to
                running.update(job.placement)
            elif job.state == "QUEUED":
                assert not job.placement
        assert max(running.values(), default=0) <= per_gpu, (name, now, running.most_common(1))

    return Simulator(jobs, servers, get_policy(name, config), MODEL, observer=observe, warn_skipped=False).run()


@settings(max_examples=60, deadline=None)
@given(jobs=workloads(), cluster=st.sampled_from(CLUSTERS), config=st.sampled_from(RULES))
def test_every_policy_keeps_the_invariants_on_any_workload_and_cluster(jobs: list[JobSpec], cluster: str,
                                                                        config: PolicyConfig) -> None:
    _check_every_policy(jobs, cluster, config)


def test_every_policy_keeps_the_invariants_with_a_job_of_a_year() -> None:
    """The longest job a trace may have, beside a 1-second one and jobs of odd sizes, from t=1e7."""
    jobs = [JobSpec("year", 1e7, 1, "lstm", duration_s=YEAR), JobSpec("second", 1e7, 3, "vae", duration_s=1.0),
            JobSpec("day", 1e7 + 60, 5, "resnet50", duration_s=86400.0),
            JobSpec("hour", 1e7 + 30, 1, "lstm", duration_s=3600.0)]
    _check_every_policy(jobs, "3x5", PolicyConfig())


def _check_every_policy(jobs: list[JobSpec], cluster: str, config: PolicyConfig) -> None:
    servers = make_cluster(cluster)
    total = sum(s.num_gpus for s in servers)
    fits = sorted(j.id for j in jobs if j.num_gpus <= total)
    bound, _ = makespan_bound(jobs, servers, MODEL)
    for name in POLICIES:
        result = _replay_checked(jobs, cluster, name, config)
        done = [j.spec.id for j in result.jobs]
        # Every job that fits finishes exactly once; the others are counted as skipped.
        assert sorted(done) == fits and not result.unfinished, name
        assert sorted(result.skipped) == sorted(j.id for j in jobs if j.num_gpus > total)
        service = 0.0
        for job in result.jobs:
            spec, end = job.spec, job.finished_at
            assert end is not None and job.first_run_at is not None and job.first_n_at is not None
            assert spec.submit_time <= job.first_run_at <= job.first_n_at <= end + 1e-6, (name, spec.id)
            # Never sooner than alone, on as few servers as it needs.
            assert end - spec.submit_time >= fastest_run_s(spec, servers, MODEL) * (1 - 1e-9), (name, spec.id)
            attained = job.attained_at(end)
            assert attained >= spec.num_gpus * duration_alone(spec, MODEL) * (1 - 1e-9), (name, spec.id)
            service += attained
        # The GPU-seconds of service are the busy GPU time (twice it at most where two jobs share a GPU).
        assert result.busy_gpu_s <= service * (1 + 1e-9) and service <= (1 if name != "gandiva" else 2) * \
            result.busy_gpu_s * (1 + 1e-9), name
        m = summarize(result)
        assert all(math.isfinite(v) and v >= 0 for v in m.values() if isinstance(v, float)), (name, m)
        jct = [j.finished_at - j.spec.submit_time for j in result.jobs if j.finished_at is not None]
        assert m["jobs_finished"] == len(jct) and m["avg_jct_s"] == pytest.approx(sum(jct) / max(1, len(jct)))
        waits = [j.first_n_at - j.spec.submit_time for j in result.jobs if j.first_n_at is not None]
        queued = [j.first_run_at - j.spec.submit_time for j in result.jobs if j.first_run_at is not None]
        assert m["avg_time_to_first_n_s"] == pytest.approx(sum(waits) / max(1, len(waits)))
        assert m["avg_queueing_delay_s"] == pytest.approx(sum(queued) / max(1, len(queued)))
        first = min((j.spec.submit_time for j in result.jobs), default=0.0)
        assert m["makespan_s"] == pytest.approx(max((j.finished_at or 0.0 for j in result.jobs), default=0.0) - first)
        assert m["makespan_s"] >= bound * (1 - 1e-9) and m["utilization"] <= 1 + 1e-9, name
        again = Simulator(jobs, servers, get_policy(name, config), MODEL, warn_skipped=False).run()
        assert [(j.spec.id, j.finished_at, j.first_n_at) for j in again.jobs] == \
            [(j.spec.id, j.finished_at, j.first_n_at) for j in result.jobs] and summarize(again) == m, name


def test_the_same_inputs_print_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    """Two runs of `gandiva sim` differ only if something iterates in hash order (a set of job
    ids): Python salts string hashes per process, so the in-process checks cannot see it."""
    trace = tmp_path / "odd.csv"
    trace.write_text("submit_time,num_gpus,duration,model\r\n" + "".join(
        f"{(k * 37) % 500},{(1, 3, 5, 2, 1, 12)[k % 6]},{600 + 977 * k % 7200},{sorted(DEFAULT_MODELS)[k % 8]}\r\n"
        for k in range(40)))
    argv = [sys.executable, "-m", "gandiva_cli.main", "sim", "--trace", str(trace), "--cluster", "3x5",
            "--compare", ",".join(POLICIES), "--no-progress", "-o", "json"]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": seed})
            for seed in ("1", "2")]  # side by side
    outs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert outs[0] == outs[1] and json.loads(outs[0])["gandiva"]["jobs_finished"] == 40


def test_a_trace_of_short_jobs_shows_their_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Jobs of seconds printed `0.00 h` in every time row of the table (and as the bound)."""
    trace = tmp_path / "short.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,1\n0,1,2\n5,2,3\n")
    assert main(["sim", "--no-progress", "--trace", str(trace), "--cluster", "1x8", "--policy", "fifo"]) == 0
    out, err = capsys.readouterr()
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert rows["avg JCT"] == "2 s" and rows["makespan"] == "8 s" and rows["p95 JCT"] == "2.9 s", rows
    assert "0.00 h" not in rows["median JCT"] and "makespan lower bound 8 s:" in err


def test_two_users_jobs_of_the_same_id_are_two_jobs(tmp_path: Path) -> None:
    """A cluster export whose job ids count per user (two users' job 1) was refused as a
    repeated id; --skip-invalid dropped the second user's job. The same user's id twice is
    still a repeat."""
    trace = tmp_path / "users.csv"
    trace.write_text("job_id,user,submit_time,num_gpus,duration\n1,alice,0,1,600\n1,bob,10,2,600\n"
                     "2,alice,20,1,60\n1,carol,30,1,60\n")
    assert [(j.id, j.num_gpus) for j in read_trace(trace)] == [
        ("users-1", 1), ("users-1@bob", 2), ("users-2", 1), ("users-1@carol", 1)]
    trace.write_text("job_id,user,submit_time,num_gpus,duration\n1,alice,0,1,600\n1,alice,10,2,600\n")
    with pytest.raises(TraceError, match="users.csv:3: job id '1' is also on line 2"):
        read_trace(trace)


def test_a_policy_named_twice_is_replayed_once(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`--compare gandiva,yarn-cs,gandiva` replayed gandiva twice (hours on a large trace) and
    printed one column of it."""
    replays: list[str] = []
    run = Simulator.run

    def counted(self: Simulator) -> SimResult:
        replays.append(self.policy.name)
        return run(self)

    monkeypatch.setattr(Simulator, "run", counted)
    argv = ["sim", "--no-progress", "--jobs", "20", "--cluster", "2x4", "-o", "json", "--compare", "fifo,yarn-cs,fifo"]
    assert main(argv) == 0
    assert replays == ["fifo", "yarn-cs"] and list(json.loads(capsys.readouterr().out)) == ["fifo", "yarn-cs"]
