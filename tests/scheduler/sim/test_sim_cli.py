"""`gandiva sim`: the command a user runs, its JSON, table, plots and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gandiva_cli.main import main

TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_compare_prints_json_keyed_by_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _sim(capsys, "--jobs", "40", "--cluster", "2x4", "--compare",
                          "gandiva,yarn-cs,tiresias", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["gandiva", "tiresias", "yarn-cs"]
    for metrics in data.values():
        assert {"avg_jct_s", "p95_jct_s", "makespan_s", "utilization", "migrations"} <= set(metrics)
        assert metrics["jobs_finished"] == 40
        assert 0 < metrics["makespan_bound_s"] <= metrics["makespan_s"]
    assert "offered load" in err and "makespan lower bound" in err


def test_table_and_target_load_factor(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _sim(capsys, "--jobs", "30", "--cluster", "2x4", "--policy", "fifo",
                          "--target-load", "0.5")
    assert code == 0
    assert "avg JCT" in out and "makespan" in out and "fifo" in out
    assert "-> 0.5: arrival times x" in err


def test_plot_writes_the_two_pngs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _sim(capsys, "--jobs", "20", "--cluster", "2x4", "--compare", "gandiva,fifo",
                        "--plot", str(tmp_path / "plots"))
    assert code == 0
    for name in ("jct_cdf.png", "first_n_cdf.png", "utilization.png"):
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and name in err


def test_bad_trace_line_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("0,1,60\n5,1,abc\n")
    code, out, err = _sim(capsys, "--trace", str(trace))
    assert code == 2 and out == ""
    assert "bad.csv:2: duration 'abc' is not a number" in err.replace("\n", "")


def test_unknown_policy_lists_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _sim(capsys, "--compare", "gandiva,slurm")
    assert code == 2 and "unknown policy slurm" in err and "yarn-cs" in err


def test_help_explains_workloads_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = capsys.readouterr().out
    assert "--target-load" in text and "Gavel" in text and "--compare gandiva,yarn-cs,tiresias" in text


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not present at {TRACES.resolve()}")
def test_gavel_trace_finds_the_throughput_table(capsys: pytest.CaptureFixture[str]) -> None:
    trace = TRACES / "gavel" / "traces" / "physical_cluster" / "small_test.trace"
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "-o", "json")
    assert code == 0 and "simulation_throughputs.json" in err.replace("\n", "")
    assert json.loads(out)["gandiva"]["jobs_finished"] > 0


def test_spread_factor_one_replays_durations_as_they_are(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """A 4-GPU job on 2x2 must spread: at --spread-factor 1 it takes exactly its duration."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,4,1000\n")
    jct = {}
    for factor in ("1", "0.5"):
        code, out, _ = _sim(capsys, "--trace", str(trace), "--cluster", "2x2", "--policy", "yarn-cs",
                            "--spread-factor", factor, "-o", "json")
        assert code == 0
        jct[factor] = json.loads(out)["yarn-cs"]["avg_jct_s"]
    assert jct == {"1": pytest.approx(1000), "0.5": pytest.approx(2000)}
    code, _, err = _sim(capsys, "--trace", str(trace), "--spread-factor", "0")
    assert code == 2 and "--spread-factor must be in [0.01, 1], got 0.0" in err
    # 1e-9: spread jobs took 1e14 s, their time-slice group rotating in 1,920-s slices: no end.
    code, _, err = _sim(capsys, "--trace", str(trace), "--spread-factor", "1e-9")
    assert code == 2 and "--spread-factor must be in [0.01, 1], got 1e-09" in err
    code, out, _ = _sim(capsys, "--trace", str(trace), "--cluster", "2x2", "--policy", "yarn-cs",
                        "--spread-factor", "0.01", "-o", "json")
    assert code == 0 and json.loads(out)["yarn-cs"]["avg_jct_s"] == pytest.approx(100_000)


@pytest.mark.parametrize("flag", ["--suspend-resume-s", "--migrate-s", "--restart-s"])
def test_a_mechanism_cost_of_more_than_a_day_is_refused(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """1e300 was taken: --migrate-s printed an average JCT of 6.7e298 s, --suspend-resume-s never ended."""
    code, _, err = _sim(capsys, "--jobs", "5", "--cluster", "1x2", "--compare", "gandiva,tiresias", flag, "1e300")
    assert code == 2 and f"{flag} 1e+300 is more than a day (86,400 s)" in err, err


def test_a_resume_that_outlasts_the_time_slice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--suspend-resume-s 2000 with the 60-s quantum: each resume's pause outlasted its slice,
    no job trained and gandiva's replay never ended. Below the quantum it runs."""
    code, _, err = _sim(capsys, "--jobs", "3", "--cluster", "1x1", "--policy", "gandiva", "--suspend-resume-s", "2000")
    assert code == 2 and "--suspend-resume-s 2000 is not below --quantum 60" in err, err
    code, _, err = _sim(capsys, "--jobs", "3", "--cluster", "1x1", "--policy", "gandiva", "--suspend-resume-s", "2000",
                        "--quantum", "3000", "-o", "json")
    assert code == 0, err


def test_paper_time_slicing_can_be_chosen_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    # balance_park off: on one server it hands the server from one GPU count to another, and
    # the groups time-slice little either way; this is about how slices are taken.
    args = ("--jobs", "60", "--cluster", "1x4", "--target-load", "2", "--policy", "gandiva", "-o", "json",
            "--no-balance-park")
    code, out, _ = _sim(capsys, *args)
    ours = json.loads(out)["gandiva"]
    code2, out2, _ = _sim(capsys, *args, "--no-las-slices", "--slice-growth", "0", "--max-jobs-per-gpu", "4")
    paper = json.loads(out2)["gandiva"]
    assert code == code2 == 0
    assert ours["jobs_finished"] == paper["jobs_finished"] > 40
    assert ours["jobs_unfinished"] == paper["jobs_unfinished"] == 0
    # Growing slices switch long jobs far less often than one-minute round-robin.
    assert ours["suspends"] < paper["suspends"] / 2


@pytest.mark.parametrize(("flag", "value", "field"), [("--fifo-after", "-5", "fifo_after_s"),
                                                      ("--starve-factor", "-1", "starve_factor"),
                                                      ("--share-block-after", "-60", "share_block_after_s")])
def test_starvation_rules_are_flags_and_bad_values_are_named(capsys: pytest.CaptureFixture[str], flag: str,
                                                             value: str, field: str) -> None:
    # balance_park off: on one server it hands the server from one GPU count to another, and
    # the groups time-slice little either way; this is about how slices are taken.
    args = ("--jobs", "60", "--cluster", "1x4", "--target-load", "2", "--policy", "gandiva", "-o", "json",
            "--no-balance-park")
    code, _, err = _sim(capsys, *args, flag, value)
    assert code == 2 and f"{flag} must not be negative" in err and field not in err  # (it named the field)
    # A valid value reaches the policy: the time-slice rules change what gandiva decides here
    # (the same seed otherwise gives the same output); the block needs a queue of several sizes.
    base = json.loads(_sim(capsys, *args)[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, flag, value.lstrip("-"))[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"]
    assert (ruled != base) == (flag != "--share-block-after")


def test_balance_sizes_is_a_flag_that_reaches_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """--balance-sizes (on by default) hands servers between GPU counts by migrating whole
    servers' jobs: on a crowded mixed workload the same seed then migrates more than with
    --no-balance-sizes (30 against 23; it was twice as many while servers were also handed to
    counts none of whose waiting jobs could take them), and every job still ends."""
    args = ("--jobs", "200", "--cluster", "6x4", "--target-load", "3", "--policy", "gandiva", "-o", "json")
    base = json.loads(_sim(capsys, *args, "--no-balance-sizes")[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, "--balance-sizes")[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"] and ruled["jobs_unfinished"] == 0
    assert ruled["migrations"] > base["migrations"] + 4
    # --balance-per-gpu changes its measure (the same seed decides differently) and needs it.
    per_gpu = json.loads(_sim(capsys, *args, "--balance-per-gpu")[1])["gandiva"]
    assert per_gpu["jobs_unfinished"] == 0 and per_gpu != ruled
    code, _, err = _sim(capsys, *args, "--no-balance-sizes", "--balance-per-gpu")
    assert code == 2 and "--balance-per-gpu changes how --balance-sizes measures crowding: turn --balance-sizes on too" in err


def test_large_block_is_a_flag_that_reaches_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """--large-block-after S (on by default, ``off`` turns it off): with 4- and 8-GPU jobs on
    2-GPU servers the same seed decides differently (large jobs queue instead of joining
    groups), every job still ends; a negative S or a word is refused naming what is wrong."""
    args = ("--jobs", "80", "--cluster", "4x2", "--target-load", "2", "--max-jobs-per-gpu", "4",
            "--seed", "1", "--policy", "gandiva", "-o", "json")
    code, _, err = _sim(capsys, *args, "--large-block-after", "-1")
    assert code == 2 and "--large-block-after must not be negative" in err  # (was large_block_after_s)
    with pytest.raises(SystemExit) as exit_:
        _sim(capsys, *args, "--large-block-after", "soon")
    assert exit_.value.code == 2 and "expected seconds or 'off', got 'soon'" in capsys.readouterr().err
    base = json.loads(_sim(capsys, *args, "--large-block-after", "off")[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, "--large-block-after", "600")[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"] and ruled["jobs_unfinished"] == 0
    assert ruled["avg_jct_s"] != base["avg_jct_s"]


def test_measured_buckets_need_las_slices_and_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _sim(capsys, "--jobs", "5", "--policy", "gandiva", "--no-las-slices", "--fifo-after-measured")
    assert code == 2 and "--fifo-after-measured" in err and "--las-slices on" in err


@pytest.mark.parametrize("flag", ["--gittins-censored", "--gittins-tail-fifo"])
def test_gittins_refinements_are_flags_that_reach_the_policy(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """--gittins-censored and --gittins-tail-fifo (off by default) change what the index
    orders once 100 jobs have left: the same seed then decides differently and every job
    still ends; without --gittins-slices each is refused, naming both."""
    args = ("--jobs", "400", "--cluster", "4x4", "--target-load", "2", "--seed", "3", "--policy", "gandiva",
            "-o", "json")
    base = json.loads(_sim(capsys, *args)[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, flag)[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"] and ruled["jobs_unfinished"] == 0
    assert ruled["avg_jct_s"] != base["avg_jct_s"]
    code, _, err = _sim(capsys, "--jobs", "5", "--policy", "gandiva", "--no-gittins-slices", flag)
    assert code == 2 and flag in err and "turn --gittins-slices on too" in err


def test_gittins_history_is_a_flag_that_reaches_the_policy(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--gittins-history (off by default) changes the index only once more jobs have left
    than the window holds: on 300 jobs (one larger than the cluster is skipped) with a
    window of 150 departures the same seed then decides differently, every job still ends,
    and the same seed gives the same output; without --gittins-slices it is refused, naming
    both. (The window is 1,000 in a real run: 1,500 jobs here took 24 s of CI, the same
    checks 2 s; tests/scheduler/policy/test_policy_gittins.py checks the history itself.)"""
    from scheduler.policy.gittins import ServiceWindow

    # size, cold start, refresh, history size: a smaller window, all else as in a real run.
    defaults = ServiceWindow.__init__.__defaults__
    monkeypatch.setattr(ServiceWindow.__init__, "__defaults__", (150, *defaults[1:]))  # type: ignore[index]
    args = ("--jobs", "300", "--cluster", "4x4", "--target-load", "2", "--seed", "3", "--policy", "gandiva",
            "-o", "json")
    base = json.loads(_sim(capsys, *args)[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, "--gittins-history")[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"] > 290 and ruled["jobs_unfinished"] == 0
    assert ruled["avg_jct_s"] != base["avg_jct_s"]
    again = json.loads(_sim(capsys, *args, "--gittins-history")[1])["gandiva"]
    assert {k: v for k, v in again.items() if k != "cpu_s"} == {k: v for k, v in ruled.items() if k != "cpu_s"}
    code, _, err = _sim(capsys, "--jobs", "5", "--policy", "gandiva", "--no-gittins-slices", "--gittins-history")
    assert code == 2 and "--gittins-history" in err and "turn --gittins-slices on too" in err


def test_no_eldest_parks_is_a_flag_that_needs_eldest_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """--no-eldest-parks changes what --eldest-runs does, so alone it is refused, naming both;
    with --eldest-runs every job still ends."""
    code, _, err = _sim(capsys, "--jobs", "5", "--policy", "gandiva", "--no-eldest-parks")
    assert code == 2 and "--eldest-parks" in err and "turn --eldest-runs on too" in err
    args = ("--jobs", "60", "--cluster", "2x4", "--target-load", "2", "--seed", "3", "--policy", "gandiva",
            "--eldest-runs", "-o", "json")
    parked = json.loads(_sim(capsys, *args)[1])["gandiva"]
    code, out, _ = _sim(capsys, *args, "--no-eldest-parks")
    kept = json.loads(out)["gandiva"]
    assert code == 0 and kept["jobs_unfinished"] == 0 and kept["jobs_finished"] == parked["jobs_finished"] > 50


def test_jobs_larger_than_the_cluster_are_counted_and_named(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    trace = tmp_path / "wide.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n5,64,60\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "--compare", "fifo,gandiva,tiresias")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("│ jobs skipped"))
    assert row.replace("│", " ").split()[-3:] == ["1", "1", "1"], row
    # Said once, not once per policy (it was, three times here), and the job count says it.
    err = err.replace("\n", " ")
    assert err.count("e.g. wide-1 with 64") == 1 and "a cluster of 64 GPUs or more" in err
    assert "2 jobs (1 of them skipped) on 2x4 (8 GPUs)" in err
    assert "offered load: not defined (one job" in err
    trace.write_text("submit_time,num_gpus,duration\n0,16,60\n5,64,60\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "--policy", "fifo")
    assert code == 2 and out == ""
    assert "every job needs more GPUs than the cluster's 8 (the smallest needs 16)" in err.replace("\n", "")


@pytest.mark.parametrize(("argv", "message"), [
    (("--quantum", "nan"), "argument --quantum: expected a finite number, got 'nan'"),
    (("--slice-growth", "inf"), "argument --slice-growth: expected a finite number, got 'inf'"),
    (("--host-memory-gib", "nan"), "argument --host-memory-gib: expected a finite number"),
    (("--migrate-s", "-1"), "argument --migrate-s: must not be negative, got '-1'"),
    (("--first-n", "0"), "argument --first-n: must be at least 1, got '0'"),
    (("--large-block-after", "nan"), "argument --large-block-after: expected seconds or 'off', got 'nan'"),
    (("--cluster", "1000000x8"), "larger than the simulator replays: at most 100000 servers"),
    (("--plot", "/proc/no/such"), "--plot /proc/no/such: cannot create the folder"),
    # Checked as it starts: these named the code's field (num_jobs, target load, host memory,
    # max_jobs_per_gpu, defrag_free_gpus), not the flag given.
    (("--jobs", "0"), "error: --jobs must be at least 1, got 0"),
    (("--target-load", "0"), "error: --target-load must be positive, got 0.0"),
    (("--host-memory-gib", "-1"), "error: --host-memory-gib must not be negative, got -1.0 GiB"),
    (("--max-jobs-per-gpu", "0"), "error: --max-jobs-per-gpu must be at least 1, got 0"),
    (("--defrag-free-gpus", "0"), "error: --defrag-free-gpus must be at least 1, got 0"),
])
def test_absurd_flags_are_refused_before_any_replay(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                                    message: str) -> None:
    try:
        code, out, err = _sim(capsys, "--jobs", "5", *argv)
    except SystemExit as exc:  # argparse refuses a bad value itself
        code, out, err = exc.code, *capsys.readouterr()
    assert code == 2 and out == "" and message in err.replace("\n", " ") and "Traceback" not in err


def test_skip_invalid_leaves_out_lines_that_cannot_be_replayed_and_counts_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Another cluster's export holds CPU jobs and failed jobs of no length: without the
    flag the first stops the replay, naming it and the flag; with it they are left out,
    counted by reason, and the rest replays."""
    trace = tmp_path / "export.csv"
    trace.write_text("job_id,gpu_num,submit_time,duration,state\n"
                     "a,1,0,3600,COMPLETED\nb,0,10,600,COMPLETED\nc,2,20,0,FAILED\n"
                     "d,0,30,60,COMPLETED\ne,4,40,1800,COMPLETED\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4")
    assert code == 2 and out == ""
    err = err.replace("\n", "")
    assert "export.csv:3: GPU count '0' must be at least 1 (or --skip-invalid" in err
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "--skip-invalid", "-o", "json")
    assert code == 0
    assert json.loads(out)["gandiva"]["jobs_finished"] == 2
    lines = err.splitlines()
    assert lines.pop(0) == f"read {trace} as a csv trace (detected; --format chooses another)"
    assert lines[:3] == ["note: --skip-invalid left out 3 of 5 job lines:",
                         "  2 like line 3: GPU count '0' must be at least 1",
                         ("  1 like line 4: duration '0' must be positive (a job of no length cannot be "
                          "replayed: fix or remove the line)")]


@pytest.mark.parametrize(("argv", "table", "message"), [
    (("--compare", ","), None, "gandiva sim: error: --compare ',' names no policy; give one or more of gandiva"),
    (("--throughputs", "TABLE"), "[]", "gandiva sim: error: TABLE: not a Gavel throughput table"),
    (("--throughputs", "TABLE"), '{"k80": {}}', "gandiva sim: error: TABLE: no GPU type 'v100'; it has k80"),
    # A RecursionError traceback from the JSON parser; a table that is not UTF-8, a UnicodeDecodeError.
    (("--throughputs", "TABLE"), "[" * 100_000 + "]" * 100_000,
     "gandiva sim: error: TABLE: cannot read the Gavel throughput table: nested too deeply"),
    (("--throughputs", "TABLE"), b'{"v100": "\xff"}',
     "gandiva sim: error: TABLE: cannot read the Gavel throughput table: not UTF-8 text (byte 10)"),
])
def test_no_policy_or_an_empty_throughput_table_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            argv: tuple[str, ...], table: str | bytes | None,
                                                            message: str) -> None:
    """`--compare ,` ran no policy and printed an empty table, exit 0; a table `[]` said
    "no GPU type 'v100'; it has " and nothing; the lines began "error:", not the command."""
    path = tmp_path / "table.json"
    if table is not None:
        path.write_bytes(table if isinstance(table, bytes) else table.encode())
    code, out, err = _sim(capsys, "--jobs", "5", *[str(path) if a == "TABLE" else a for a in argv])
    assert code == 2 and out == "" and err.count("\n") <= 2, err
    assert err.replace("\n", " ").startswith(message.replace("TABLE", str(path)))


def test_an_endless_throughput_table_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """`--throughputs /dev/zero` read until the memory was full (a minute, then killed)."""
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    code, out, err = _sim(capsys, "--jobs", "5", "--throughputs", "/dev/zero")
    assert code == 2 and out == "" and "/dev/zero: cannot read the Gavel throughput table: larger than" in err


def test_groupless_block_is_a_flag_that_reaches_the_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--groupless-block: on 2x4, 8-GPU jobs (both servers) arriving one a minute stop joining
    their group while a 1-GPU job, which has no group of its size, waits; it then starts
    sooner (its JCT falls) and every job still ends."""
    trace = tmp_path / "t.csv"
    rows = [f"b{i},{60 * i},8,1200" for i in range(4)] + ["s0,90,1,300"]
    trace.write_text("job_id,submit_time,num_gpus,duration\n" + "\n".join(rows) + "\n")
    args = ("--trace", str(trace), "--cluster", "2x4", "--policy", "gandiva", "-o", "json")
    base = json.loads(_sim(capsys, *args)[1])["gandiva"]
    ruled = json.loads(_sim(capsys, *args, "--groupless-block")[1])["gandiva"]
    assert ruled["jobs_finished"] == base["jobs_finished"] == 5 and ruled["jobs_unfinished"] == 0
    assert ruled["avg_jct_s"] != base["avg_jct_s"]
