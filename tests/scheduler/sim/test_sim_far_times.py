"""`gandiva sim` on times and rates no replay can hold: dates thousands of years apart, jobs
that would run for ages (or never) at their table rate. Each is refused in one line naming
what is wrong (or, with --skip-invalid, left out and counted), never replayed as nonsense or
without end, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gandiva_cli.main import main
from scheduler.sim.trace import MAX_SUBMIT_S, TraceError, read_trace_as

GAVEL_TYPE = "ResNet-18 (batch size 32)"


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err.replace("\n", " ")


def test_a_placeholder_date_far_from_the_others_is_refused_naming_its_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """9999-12-31 (a 'no date' placeholder) beside 2020's dates was read as a job 2.5e11 s
    in: makespan 2.5e11 s and offered load 0.000 printed, while a submit time in seconds
    past 1e11 is refused. Now the same refusal, naming the line; --skip-invalid leaves it out."""
    trace = tmp_path / "d.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration\na,2020-03-01 10:00:00,1,60\n"
                     "b,9999-12-31 00:00:00,1,60\nc,2020-03-01 10:01:00,1,60\n")
    with pytest.raises(TraceError, match=re.escape("d.csv:3: submit time 9999-12-31 00:00:00 is 2.52e+11 s after "
                                                   "the trace's earliest (2020-03-01 10:00:00): more than 1e11 s")):
        read_trace_as(trace)
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--compare", "fifo,gandiva",
                          "--skip-invalid", "-o", "json")
    assert code == 0, err
    assert "left out 1 of 3 job lines" in err, err
    for summary in json.loads(out).values():
        assert summary["jobs_finished"] == 2 and summary["jobs_left_out"] == 1
        assert summary["makespan_s"] < 200, summary  # 60 s apart, 60 s each: not thousands of years


def test_a_philly_log_with_a_placeholder_submit_date_is_refused(tmp_path: Path) -> None:
    """Any reader's times are held below 1e11 s (a Philly log's dates too)."""
    def job(jid: str, submitted: str) -> dict:
        return {"jobid": jid, "submitted_time": submitted, "status": "Pass", "user": "u",
                "attempts": [{"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 11:00:00",
                              "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}
    trace = tmp_path / "cluster_job_log"
    trace.write_text(json.dumps([job("application_1", "2017-10-03 09:00:00"),
                                 job("application_2", "9999-12-31 00:00:00")]))
    with pytest.raises(TraceError, match="more than 1e11 s"):
        read_trace_as(trace)


_START = datetime(1, 1, 1, tzinfo=timezone.utc)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 3_155_000_000_00 // 86400), min_size=1, max_size=6),
       st.booleans())
def test_dates_are_replayed_only_within_1e11_s_of_the_earliest(tmp_path: Path, days: list[int],
                                                              skip: bool) -> None:
    """Whatever dates a trace holds (years 1 to 9999): read as seconds after the earliest, each
    at most 1e11 s, or refused naming a line; with skipping, every line kept or left out."""
    trace = tmp_path / "h.csv"
    stamps = [(_START + timedelta(days=d)).isoformat(" ")[:19] for d in days]
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(f"{s},1,60\n" for s in stamps))
    earliest = min(days) * 86400.0
    far = [d * 86400.0 - earliest > MAX_SUBMIT_S for d in days]
    skipped: list[TraceError] = []
    if any(far) and not skip:
        with pytest.raises(TraceError, match=r"h\.csv:\d+: .*more than 1e11 s"):
            read_trace_as(trace)
        return
    jobs, _ = read_trace_as(trace, skipped=skipped if skip else None)
    assert len(jobs) == far.count(False) and len(skipped) == far.count(True)
    assert all(0 <= j.submit_time <= MAX_SUBMIT_S for j in jobs)


def _gavel(tmp_path: Path, steps: list[str], rate: str) -> tuple[Path, Path]:
    trace = tmp_path / "g.trace"
    trace.write_text("".join(f"{GAVEL_TYPE}\tcmd\t--num_steps\t1\t{s}\t{10 * i}\t1\n" for i, s in enumerate(steps)))
    table = tmp_path / "rates.json"
    table.write_text(json.dumps({"v100": {f"('{GAVEL_TYPE}', 1)": {"null": float(rate)}}}))
    return trace, table


def test_a_job_that_would_run_for_ages_at_its_table_rate_is_refused(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """A table rate of 1e-300 mini-batches/s (a rate in another unit): fifo printed an average
    JCT of 1.5e303 s and gandiva never ended (not run here: without the check it would hang).
    Now refused before any policy replays, naming a job."""
    trace, table = _gavel(tmp_path, ["1000", "1000"], "1e-300")
    code, out, err = _sim(capsys, "--trace", str(trace), "--throughputs", str(table), "--cluster", "1x1",
                          "--compare", "fifo,tiresias", "-o", "json")
    assert code == 2 and out == "", (code, out)
    assert ("2 job(s) would run more than 1e+09 s (31 years) even alone at the rates of" in err
            and "job g-0: 1000 mini-batches" in err and "1e-300 mini-batches/s" in err and "--skip-invalid" in err), err


def test_skip_invalid_leaves_out_a_job_that_would_run_for_ages(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """1e13 mini-batches at 1 a second (3e5 years): left out, counted and in --jobs-csv; the
    other jobs replay under every policy."""
    trace, table = _gavel(tmp_path, ["600", "1e13", "300"], "1")
    jobs_csv = tmp_path / "jobs.csv"
    code, out, err = _sim(capsys, "--trace", str(trace), "--throughputs", str(table), "--cluster", "1x1",
                          "--compare", "fifo,gandiva,tiresias,yarn-cs", "--skip-invalid", "-o", "json",
                          "--jobs-csv", str(jobs_csv))
    assert code == 0, err
    assert "--skip-invalid left out 1 job(s) that would run more than 1e+09 s" in err, err
    for summary in json.loads(out).values():
        assert summary["jobs_finished"] == 2 and summary["jobs_left_out"] == 1, summary
        assert summary["makespan_s"] < 2000, summary
    rows = [line.split(",") for line in jobs_csv.read_text().splitlines()[1:]]
    assert sorted(r[1] for r in rows if r[2] == "left_out") == ["g-1"] * 4, rows


def test_a_skipped_job_whose_model_has_no_rate_on_its_gpus_is_no_traceback(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    """A CSV job of a model the table measured as 0 on its GPU count (Gavel's K80 ResNet-50 on
    8 GPUs), wider than the cluster: it is skipped, yet the note on jobs shorter than a
    mini-batch timed it (its steps 0 < 1) and divided by its rate: ZeroDivisionError traceback."""
    trace = tmp_path / "k.csv"
    trace.write_text("submit_time,num_gpus,duration,model\n0,1,60,M\n10,8,60,M\n")
    table = tmp_path / "rates.json"
    table.write_text(json.dumps({"v100": {"('M', 1)": {"null": 10.0}, "('M', 8)": {"null": 0.0}}}))
    code, out, err = _sim(capsys, "--trace", str(trace), "--throughputs", str(table), "--cluster", "1x4",
                          "--compare", "fifo,gandiva", "-o", "json")
    assert code == 0, err
    assert "shorter than one mini-batch" not in err, err
    for summary in json.loads(out).values():
        assert summary["jobs_finished"] == 1 and summary["jobs_skipped"] == 1, summary


def test_a_low_offered_load_is_printed_as_a_number_not_zero(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """Two 60-s jobs a million seconds apart on one GPU: load 1.2e-4 was printed `offered load
    0.000`, as if the trace held no work; now its value, to 3 significant digits."""
    trace = tmp_path / "gap.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n1000000,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo")
    assert code == 0 and "offered load 0.00012 (use --target-load" in err, err


def test_jobs_csv_naming_the_throughputs_table_is_refused(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    """`--jobs-csv` naming the --throughputs file wrote the rows over the user's table (its
    JSON gone); now refused before the replay, the table untouched."""
    trace, table = _gavel(tmp_path, ["600", "300"], "10")
    before = table.read_text()
    code, out, err = _sim(capsys, "--trace", str(trace), "--throughputs", str(table), "--cluster", "1x1",
                          "--policy", "fifo", "--jobs-csv", str(table))
    assert code == 2 and out == "", (code, out)
    assert "is the --throughputs file: the rows would be written over the throughput table" in err, err
    assert table.read_text() == before


def test_a_trace_whose_file_name_is_not_utf8_writes_its_jobs_csv(tmp_path: Path) -> None:
    """A trace file named in Latin-1 (`w\\xff.csv`): its job ids (`w\\udcff-0`, named after the
    file) made --jobs-csv a UnicodeEncodeError traceback after the whole replay. Now the
    rows are written, the id backslash-escaped as stderr shows it."""
    trace = tmp_path / os.fsdecode(b"w\xff.csv")
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n10,2,60\n")
    jobs_csv = tmp_path / "jobs.csv"
    # In a process of its own, as a user runs it: its stderr escapes what it cannot encode
    # (pytest's capture would not), so only the CSV is under test.
    done = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "sim", "--no-progress", "--trace", str(trace),
                           "--cluster", "1x1", "--policy", "fifo", "--jobs-csv", str(jobs_csv)],
                          check=False, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    rows = jobs_csv.read_text(encoding="utf-8").splitlines()
    assert rows[1].startswith("fifo,w\\udcff-0,finished,") and rows[2].startswith("fifo,w\\udcff-1,skipped,"), rows


def test_arrivals_spanning_centuries_are_said_to(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """0001-01-01 (a 'no date' placeholder) before 2020's dates is within 1e11 s, so it
    replays: a makespan of 2,019 years was printed without a word. Now a note names the
    span and the two jobs."""
    trace = tmp_path / "early.csv"
    trace.write_text("submit_time,num_gpus,duration\n0001-01-01 00:00:00,1,60\n2020-03-01 10:00:00,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo")
    assert code == 0, err
    assert "note: the arrivals span 2,019 years (job early-0 at 0 s, job early-1 at 6.372e+10 s)" in err, err
    trace.write_text("submit_time,num_gpus,duration\n2019-03-01 00:00:00,1,60\n2020-03-01 10:00:00,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo")
    assert code == 0 and "arrivals span" not in err, err
