"""``benchmarks/sim_table.py --compare``: the per-trace comparison of rule sets that
docs/simulator.md shows, printed from files earlier ``--json`` runs wrote, without replaying."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = {"cluster": "25x4", "target_load": 0.9}


def _entry(jct_h: float, ff: bool, jct: bool, mk: bool, settings: dict = SETTINGS) -> dict:
    return {"settings": settings, "jobs": 10, "gandiva": {"avg_jct_s": jct_h * 3600},
            "goals": {"ff_ok": ff, "jct_ok": jct, "makespan_ok": mk, "ff_ratio": 0.1 if ff else 0.5,
                      "jct_ratio_yarn": 0.5, "jct_ratio_tiresias": 0.9, "makespan_ratio": 1.0 if mk else 1.2}}


def _run(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "benchmarks/sim_table.py", "--compare", ",".join(map(str, files))],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_compare_marks_each_goal_won_or_lost_and_counts_the_goals(tmp_path: Path) -> None:
    base, rule = tmp_path / "defaults.json", tmp_path / "rule.json"
    base.write_text(json.dumps({"a": _entry(10.0, False, True, True), "b": _entry(20.0, True, True, True),
                                "c": _entry(1.0, True, True, True)}))
    rule.write_text(json.dumps({"a": _entry(8.0, True, True, False), "b": _entry(20.0, True, True, True)}))
    out = _run(base, rule)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "| trace | defaults | rule |"
    row_a = next(line for line in lines if line.startswith("| a |"))
    assert "10.0 h" in row_a and "8.0 h" in row_a and "(+ff, -mk)" in row_a
    row_b = next(line for line in lines if line.startswith("| b |"))
    assert "(" not in row_b.split(" | ")[2].split(":")[-1]  # nothing won or lost
    assert "**1 / 2 / 2** of 2 | **2 / 2 / 1** of 2" in out.stdout
    assert "left out (not in every file): c" in out.stdout


def test_compare_refuses_results_replayed_with_different_settings(tmp_path: Path) -> None:
    base, other = tmp_path / "a.json", tmp_path / "b.json"
    base.write_text(json.dumps({"a": _entry(10.0, True, True, True)}))
    other.write_text(json.dumps({"a": _entry(10.0, True, True, True, {"cluster": "8x4", "target_load": 0.9})}))
    out = _run(base, other)
    assert out.returncode == 2 and "a was replayed with different settings" in out.stderr
    out = _run(base, tmp_path / "missing.json")
    assert out.returncode == 2 and "missing.json" in out.stderr


def test_another_clusters_traces_are_read_before_any_replay(tmp_path: Path) -> None:
    """A bad trace under --traces DIR was a traceback (after the traces before it had replayed
    for hours); an --only name that matches no trace replayed nothing without a word."""
    itp = tmp_path / "itp"
    itp.mkdir()
    (itp / "cluster90.csv").write_text("job_id,submission_time,num_gpu,duration\na,0,1,60\na,5,2,60\n")
    (itp / "cluster91.csv").write_text("job_id,submission_time,num_gpu,duration\na,0,1,60\n")
    run = [sys.executable, "benchmarks/sim_table.py", "--traces", str(tmp_path)]
    out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{itp / 'cluster90.csv'}:3: job id 'a' is also on line 2" in out.stderr
    assert "nothing was replayed" in out.stderr and out.stdout == ""
    out = subprocess.run([*run, "--only", "cluster91,cluster99"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2 and "no trace cluster99" in out.stderr and "found: cluster90, cluster91" in out.stderr


def test_a_trace_the_cluster_cannot_replay_stops_the_run_before_any_replay(tmp_path: Path) -> None:
    """On another cluster shape (--cluster 1x8) a trace whose jobs are all wider than it, or
    that has one job, was a traceback from scale_to_load, after the traces before it had
    replayed; a bad --cluster was a traceback too."""
    itp = tmp_path / "itp"
    itp.mkdir()
    (itp / "cluster90.csv").write_text("job_id,submission_time,num_gpu,duration\na,0,1,60\nb,5,2,60\n")
    (itp / "cluster91.csv").write_text("job_id,submission_time,num_gpu,duration\na,0,16,60\nb,5,16,60\n")
    run = [sys.executable, "benchmarks/sim_table.py", "--traces", str(tmp_path), "--cluster", "1x8"]
    out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert f"{itp / 'cluster91.csv'}: no job fits the cluster's 8 GPUs: nothing to replay" in out.stderr
    assert "nothing was replayed" in out.stderr
    out = subprocess.run([*run[:-1], "0x8", "--only", "cluster90"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "needs at least one server" in out.stderr


def test_the_table_replays_compressed_traces_and_any_trace_files_given(tmp_path: Path) -> None:
    """The evaluation set was `itp/cluster*.csv` only: another cluster's export named otherwise
    or compressed (`itp/clusterA.csv.gz`) was silently not in the table, and there was no way to
    put a trace file of one's own in it. Now every `itp/*.csv` (gzip, bzip2, xz too) is in, and
    `--trace FILE` (repeatable) replays the files given instead, named by their stems."""
    itp = tmp_path / "itp"
    itp.mkdir()
    rows = "job_id,submission_time,num_gpu,duration\na,0,1,600\nb,60,2,1200\nc,90,1,600\n"
    (itp / "clusterA.csv.gz").write_bytes(gzip.compress(rows.encode()))
    (itp / "philly-b.csv").write_text(rows)
    out_json = tmp_path / "out.json"
    run = [sys.executable, "benchmarks/sim_table.py", "--traces", str(tmp_path), "--cluster", "1x4"]
    out = subprocess.run([*run, "--json", str(out_json)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    table = json.loads(out_json.read_text())
    assert sorted(table) == ["clusterA", "philly-b"]
    assert table["clusterA"]["yarn-cs"]["jobs_finished"] == 3
    same = [{k: v for k, v in table[t]["yarn-cs"].items() if k != "cpu_s"} for t in ("clusterA", "philly-b")]
    assert same[0] == same[1]  # the same jobs, one file read through gzip
    own = tmp_path / "mine.csv"
    own.write_text(rows)
    out = subprocess.run([sys.executable, "benchmarks/sim_table.py", "--trace", str(own), "--cluster", "1x4",
                          "--traces", str(tmp_path / "none"), "--json", str(out_json)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert list(json.loads(out_json.read_text())) == ["mine"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.csv").write_text(rows)
    out = subprocess.run([sys.executable, "benchmarks/sim_table.py", "--trace", str(own), "--trace",
                          str(tmp_path / "sub" / "mine.csv"), "--cluster", "1x4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "two traces are named mine" in out.stderr and out.stdout == ""
