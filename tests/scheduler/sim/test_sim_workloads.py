"""`gandiva sim` on traces other clusters export: every job line accounted for, the formats
named in --help, and files that are not a trace named for what they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gandiva_cli.main import main
from scheduler.sim.trace import TraceError, read_trace


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err.replace("\n", " ")


def test_help_names_every_trace_format_and_how_it_is_detected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = capsys.readouterr().out
    for fmt in ("gavel6", "gavel7", "gavel10", "itp", "tiresias", "csv"):
        assert f"\n  {fmt} " in text, fmt
    assert "ElasticFlow" in text and "detected from the first" in text
    assert "table gives a rate of 0" in " ".join(text.split())
    assert "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration" in text


def test_every_job_line_is_in_one_count_with_skip_invalid(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """5 job lines: 2 finish, 1 is wider than the cluster (skipped), 2 cannot be replayed
    (a CPU job, a repeated id) and are left out: the JSON and the table count all 5."""
    trace = tmp_path / "c.csv"
    trace.write_text("job_id,num_gpu,submit_time,duration\na,1,0,60\nb,0,5,60\nc,2,10,60\na,1,20,60\nd,64,30,60\n")
    code, out, _ = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--compare", "fifo,yarn-cs",
                        "--skip-invalid", "-o", "json")
    assert code == 0
    for counts in json.loads(out).values():
        assert (counts["jobs_finished"], counts["jobs_unfinished"], counts["jobs_skipped"],
                counts["jobs_left_out"]) == (2, 0, 1, 2)
    code, out, _ = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--policy", "fifo", "--skip-invalid")
    assert code == 0 and "jobs left out (no GPU job, or --skip-invalid)" in out
    assert [ln.split("│")[2].strip() for ln in out.splitlines() if "left out" in ln] == ["2"]


def test_jobs_shorter_than_one_mini_batch_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The simulator runs whole mini-batches: a 0.001 s job takes one (0.25 s at the built-in
    resnet50 rate), so its JCT is not the trace's; the user is told which jobs."""
    trace = tmp_path / "s.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,0.001\n0,1,60\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo", "-o", "json")
    assert code == 0 and json.loads(out)["fifo"]["jobs_finished"] == 2
    assert "1 job(s) are shorter than one mini-batch at their rate (e.g. s-0: 0.001 s)" in err
    assert "(0.25 s for that one)" in err
    trace.write_text("submit_time,num_gpus,duration\n0,1,1\n0,1,60\n")
    assert "mini-batch" not in _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo")[2]


@pytest.mark.parametrize(("content", "says"), [
    pytest.param("submit_time,num_gpus,duration\n0,1,60\n".encode("utf-16"),
                 "x.csv: UTF-16 text (a spreadsheet's 'Unicode text' export): save the trace as UTF-8",
                 id="utf-16"),
    pytest.param("job_id,user,num_gpu,submit_time,duration\na,ren\xe9,1,0,60\n".encode("latin-1"),
                 "x.csv:2: not UTF-8 text (byte 46, b'\\xe9'): save the trace as UTF-8", id="latin-1-names-its-line"),
    pytest.param(b'[{"job_id": 1, "num_gpu": 1, "submit_time": 0, "duration": 60}]\n',
                 "x.csv:1: JSON, not a trace this reader knows: write it as CSV", id="json-list"),
    pytest.param(b'\n{"jobs": [\n {"num_gpu": 1}]}\n', "x.csv:2: JSON, not a trace this reader knows", id="json-object"),
])
def test_a_file_that_is_not_a_utf8_trace_is_named_for_what_it_is(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert says in str(caught.value) and str(caught.value).startswith(str(path))
    assert "\n" not in str(caught.value)


def test_timestamps_ending_in_utc_are_dates(tmp_path: Path) -> None:
    """BigQuery writes TIMESTAMP columns as `2021-03-01 10:00:00 UTC`: read as that date, as a
    zone offset is, instead of refusing the line."""
    path = tmp_path / "bq.csv"
    path.write_text("job_id,num_gpu,submit_time,duration\na,1,2021-03-01 10:00:00 UTC,60\n"
                    "b,1,2021-03-01 10:00:30 gmt,60\nc,2,2021-03-01 11:00:40+01:00,60\n")
    assert [(j.id, j.submit_time) for j in read_trace(path)] == [("bq-a", 0.0), ("bq-b", 30.0), ("bq-c", 40.0)]


def test_sim_table_can_leave_out_lines_another_cluster_cannot_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Another ITP cluster's export with a CPU job (0 GPUs): `benchmarks/sim_table.py` stopped
    with no way on but editing the file; --skip-invalid (as in gandiva sim) leaves the line
    out, says so, and replays the rest."""
    import importlib
    import sys

    root = Path(__file__).resolve().parents[3]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    sim_table = importlib.import_module("sim_table")
    (tmp_path / "itp").mkdir()
    (tmp_path / "itp" / "cluster98.csv").write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
        "a,0,1,bert,1,1,0,600\nb,60,1,bert,1,1,2,1200\nc,90,1,bert,1,1,1,600\n")
    base = ["sim_table.py", "--traces", str(tmp_path), "--cluster", "1x4", "--json", str(tmp_path / "out.json")]
    monkeypatch.setattr(sys, "argv", base)
    assert sim_table.main() == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "cluster98.csv:2: GPU count '0' must be at least 1 (or --skip-invalid" in err
    monkeypatch.setattr(sys, "argv", [*base, "--skip-invalid"])
    assert sim_table.main() == 0
    err = capsys.readouterr().err
    assert "cluster98.csv: --skip-invalid left out 1 of 3 job lines:" in err and "1 like line 2: GPU count" in err
    assert json.loads((tmp_path / "out.json").read_text())["cluster98"]["yarn-cs"]["jobs_finished"] == 2


def test_a_gavel_trace_without_its_throughput_table_says_its_steps_are_not_timed_by_gavel(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A Gavel trace copied away from simulation_throughputs.json replayed its mini-batch counts
    at the built-in rates (12x the offered load of the same trace beside its table) with only
    a note about unknown model names."""
    trace = tmp_path / "g.trace"
    trace.write_text("ResNet-50 (batch size 64)\tpython3 main.py\t-n\t1\t5000\t30.000000\t4\n"
                     "LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t0.000000\t1\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--policy", "fifo", "-o", "json")
    assert code == 0 and "a Gavel trace's lengths are mini-batches, and no simulation_throughputs.json" in err
    assert "give --throughputs FILE" in err
    for given in ("none", str(tmp_path / "t.json")):
        (tmp_path / "t.json").write_text('{"v100": {"(\'LM (batch size 20)\', 1)": {"null": 2.0}}}')
        code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--policy", "fifo",
                            "--throughputs", given, "-o", "json")
        assert code == 0 and "simulation_throughputs.json" not in err.split("rates from")[0]


def test_a_quoted_field_over_several_lines_is_one_field(tmp_path: Path) -> None:
    """A command column exported with its line breaks (valid CSV, RFC 4180) stopped the read
    with "not a CSV line (unexpected end of data): check its quotes"; it is one job, and the
    lines after it keep their numbers in messages."""
    path = tmp_path / "cmd.csv"
    path.write_text('job_id,num_gpu,submit_time,duration,command\na,1,0,60,"python x.py \\\n  --lr 1"\n'
                    'b,2,5,60,y\nc,0,9,60,z\n')
    with pytest.raises(TraceError, match=r"cmd.csv:5: GPU count '0' must be at least 1"):
        read_trace(path)
    path.write_text(path.read_text().replace("c,0,", "c,4,"))
    assert [(j.id, j.num_gpus, j.submit_time) for j in read_trace(path)] == [
        ("cmd-a", 1, 0.0), ("cmd-b", 2, 5.0), ("cmd-c", 4, 9.0)]
    path.write_text(path.read_text() + 'd,1,10,60,"an open quote\n')
    with pytest.raises(TraceError, match=r"cmd.csv:6: not a CSV line \(unexpected end of data\): check its quotes"):
        read_trace(path)


def test_a_header_written_as_a_comment_names_the_columns(tmp_path: Path) -> None:
    """numpy.savetxt(..., header=...) writes `# submit_time,duration,num_gpus`: that header
    was dropped as a comment and the rows read in the default column order, silently (a
    60-GPU job of 1 s instead of a 1-GPU job of 60 s)."""
    path = tmp_path / "np.csv"
    path.write_text("# exported by a notebook\n# submit_time,duration,num_gpus\n0,60,1\n10,30,2\n")
    assert [(j.submit_time, j.num_gpus, j.duration_s) for j in read_trace(path)] == [(0.0, 1, 60.0), (10.0, 2, 30.0)]
    # A note after the header is a comment (until session 51 it hid the header: a 60-GPU job
    # of 1 s); so is a comment that names no column, or not as many as the row has fields.
    path.write_text("# submit_time,duration,num_gpus\n# cluster X\n0,60,1\n")
    assert [(j.num_gpus, j.duration_s) for j in read_trace(path)] == [(1, 60.0)]
    path.write_text("# submit_time,duration\n# cluster X\n0,1,60\n")
    assert [(j.num_gpus, j.duration_s) for j in read_trace(path)] == [(1, 60.0)]


def test_gavels_older_six_column_msr_traces_are_read(tmp_path: Path) -> None:
    """Gavel's older msr traces (traces/generated/msr/msr_*.trace) have no needs_data_dir
    column: job_type, command, num_steps_arg, total_steps, arrival_time, scale_factor. They
    were refused as an unrecognised layout of 6 columns."""
    path = tmp_path / "msr_0.trace"
    path.write_text("CycleGAN\tcd x && python3 cyclegan.py\t--n_steps\t28\t30\t1\n"
                    "A3C\tcd y && python3 main.py --workers 4\t--max-steps\t339\t1.5\t2\n")
    assert [(j.id, j.model, j.total_steps, j.submit_time, j.num_gpus) for j in read_trace(path)] == [
        ("msr_0-1", "A3C", 339.0, 1.5, 2), ("msr_0-0", "CycleGAN", 28.0, 30.0, 1)]
    # A headerless tab-separated CSV of 6 columns is not taken for one (a Gavel line starts
    # with its job type).
    path.write_text("0\t1\t60\t4\t5\t6\n")
    with pytest.raises(TraceError, match="unrecognised trace layout .tab-separated with 6 columns"):
        read_trace(path)


def test_a_log_of_start_and_end_times_replays_their_difference(tmp_path: Path) -> None:
    """Without a duration column, a log's start_time and end_time give the run time (session 34
    told the user to add the column; session 38 reads it)."""
    path = tmp_path / "log.csv"
    path.write_text("job_id,submit_time,start_time,end_time,num_gpus\nj1,0,5,105,4\n")
    assert [(j.id, j.submit_time, j.duration_s) for j in read_trace(path)] == [("log-j1", 0, 100)]
    path.write_text("job_id,submit_time,start_time,num_gpus\nj1,0,5,4\n")
    with pytest.raises(TraceError, match=r"log.csv:1: the header names no duration column .*; or give start_time "
                                         r"and end_time columns \(the run time is their difference\)"):
        read_trace(path)


def test_jobs_wider_than_the_gavel_table_measured_are_named(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """Gavel's table stops at 8 GPUs and the Philly traces have 16- to 64-GPU jobs: their rates
    are extrapolated, which the replay now says (it said nothing)."""
    table = tmp_path / "simulation_throughputs.json"
    table.write_text('{"v100": {"(\'LM (batch size 20)\', 1)": {"null": 2.0}, '
                     '"(\'LM (batch size 20)\', 2)": {"null": 3.5}}}')
    trace = tmp_path / "g.trace"
    trace.write_text("LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t0.000000\t1\n"
                     "LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t5.000000\t4\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--policy", "fifo", "-o", "json")
    assert code == 0 and str(table) in err
    assert "1 job(s) ask more GPUs than the table measured for their model (e.g. g-1: 4 GPUs, measured up to 2)" in err


def test_quoted_fields_after_a_space_are_quoted_fields(tmp_path: Path) -> None:
    """`"a", "1", "0", "60"` (a space after each comma): the quotes were read as part of the
    value and the line refused (submit time '"0"' is neither seconds nor a date)."""
    path = tmp_path / "q.csv"
    path.write_text('"job_id", "num_gpu", "submit_time", "duration"\n"a", "1", "0", "60"\n"b", "2", "5", "60"\n')
    assert [(j.id, j.num_gpus, j.submit_time, j.duration_s) for j in read_trace(path)] == [
        ("q-a", 1, 0.0, 60.0), ("q-b", 2, 5.0, 60.0)]


def test_jobs_wider_than_a_server_are_said_to_run_slower(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An 8-GPU job of 1000 s on servers of 4 runs spread at 0.42x: 2381 s, not the trace's
    1000 s. The replay said nothing of it; now it names how many jobs and the factor."""
    trace = tmp_path / "w.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,8,1000\n10,4,1000\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "--policy", "yarn-cs", "-o", "json")
    assert code == 0 and json.loads(out)["yarn-cs"]["makespan_s"] == pytest.approx(1000 / 0.42 + 1000)
    assert "1 job(s) ask more GPUs than a server has (4): they run spread over servers at 0.42x their rate" in err
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "--policy", "yarn-cs",
                          "--spread-factor", "1", "-o", "json")
    assert code == 0 and json.loads(out)["yarn-cs"]["makespan_s"] == pytest.approx(2000)
    assert "spread over servers" not in err


@pytest.mark.parametrize(("text", "says"), [
    pytest.param('job_id,"num_gpu,submit_time,duration\na",1,0,60\nb,1,0,60\n', "x.csv:1: a header name holds a "
                 "line break ('num_gpu,submit_time,duration\\na'): a quote left open? close it",
                 id="header"),
    pytest.param('job_id,num_gpu,submit_time,duration\n"a,1,0,60\nb",1,0,60\n', "x.csv:2: job id 'a,1,0,60\\nb' holds "
                 "a line break: a quote left open?", id="job-id"),
    pytest.param('job_id,user,num_gpu,submit_time,duration\na,"u\nv",1,0,60\n', "x.csv:2: user 'u\\nv' holds a line",
                 id="user"),
    pytest.param('submit_time,num_gpus,duration,model\n0,1,60,"res\nnet"\n', "x.csv:2: model 'res\\nnet' holds a line",
                 id="model"),
])
def test_a_quote_left_open_over_names_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    """A quoted field may hold line breaks; in a header, a job id, a user or a model name it
    is a quote left open, and the error that quoted it ran over several lines."""
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_empty_fields_past_the_header_are_nothing(tmp_path: Path) -> None:
    """A spreadsheet pads every row to its widest (`a,1,0,60,,`): the empty fields past the
    header's were refused as a row of more fields than the header; a field with text there
    still is."""
    path = tmp_path / "pad.csv"
    path.write_text("job_id,num_gpu,submit_time,duration\na,1,0,60,,\nb,2,5,30,\n")
    assert [(j.id, j.num_gpus, j.duration_s) for j in read_trace(path)] == [("pad-a", 1, 60.0), ("pad-b", 2, 30.0)]
    path.write_text("job_id,num_gpu,submit_time,duration\na,1,0,60,,x\n")
    with pytest.raises(TraceError, match=r"pad.csv:2: expected 4 Tiresias columns, got 6"):
        read_trace(path)


@pytest.mark.parametrize(("stamp", "unit"), [
    ("1614592800000", "milliseconds since 1970 it is 2021-03-01 10:00:00 UTC; give seconds (divide by 1,000)"),
    ("1614592800000000000", "nanoseconds since 1970 it is 2021-03-01 10:00:00 UTC; give seconds (divide by 1,0"),
])
def test_submit_times_in_epoch_milli_or_nanoseconds_are_named_so(tmp_path: Path, stamp: str, unit: str) -> None:
    """A dataframe's datetime column saved as integers (ms or ns since 1970) was refused as
    "more than 1e11 s (3,000 years) ... (is the unit right?)"; the message now says which unit
    and date it reads as, and what to divide by."""
    path = tmp_path / "ms.csv"
    path.write_text(f"job_id,num_gpu,submit_time,duration\na,1,{stamp},60\n")
    with pytest.raises(TraceError, match=re.escape(f"ms.csv:2: submit time '{stamp}' is more than 1e11 s: as {unit}")):
        read_trace(path)


def test_a_job_the_table_gives_no_rate_is_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """Gavel's K80 table measured ResNet-50 (batch 128) on 2+ GPUs as 0 (out of memory):
    `--gpu-type k80` on a trace holding such a job ended in a ZeroDivisionError traceback."""
    table = tmp_path / "t.json"
    table.write_text('{"k80": {"(\'ResNet-50 (batch size 128)\', 1)": {"null": 1.5}, '
                     '"(\'ResNet-50 (batch size 128)\', 2)": {"null": 0.0}}}')
    trace = tmp_path / "g.trace"
    trace.write_text("ResNet-50 (batch size 128)\tpython3 main.py\t-n\t1\t500\t0.000000\t1\n"
                     "ResNet-50 (batch size 128)\tpython3 main.py\t-n\t1\t500\t9.000000\t2\n")
    argv = ("--trace", str(trace), "--throughputs", str(table), "--gpu-type", "k80", "--cluster", "1x4", "-o", "json")
    code, out, err = _sim(capsys, *argv, "--policy", "fifo")
    assert code == 2 and out == ""
    assert ("error: 1 job(s) have a rate of 0 in " in err and "'ResNet-50 (batch size 128)' on 2 GPUs (e.g. job g-1) "
            "did not run there" in err and "choose another --gpu-type" in err)
    code, _, err = _sim(capsys, *argv, "--policy", "fifo", "--target-load", "0.5")
    assert code == 2 and "have a rate of 0" in err and "or leave those jobs out (--skip-invalid)" in err
    # --skip-invalid leaves them out, says so, and counts them with the lines left out.
    code, out, err = _sim(capsys, *argv, "--compare", "fifo,gandiva", "--skip-invalid")
    assert code == 0 and "note: --skip-invalid left out 1 job(s) that have a rate of 0" in err
    for counts in json.loads(out).values():
        assert (counts["jobs_finished"], counts["jobs_left_out"]) == (1, 1)


def test_a_job_that_can_only_run_spread_at_a_rate_of_0_is_refused(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    """A table whose spread (unconsolidated) rate of a model is 0: a job wider than a server
    never ended, and the JSON said `"makespan_bound_s": Infinity` (not JSON)."""
    table = tmp_path / "t.json"
    table.write_text('{"v100": {"(\'LM (batch size 20)\', 1)": {"null": 2.0}, "(\'LM (batch size 20)\', 4)": '
                     '{"null": 6.0}}, "v100_unconsolidated": {"(\'LM (batch size 20)\', 4)": {"null": 0.0}}}')
    trace = tmp_path / "g.trace"
    trace.write_text("LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t0.000000\t4\n")
    argv = ("--trace", str(trace), "--throughputs", str(table), "--policy", "fifo", "-o", "json")
    for cluster in ("2x2", "1x4"):  # (refused with the table, wherever its jobs could run)
        code, out, err = _sim(capsys, *argv, "--cluster", cluster)
        assert code == 2 and out == "" and "v100_unconsolidated[\"('LM (batch size 20)', 4)\"][\"null\"]: 0 " in err


# Three 1-GPU jobs and a 2-GPU one on servers of 2 GPUs: when the short two end, one GPU is free on
# each server, and fifo, yarn-cs and tiresias place the 2-GPU job over both.
_FRAGMENTED = "".join(f"LM (batch size 20)\tpython3 lm.py\t-n\t1\t{steps}\t{t}\t{gpus}\n" for steps, t, gpus in
                      ((12000, 0, 1), (20, 0, 1), (20, 0, 1), (12000, 0, 1), (120, 100, 2)))


@pytest.mark.parametrize("spread", ["0.0", "1e-9"])
def test_a_spread_rate_of_0_in_a_table_is_refused_naming_the_entry(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path, spread: str) -> None:
    """A custom table whose `v100_unconsolidated` rate of a model is 0 (or next to it), for a job
    that fits one server: fifo, yarn-cs and tiresias placed it over two servers' free GPUs,
    where it made no progress, and the replay ended with exit 0 and the job unfinished
    ("jobs_unfinished": 1 of 5). The table is refused now, naming the entry, as
    --spread-factor below 0.01 is; at a measured ratio every job ends under every policy."""
    table = tmp_path / "t.json"
    rows = {"v100": {f"('LM (batch size 20)', {k})": {"null": 2.0 * k} for k in (1, 2)},
            "v100_unconsolidated": {"('LM (batch size 20)', 2)": {"null": float(spread) * 4.0}}}
    table.write_text(json.dumps(rows))
    trace = tmp_path / "g.trace"
    trace.write_text(_FRAGMENTED)
    argv = ("--trace", str(trace), "--throughputs", str(table), "--cluster", "2x2", "-o", "json",
            "--compare", "gandiva,fifo,yarn-cs,tiresias,yarn-cs-local")
    code, out, err = _sim(capsys, *argv)
    assert code == 2 and out == "", (code, out)
    assert ("v100_unconsolidated[\"('LM (batch size 20)', 2)\"][\"null\"]: " in err and "(0.01)" in err
            and "would make no progress" in err), err
    rows["v100_unconsolidated"]["('LM (batch size 20)', 2)"]["null"] = 0.4  # 0.1x: Gavel's lowest
    table.write_text(json.dumps(rows))
    code, out, err = _sim(capsys, *argv)
    assert code == 0, err
    result = json.loads(out)
    assert {p: (r["jobs_finished"], r["jobs_unfinished"]) for p, r in result.items()} == dict.fromkeys(result, (5, 0))
    # fifo ran it spread, at 0.1x: 300 s for its 30 s alone, beside 6,000 s, 10 s, 10 s and 6,000 s.
    assert result["fifo"]["avg_jct_s"] == pytest.approx((6000 + 10 + 10 + 6000 + 300) / 5)


def test_ties_of_submit_time_replay_in_the_traces_order(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Jobs submitted at once run in the file's order under fifo: 12 jobs at t=0 used to run
    t-0, t-1, t-10, t-11, t-2, ... (ties broken by job id as text), so a hand computation in
    file order did not match the replay's average JCT (a note said so). Now it does."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(f"0,1,{100 * (12 - i)}\n" for i in range(12)))
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo", "-o", "json")
    # Each alone to its end in row order: JCTs are the running sums of 1200, 1100, ..., 100 s.
    assert code == 0 and json.loads(out)["fifo"]["avg_jct_s"] == pytest.approx(65000 / 12)
    assert "submit time" not in err


def test_a_gavel_job_type_with_blanks_around_it_finds_its_rates(tmp_path: Path) -> None:
    """`LM (batch size 20) ` (a blank after the job type, as an editor or a script may leave)
    missed the throughput table and replayed at the default model's rates."""
    path = tmp_path / "g.trace"
    path.write_text(" LM (batch size 20) \tpython3 lm.py\t-n\t1\t1200\t0.000000\t1\n")
    assert [j.model for j in read_trace(path)] == ["LM (batch size 20)"]


def test_a_target_load_that_stretches_arrivals_past_1e11_s_is_refused(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    """--target-load 1e-15 put the arrivals at 3e15 s, where a float's step is 0.5 s: a 1-s job's
    JCT and a policy's wake-up 0.1 s later were rounded away (a gandiva replay could never end).
    Now refused, naming the lowest target; that target replays."""
    trace = tmp_path / "ones.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,1\n1000,1,1\n2000,1,1\n")
    argv = ["sim", "--no-progress", "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo", "-o", "json"]
    assert main([*argv, "--target-load", "1e-15"]) == 2
    err = capsys.readouterr().err
    assert "--target-load 1e-15 stretches the arrivals to 3e+15 s, past 1e11 s" in err, err
    lowest = err.split("give at least ")[1].split()[0]
    assert main([*argv, "--target-load", str(float(lowest) * 1.01)]) == 0
    assert json.loads(capsys.readouterr().out)["fifo"]["avg_jct_s"] == pytest.approx(1.0)


@pytest.mark.parametrize("flags", [["--host-memory-gib", "1e300"], ["--host-memory-gib", "1", "--job-host-memory-gib",
                                                                     "1e300"]])
def test_a_host_memory_too_large_to_count_is_one_line(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    """1e300 GiB was an OverflowError traceback (exit 1)."""
    assert main(["sim", "--no-progress", "--jobs", "5", "--cluster", "1x2", *flags]) == 2
    err = capsys.readouterr().err
    assert f"{flags[-2]} 1e+300 is more than 1,048,576 GiB (1 PiB)" in err and "Traceback" not in err, err
