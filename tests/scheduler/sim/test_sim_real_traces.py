"""Every file under ../shared/traces, replayed through `gandiva sim` as a user would give it.

The directory is walked, not listed: a trace added there later is replayed too. Each trace is read
whole (every line of it must load), then a window of its middle (20 jobs, at the arrival times
they have there, up to months into the trace) is replayed under every policy on servers of 4 GPUs
(the ITP traces' 8-GPU jobs run spread); every job must end, or be counted skipped (wider than the
cluster) or left out (--skip-invalid: a rate of 0 in the K80 table). Gavel's traces replay under
each GPU type of its co-location table in turn, so every type of the table loads and replays.
Files that are not traces (a cluster description, a throughput table, a licence) are refused in one
line that names the file, exit 2. Skips when the traces are absent (they are never committed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gandiva_cli.main import main
from scheduler.policy import POLICIES
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import read_trace

TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "traces").resolve()
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not present at {TRACES}")
TABLE = TRACES / "gavel" / "simulation_throughputs.json"
WINDOW = 20
# What is there beside the traces: refused as a trace, each in one line naming the file.
NOT_TRACES = ("LICENSE", "README.md", "n32g4.csv", "cluster_specs.json", "cluster_specs_heterogeneous.json",
              "simulation_throughputs.json")


def _files() -> list[Path]:
    return sorted(p for p in TRACES.rglob("*") if p.is_file()) if TRACES.is_dir() else []


def _gpu_types() -> list[str]:
    return sorted(k for k in json.loads(TABLE.read_text()) if not k.endswith("_unconsolidated"))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("path", [p for p in _files() if p.name not in NOT_TRACES],
                         ids=lambda p: str(p.relative_to(TRACES)))
def test_every_trace_loads_and_a_window_replays_under_every_policy(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path, path: Path) -> None:
    jobs = read_trace(path)
    assert jobs, path
    lines = path.read_text().splitlines(keepends=True)
    head = lines[:1] if path.suffix == ".csv" else []  # (Gavel's .trace has no header)
    body = lines[len(head):]
    middle = max(0, len(body) // 2 - WINDOW // 2)
    window = body[middle:middle + WINDOW]
    small = tmp_path / path.name
    small.write_text("".join(head + window))
    argv = ["--trace", str(small), "--cluster", "3x4", "--compare", ",".join(POLICIES), "-o", "json",
            "--skip-invalid"]
    if "gavel" in path.parts:
        types = _gpu_types()
        argv += ["--throughputs", str(TABLE), "--gpu-type", types[sum(map(ord, path.name)) % len(types)]]
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    result = json.loads(out)
    assert sorted(result) == sorted(POLICIES)
    for name, r in result.items():
        assert r["jobs_unfinished"] == 0, (name, r)
        assert r["jobs_finished"] + r["jobs_skipped"] + r.get("jobs_left_out", 0) == len(window), (name, r)
        assert r["jobs_finished"] > 0 and r["avg_jct_s"] > 0, (name, r)


def test_every_gpu_type_of_the_co_location_table_loads() -> None:
    """Gavel's table: each GPU type loads (its packed pairs and spread ratios checked) and gives a
    rate to every job type of the msr traces, packed rates at most the rates alone."""
    names = {j.model for p in (TRACES / "gavel" / "traces" / "msr").rglob("*.trace") for j in read_trace(p)}
    for gpu_type in _gpu_types():
        model = MechanismModel.from_gavel(TABLE, gpu_type)
        assert model.gavel is not None and all(model.knows(n) for n in names), gpu_type
        for (name, k), row in model.gavel.items():
            assert all(pair[0] <= row["null"] for other, pair in row.items() if other != "null"), (gpu_type, name, k)
        assert model.gavel_spread and all(0.01 <= f for f in model.gavel_spread.values()), gpu_type


@pytest.mark.parametrize("path", [p for p in _files() if p.name in NOT_TRACES],
                         ids=lambda p: str(p.relative_to(TRACES)))
def test_what_is_not_a_trace_is_refused_in_one_line(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, out, err = _run(capsys, "--trace", str(path), "--cluster", "3x4", "--policy", "fifo", "-o", "json")
    assert code == 2 and out == "" and "Traceback" not in err
    assert str(path) in err and len(err.strip().splitlines()) == 1, err
