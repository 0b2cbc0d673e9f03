"""The held-out evaluation (``benchmarks/sim_heldout.py``) and the generator shapes it replays:
workloads the policy's rules were not measured on."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from scheduler.sim.generator import GPU_MIX, generate

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def heldout(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the benchmarks import their neighbours by name
    return importlib.import_module("sim_heldout")


def test_generator_defaults_draw_what_they_drew_before_the_shapes() -> None:
    # Written down from the generator before burst_max, gpu_mix and duration_sigma existed:
    # every figure measured on generated workloads stays reproducible.
    jobs = generate(4, seed=3)
    assert [(j.submit_time, j.num_gpus, j.model, j.duration_s) for j in jobs] == [
        (16.306, 1, "resnet50", 1129.0), (125.319, 1, "rhn", 1124.2), (172.038, 4, "vae", 2023.4),
        (201.689, 1, "lstm", 5019.7)]
    assert generate(500, seed=1, gpu_mix=GPU_MIX, duration_sigma=1.8, burst_max=1) == generate(500, seed=1)


def test_generator_shapes_are_what_they_say_and_the_same_seed_gives_the_same_workload() -> None:
    bursty = generate(2000, seed=0, burst_max=20, multi_job_prob=0.0)
    per_instant = Counter(j.submit_time for j in bursty)
    assert max(per_instant.values()) >= 15 and len(per_instant) < 2000 / 5  # bursts, ~10 jobs each
    assert bursty == generate(2000, seed=0, burst_max=20, multi_job_prob=0.0)
    large = generate(2000, seed=0, gpu_mix=((1, 0.2), (8, 0.8)), multi_job_prob=0.0)
    assert 0.75 < sum(j.num_gpus == 8 for j in large) / len(large) < 0.85
    plain = sorted(j.duration_s or 0 for j in generate(2000, seed=0, multi_job_prob=0.0))
    heavy = sorted(j.duration_s or 0 for j in generate(2000, seed=0, multi_job_prob=0.0, duration_sigma=2.5))
    assert heavy[-200] > 2 * plain[-200]  # the top decile's edge lies further out


@pytest.mark.parametrize("kwargs, words", [({"burst_max": 0}, "burst_max"), ({"duration_sigma": -1}, "sigma"),
                                           ({"gpu_mix": ((0, 1.0),)}, "gpu_mix"), ({"gpu_mix": ()}, "gpu_mix")])
def test_generator_refuses_a_shape_it_cannot_draw(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        generate(10, **kwargs)


def test_halves_are_two_periods_that_together_are_the_trace(heldout: ModuleType) -> None:
    jobs = generate(101, seed=2)
    first, second = heldout.halves(list(reversed(jobs)))
    assert len(first) == 51 and len(second) == 50
    assert max(j.submit_time for j in first) <= min(j.submit_time for j in second)
    assert sorted(first + second, key=lambda j: j.id) == sorted(jobs, key=lambda j: j.id)


def test_other_traces_are_those_the_evaluation_set_leaves_out(tmp_path: Path, heldout: ModuleType) -> None:
    msr = tmp_path / "gavel" / "traces" / "msr" / "seed=0"
    msr.mkdir(parents=True)
    line = "ResNet-18 (batch size 64)\tcmd\t--num_steps\t1\t1000\t0\t1\n"
    (msr / "big.trace").write_text(line * 5)
    (msr / "small.trace").write_text(line * 2)
    (tmp_path / "gavel" / "traces" / "physical_cluster").mkdir()
    (tmp_path / "gavel" / "traces" / "physical_cluster" / "p.trace").write_text("x\n")
    (tmp_path / "tiresias").mkdir()
    (tmp_path / "tiresias" / "60_job.csv").write_text("x\n")
    names = [p.name for p in heldout.other_traces(tmp_path, min_jobs=5)]
    assert names == ["small.trace", "p.trace", "60_job.csv"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/sim_heldout.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_batch_trace_is_replayed_as_given_the_same_twice_and_resumed(tmp_path: Path) -> None:
    # Gavel's physical_cluster traces submit every job at once: no load can be scaled, and
    # sim_table.py refuses them; the held-out run replays them with their arrivals as given.
    trace = tmp_path / "batch.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration\n" + "".join(
        f"{i},0,{1 + i % 2},{600 + 300 * i}\n" for i in range(16)))
    runs = tmp_path / "runs"
    runs.mkdir()
    first = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--resume", str(runs),
                 "--json", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stderr
    row = next(line for line in first.stdout.splitlines() if line.startswith("| batch |"))
    assert "| 16 | as given |" in row and "1/1 done" in row
    assert "| given: the --trace files | 2x4 | 0.9 | 1 |" in first.stdout
    again = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--json", str(tmp_path / "b.json"))
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    # A rule measured held-out: gandiva alone is replayed with it, the baselines read back from
    # the defaults' folder as they were; the defaults' results are not reused for the rule.
    rule = tmp_path / "rule"
    rule.mkdir()
    ruled = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--baselines", str(runs),
                 "--config", "max_jobs_per_gpu:1+probe_slices:false", "--resume", str(runs),
                 "--json", str(tmp_path / "r.json"))
    assert ruled.returncode == 0, ruled.stderr
    assert "read back" not in ruled.stdout and (runs / "given[max_jobs_per_gpu:1+probe_slices:false].json").is_file()
    r = json.loads((tmp_path / "r.json").read_text())["given"]["traces"]["batch"]
    base = a["given"]["traces"]["batch"]
    assert r["gandiva_rules"] == "max_jobs_per_gpu:1+probe_slices:false" and "gandiva_rules" not in base
    assert all(r[p] == base[p] for p in ("yarn-cs", "tiresias", "yarn-cs-local"))
    assert r["gandiva"]["suspends"] == 0 < base["gandiva"]["suspends"]  # no time-slicing under the rule
    none = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--baselines", str(rule))
    assert none.returncode == 2 and "no given.json entry for batch" in none.stderr
    for p in ("gandiva", "yarn-cs", "tiresias", "yarn-cs-local"):  # the same output, but for CPU seconds
        a["given"]["traces"]["batch"][p].pop("cpu_s")
        b["given"]["traces"]["batch"][p].pop("cpu_s")
    assert a == b
    resumed = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--resume", str(runs))
    assert "1 read back from" in resumed.stdout and row.split("<!--")[0] in resumed.stdout
    left = _run("--variants", "given", "--trace", str(trace), "--cluster", "2x4", "--leave-out", "batch")
    assert left.returncode == 0 and "0 traces; left out: batch" in left.stdout and "| batch |" not in left.stdout
    compared = _run("--compare", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}")
    assert compared.returncode == 0, compared.stderr
    assert "### given" in compared.stdout and "| batch |" in compared.stdout


def test_a_variant_that_does_not_exist_is_refused_before_any_replay() -> None:
    out = _run("--variants", "load0.5")
    assert out.returncode == 2 and "no variant load0.5" in out.stderr and "load0.7" in out.stderr
