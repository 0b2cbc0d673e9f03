"""`gandiva sim --jobs-csv FILE`: one row per job and policy, whose rows add up to the
summary's figures, and a job that did not replay says so."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gandiva_cli.main import main
from scheduler.policy import POLICIES

EVERY_POLICY = ",".join(POLICIES)
MS = 5e-4 + 1e-9  # times are written to the millisecond


def _replay(tmp_path: Path, *argv: str) -> tuple[dict[str, dict], list[dict[str, str]]]:
    """The JSON summary and the --jobs-csv rows of one `gandiva sim` run."""
    out = tmp_path / "jobs.csv"
    out.unlink(missing_ok=True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["sim", "--no-progress", "--compare", EVERY_POLICY, "-o", "json", "--jobs-csv", str(out), *argv])
    assert code == 0
    with out.open(newline="") as fh:
        return json.loads(buf.getvalue()), list(csv.DictReader(fh))


def _check_rows_add_up(summaries: dict[str, dict], rows: list[dict[str, str]], jobs: int) -> None:
    assert set(summaries) == set(POLICIES)
    for policy, s in summaries.items():
        mine = [r for r in rows if r["policy"] == policy]
        assert len(mine) == jobs, policy  # every job line once per policy
        done = [r for r in mine if r["status"] == "finished"]
        by_status = {k: sum(r["status"] == k for r in mine) for k in ("finished", "unfinished", "skipped", "left_out")}
        assert by_status == {"finished": s["jobs_finished"], "unfinished": s["jobs_unfinished"],
                             "skipped": s["jobs_skipped"], "left_out": s["jobs_left_out"]}, policy
        jct = [float(r["jct_s"]) for r in done]
        assert all(float(r["finished_s"]) - float(r["submit_s"]) == pytest.approx(float(r["jct_s"]), abs=2e-3)
                   for r in done)
        assert statistics.fmean(jct) == pytest.approx(s["avg_jct_s"], abs=MS), policy
        assert statistics.median(jct) == pytest.approx(s["median_jct_s"], abs=MS), policy
        first = [float(r["time_to_first_100_s"]) for r in done if r["time_to_first_100_s"]]
        assert statistics.fmean(first) == pytest.approx(s["avg_time_to_first_n_s"], abs=MS), policy
        queued = [float(r["queueing_delay_s"]) for r in done]
        assert statistics.fmean(queued) == pytest.approx(s["avg_queueing_delay_s"], abs=MS), policy
        ran = [r for r in mine if r["status"] in ("finished", "unfinished")]  # (from the first arrival replayed)
        makespan = max(float(r["finished_s"]) for r in done) - min(float(r["submit_s"]) for r in ran)
        assert makespan == pytest.approx(s["makespan_s"], abs=2 * MS), policy
        for kind in ("suspends", "migrations", "packs", "unpacks", "parks"):
            assert sum(int(r[kind]) for r in done) == s[kind], (policy, kind)
        for r in done:  # to the millisecond: no float noise such as 73.74600000000001
            assert all(len(r[k].partition(".")[2]) <= 3 for k in ("submit_s", "finished_s", "jct_s", "queueing_delay_s"))
        for r in mine:
            if r["status"] != "finished":
                assert r["note"] and not r["jct_s"] and not r["finished_s"], r  # said so, no times


def test_rows_add_up_to_the_summary_with_skipped_and_left_out_jobs(tmp_path: Path) -> None:
    """A trace with time-sharing (more jobs than GPUs), a job wider than the cluster and two
    lines --skip-invalid leaves out: each is a row of every policy, saying which."""
    trace = tmp_path / "t.csv"
    lines = ["job_id,num_gpu,submit_time,duration"]
    lines += [f"j{i},{(1, 2, 4, 1)[i % 4]},{i * 7},{90 + 40 * (i % 5)}" for i in range(14)]
    lines += ["cpu,0,3,60", "wide,64,5,60", "nolength,1,9,0", ",1,11,60"]
    trace.write_text("\n".join(lines) + "\n")
    summaries, rows = _replay(tmp_path, "--trace", str(trace), "--cluster", "2x4", "--skip-invalid")
    _check_rows_add_up(summaries, rows, 18)
    assert sum(s["suspends"] for s in summaries.values()) > 0  # the per-job counts were checked against some
    gandiva = [r for r in rows if r["policy"] == "gandiva"]
    wide = next(r for r in gandiva if r["job_id"] == "t-wide")
    assert wide["status"] == "skipped" and "more than the cluster's 8" in wide["note"]
    notes = sorted(r["note"] for r in gandiva if r["status"] == "left_out")
    assert notes[0].startswith("line 16: GPU count '0'") and notes[1].startswith("line 18: duration '0'")
    # Each left-out line has a job id of its own, marked as a line's (was "" for all: rows that
    # a reader of the CSV could not tell apart, nor join on); no job of the trace is so named.
    gone = {r["job_id"]: r["note"] for r in gandiva if r["status"] == "left_out"}
    assert sorted(gone) == ["line-16", "line-18", "line-19"]
    assert gone["line-19"] == "line 19: job id is missing"


def test_rows_add_up_to_the_summary_on_a_generated_workload(tmp_path: Path) -> None:
    summaries, rows = _replay(tmp_path, "--jobs", "30", "--seed", "3", "--cluster", "2x4", "--target-load", "1.5")
    _check_rows_add_up(summaries, rows, 30)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 1, 2, 4, 8]), st.integers(0, 600), st.integers(1, 900)),
                min_size=2, max_size=12))
def test_rows_add_up_to_the_summary_on_any_small_trace(tmp_path_factory: pytest.TempPathFactory,
                                                       jobs: list[tuple[int, int, int]]) -> None:
    tmp_path = tmp_path_factory.mktemp("jobs")
    trace = tmp_path / "r.csv"
    jobs = [(1, 0, 60), *jobs]  # one that fits: a trace of only 8-GPU jobs on 1x4 is refused (exit 2)
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(f"{t},{g},{d}\n" for g, t, d in jobs))
    summaries, rows = _replay(tmp_path, "--trace", str(trace), "--cluster", "1x4")
    _check_rows_add_up(summaries, rows, len(jobs))


@pytest.mark.parametrize("where, says", [("missing/jobs.csv", "does not exist"), (".", "a folder"),
                                         ("", "argument --jobs-csv: empty; give a file to write")])
def test_a_jobs_csv_that_cannot_be_written_is_refused_before_the_replay(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str, says: str) -> None:
    try:
        code = main(["sim", "--no-progress", "--jobs", "5", "--jobs-csv", str(tmp_path / where) if where else ""])
    except SystemExit as exc:  # argparse's own error
        code = int(str(exc.code))
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and "--jobs-csv" in err and says in err
    assert not (tmp_path / "missing").exists()


def test_a_jobs_csv_on_a_pipe_a_link_or_the_trace_itself(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A pipe (or /dev/stdout) is written to, not replaced by a file renamed over its name; a
    link keeps pointing at its file, which gets the rows; the trace itself is refused before
    it is written over."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n5,2,30\n")
    argv = ["sim", "--no-progress", "--trace", str(trace), "--cluster", "1x4", "--policy", "fifo", "--jobs-csv"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the rows (under 64 KiB) wait in the pipe
    try:
        assert main([*argv, str(fifo)]) == 0
        got = os.read(reader, 1 << 16).decode()
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got.startswith("policy,job_id,status") and "fifo,t-1,finished,2" in got
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "real.csv")
    assert main([*argv, str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "real.csv").read_text().startswith("policy,job_id")
    capsys.readouterr()
    assert main([*argv, str(trace)]) == 2
    assert "is the --trace file" in capsys.readouterr().err and trace.read_text().startswith("submit_time")


def test_an_unfinished_job_is_a_row_that_says_so() -> None:
    """A replay that ends with a job not done (no policy decision could run it): its row has
    no times, and its note says it did not finish."""
    from scheduler.sim.engine import SimResult
    from scheduler.sim.metrics import job_rows
    from scheduler.sim.trace import JobSpec

    result = SimResult(policy="fifo", num_gpus=4, jobs=[], counts={}, busy_series=[(0.0, 0)], busy_gpu_s=0.0,
                       unfinished=["t-a"])
    [row] = job_rows(result, [JobSpec("t-a", 7.0, 2, duration_s=60.0)], 100)
    assert (row["status"], row["num_gpus"], row["submit_s"], row["finished_s"], row["jct_s"]) == (
        "unfinished", 2, 7.0, "", "")
    assert row["note"].startswith("did not finish")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_jobs_csv_that_fails_to_write_keeps_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """A full disk after the replay was an OSError traceback with nothing printed (the rows
    were written before the summary); now the summary comes first, then one error line."""
    code = main(["sim", "--no-progress", "--jobs", "5", "--cluster", "1x4", "--policy", "fifo", "-o", "json",
                 "--jobs-csv", "/dev/full"])
    out = capsys.readouterr()
    assert code == 1 and json.loads(out.out)["fifo"]["jobs_finished"] == 5
    assert out.err.replace("\n", " ").strip().endswith(
        "gandiva sim: error: cannot write /dev/full: No space left on device (the summary above is complete)")


LIMITED = """
import contextlib, io, resource, sys
from gandiva_cli.main import main
with contextlib.redirect_stdout(io.StringIO()):  # every module a replay imports, before the limit
    main(["sim", "--no-progress", "--policy", "fifo", "--jobs", "2", "--cluster", "1x1", "-o", "json"])
vm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmSize:")) * 1024
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
soft = vm + 64 * 2**20 if hard == resource.RLIM_INFINITY else min(vm + 64 * 2**20, hard)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
sys.exit(main(["sim", "--no-progress", "--policy", "fifo", "--trace", sys.argv[1]]))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_a_trace_too_large_for_the_memory_limit_is_one_line(tmp_path: Path) -> None:
    """Under a memory limit (ulimit -v, a container) a large trace was a MemoryError traceback;
    now one line naming the file and what to do. The limit: what the process holds once
    imported, plus 64 MiB; the trace: 42 MB, read whole, so the read fails at one large
    allocation (joining its chunks) with memory to spare for the message. (200,000 short
    lines failed among small allocations, where CPython itself at times lost the exception:
    "SystemError: error return without exception set".)"""
    import subprocess

    trace = tmp_path / "big.csv"
    trace.write_text("submit_time,num_gpus,duration\n" + "0,1,60\n" * ((40 << 20) // 7))
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(trace)], capture_output=True, text=True, timeout=120,
                          check=False)
    trace.unlink()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert f"{trace}: not enough memory to read the trace (42 MB)" in proc.stderr.replace("\n", " ")
