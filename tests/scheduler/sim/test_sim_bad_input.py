"""Bad input to `gandiva sim`: one line naming what is wrong (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gandiva_cli import main as gandiva_main
from scheduler.sim.engine import make_cluster
from scheduler.sim.trace import TraceError, read_trace_as


@pytest.fixture
def gandiva(capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """`gandiva ARGS...` in process: (code, out, err)."""
    class Result:
        def __init__(self, code: int, out: str, err: str) -> None:
            self.code, self.out, self.err = code, out, err

        def __repr__(self) -> str:
            return f"Result({self.code}, {self.out!r}, {self.err!r})"

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = gandiva_main.main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.mark.parametrize("spec", [" 2x3", "+2x3", "2_0x4", "\u0662x4", "2x3x4", "2x", "x4", "2*4"])
def test_a_cluster_is_ascii_digits_x_ascii_digits(spec: str) -> None:
    """int() took ' 2', '+2', '2_0' (20) and other scripts' digits."""
    with pytest.raises(ValueError, match="is not SERVERSxGPUS, e.g. 25x4"):
        make_cluster(spec)


def test_servers_of_any_gpu_count_are_a_cluster() -> None:
    """2x3 is valid: a server has the GPUs its helper reports (live too); only a job's
    request must be a power of two."""
    assert [s.num_gpus for s in make_cluster("2x3")] == [3, 3] and len(make_cluster("3X8")) == 3


ITP = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"


def _error(tmp_path: Path, text: str | bytes, skipped: list | None = None) -> TraceError:
    trace = tmp_path / "t.csv"
    trace.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TraceError) as err:
        read_trace_as(trace, skipped=skipped)
    return err.value


@pytest.mark.parametrize(("text", "says"), [
    # A terminal escape in a job id reached the terminal in "makespan lower bound: job ...".
    (ITP + "\x1b[2J\x1b[31mEVIL,0,1,bert,1,1,1,100\n", "t.csv:2: control character '\\x1b' at column 1"),
    (ITP + "a,0,1,bert\x07,1,1,1,100\n", "t.csv:2: control character '\\x07' at column 11"),
    # str.splitlines split at the form feed: every later line number was one off.
    ("submit_time,num_gpus,duration\n0,1,100\x0c\n5,1,abc\n", "t.csv:2: control character '\\x0c'"),
    # Runs of empty lines of every ending, skipped in one step each (sim/trace.py, _lines): counted.
    ("submit_time,num_gpus,duration\r\n\r\n\r\r0,1,100\r\n\n5,1,abc\n", "t.csv:7: duration 'abc' is not a number"),
    # Two columns for one role: the first was used without a word.
    ("submit_time,num_gpus,duration,duration_s\n0,1,100,5\n",
     "t.csv:1: the header names the duration twice, in columns 3 (duration) and 4 (duration_s)"),
    ("submit_time,num_gpus,duration\n0,1,100\nsubmit_time,num_gpus,duration\n5,1,100\n",
     "t.csv:3: the header of line 1 again (two traces joined?)"),
    # 1e300 replayed, printing a 300-digit makespan bound.
    (ITP + "a,0,1,bert,1,1,1,1e300\n", "t.csv:2: duration '1e300' is more than a year (31,536,000 s)"),
    (ITP + "a,1e300,1,bert,1,1,1,100\n", "t.csv:2: submit time '1e300' is more than 1e11 s"),
    ("m\tcmd\t-n\t1\t1e300\t0\t1\n", "t.csv:1: total steps '1e300' is more than 1e+13"),
    # The whole 100,000-digit field was in the message.
    (ITP + "a,0,1,bert,1,1," + "1" * 100_000 + ",100\n",
     f"GPU count {'1' * 40!r}... (100,000 characters) is not a finite number"),
    (ITP + "a,0,1," + "x" * 200_000 + ",1,1,1,100\n", "t.csv:2: a field longer than 131,072 characters"),
    # In the first line, the one the layout is detected from: a traceback (_csv.Error).
    ("x" * 200_000 + ",num_gpus\n0,1\n", "t.csv:1: unrecognised trace layout (a field longer than 131,072 characters)"),
    ("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,32,4,40,256\n",
     "t.csv:1: a Tiresias cluster description, not a job trace: give its size as --cluster 32x4"),
])
def test_a_bad_trace_is_one_short_line_naming_the_line(tmp_path: Path, text: str, says: str) -> None:
    err = _error(tmp_path, text)
    assert says in str(err) and len(str(err)) < 400 and str(err).isprintable(), str(err)


def test_skip_invalid_is_offered_only_where_it_helps(tmp_path: Path, gandiva: Any) -> None:
    """Every error with a line number ended in "(or --skip-invalid: leave out every job line...)",
    also those of the file as a whole (a header, a quote), which --skip-invalid does not change."""
    trace = tmp_path / "t.csv"
    for text, hint in ((ITP + "a,0,1,bert,1,1,0,100\n", True), ('submit_time,num_gpus,duration\n0,1,"100\n', False),
                       ("submit_time,num_gpus,duration,gpus\n0,1,100,1\n", False)):
        trace.write_text(text)
        r = gandiva("sim", "--trace", str(trace), "--no-progress", "--policy", "fifo")
        assert r.code == 2 and r.out == "" and r.err.count("\n") == 1, r
        assert ("--skip-invalid" in r.err) == hint, r.err
        assert "--skip-invalid" not in str(_error(tmp_path, text, skipped=[])) or hint


def test_offered_load_of_jobs_arriving_at_once_is_not_a_number_to_scale(tmp_path: Path, gandiva: Any) -> None:
    """It printed `offered load inf (use --target-load to change it)`, and --target-load then
    refused: all jobs arrive at the same time (Gavel's physical-cluster traces)."""
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,1,100\n0,2,100\n")
    r = gandiva("sim", "--trace", str(trace), "--no-progress", "--policy", "fifo", "-o", "json")
    assert r.code == 0 and "offered load: not defined (all jobs arrive at the same time; --target-load cannot" in r.err
    assert "inf" not in r.err


def test_plots_are_written_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fig.savefig wrote straight into the PNG: a run stopped while writing left a truncated
    file in place of the last good one."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from scheduler.policy.registry import get_policy
    from scheduler.policy.types import PolicyConfig
    from scheduler.sim.engine import Simulator
    from scheduler.sim.generator import generate
    from scheduler.sim.model import MechanismModel
    from scheduler.sim.plots import write_plots

    result = Simulator(generate(5, seed=1), make_cluster("2x4"), get_policy("fifo", PolicyConfig()),
                       MechanismModel.default()).run()
    (tmp_path / "jct_cdf.png").write_bytes(b"the last good plot")
    real = matplotlib.figure.Figure.savefig

    def stopped_half_way(self: Any, fname: Any, **kwargs: Any) -> None:
        Path(fname).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", stopped_half_way)
    with pytest.raises(KeyboardInterrupt):
        write_plots({"fifo": result}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jct_cdf.png"]
    assert (tmp_path / "jct_cdf.png").read_bytes() == b"the last good plot"
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", real)
    written = write_plots({"fifo": result}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_ctrl_c_in_a_replay_is_one_line_and_exit_130(gandiva: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.sim import engine

    def interrupted(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.Simulator, "run", interrupted)
    r = gandiva("sim", "--jobs", "5", "--no-progress")
    assert (r.code, r.out, r.err.splitlines()[-1]) == (130, "", "gandiva sim: interrupted")
    assert "Traceback" not in r.err


def test_a_format_that_is_not_the_files_says_what_it_reads_as(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(ITP + "a,0,1,bert,1,1,1,100\n")
    with pytest.raises(TraceError, match=r"t.csv:1: expected 7 tab-separated columns, got 1 \(--format gavel7; "
                                         r"the file's first line reads as itp: leave --format out\)"):
        read_trace_as(trace, "gavel7")
    assert read_trace_as(trace, "itp")[1] == "itp"


def test_a_generated_workload_is_bounded(gandiva: Any) -> None:
    """`--jobs 100000000` (a typo) generated for minutes, filling the memory."""
    r = gandiva("sim", "--jobs", "100000000", "--no-progress")
    assert (r.code, r.out) == (2, "") and "--jobs 100,000,000 is more than the generator makes (1,000,000" in r.err


def test_an_empty_trace_argument_or_a_directory_says_what_to_give(gandiva: Any, tmp_path: Path) -> None:
    """`--trace ""` was `.: cannot read trace: Is a directory`."""
    with pytest.raises(SystemExit) as exit_:
        gandiva("sim", "--trace", "", "--no-progress")
    assert exit_.value.code == 2
    r = gandiva("sim", "--trace", str(tmp_path), "--no-progress")
    assert r.code == 2 and f"{tmp_path}: a directory, not a trace file: give one of its traces" in r.err


def _tiny_traces(root: Path) -> Path:
    (root / "itp").mkdir(parents=True)
    (root / "itp" / "cluster01.csv").write_text(ITP + "a,0,1,bert,1,1,1,100\nb,10,1,bert,1,1,2,200\n")
    return root


def test_sim_table_json_is_checked_before_the_replay_and_written_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`benchmarks/sim_table.py --json` into a folder that does not exist failed after hours of
    replay, and an interrupted write left half a JSON file in place of the last whole one."""
    import importlib
    import json
    import sys

    root = Path(__file__).resolve().parents[3]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    sim_table = importlib.import_module("sim_table")
    traces = _tiny_traces(tmp_path / "traces")
    base = ["--traces", str(traces), "--min-jobs", "1", "--cluster", "2x4"]
    monkeypatch.setattr(sys, "argv", ["sim_table.py", *base, "--json", str(tmp_path / "no" / "x.json")])
    assert sim_table.main() == 2
    assert "cannot write there (no writable folder" in capsys.readouterr().err
    out = tmp_path / "x.json"
    out.write_text('{"the last": "whole file"}')
    monkeypatch.setattr(sys, "argv", ["sim_table.py", *base, "--json", str(out)])

    def interrupted(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])  # half of it written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sim_table.main()
    assert json.loads(out.read_text()) == {"the last": "whole file"} and sorted(tmp_path.iterdir()) == [traces, out]
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["sim_table.py", *base, "--json", str(out)])
    assert sim_table.main() == 0 and "cluster01" in json.loads(out.read_text())


def test_trace_text_in_messages_is_not_rich_markup(tmp_path: Path, gandiva: Any) -> None:
    """A model named `[/m]` ended the replay in a MarkupError traceback; a job id `[red]y` was
    shown as `y`."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration,model\n[red]y,0,1,900,[/m]\nb,5,1,100,[/m]\n")
    r = gandiva("sim", "--trace", str(trace), "--no-progress", "--policy", "fifo", "-o", "json")
    assert r.code == 0 and "Traceback" not in r.err, r
    assert "(e.g. '[/m]')" in r.err and "job t-[red]y (1 GPU)" in r.err


@pytest.mark.parametrize(("table", "says"), [
    ('{"v100": {"x": 1}}', "v100['x']: the key is not \"('JOB TYPE', SCALE FACTOR)\""),  # was an ast error
    ('{"v100": {"(\'R\', 1)": {"null": NaN}}}', "['null']: nan is not a rate"),  # replayed as measured
    ('{"v100": {"(\'R\', 1)": {"null": -5}}}', "['null']: -5 is not a rate"),
    ('{"v100": {"(\'R\', 1)": {"null": 2, "(\'S\', 1)": [1]}}}', "[1] is not a pair of rates"),
    # a replay packing R beat the makespan lower bound it printed (4,104 s < 6,003 s)
    ('{"v100": {"(\'R\', 1)": {"(\'R\', 1)": [3, 3], "null": 2}}}',
     "v100[\"('R', 1)\"][\"('R', 1)\"]: packed rate 3 is above the job's rate alone (\"null\": 2)"),
])
def test_a_throughput_table_that_is_not_measurements_is_named(tmp_path: Path, table: str, says: str) -> None:
    from scheduler.sim.model import MechanismModel

    path = tmp_path / "t.json"
    path.write_text(table)
    with pytest.raises(ValueError) as err:
        MechanismModel.from_gavel(path)
    assert str(err.value).startswith(f"{path}: v100") and says in str(err.value), str(err.value)


def test_the_shared_gavel_table_is_still_read() -> None:
    from scheduler.sim.model import MechanismModel

    table = Path(__file__).resolve().parents[4] / "shared" / "traces" / "gavel" / "simulation_throughputs.json"
    if not table.is_file():
        pytest.skip(f"{table} is not here (the shared traces live outside the repository)")
    for gpu_type in ("v100", "p100", "k80"):  # (none of its packed rates is above the rate alone)
        assert MechanismModel.from_gavel(table, gpu_type).knows("ResNet-50 (batch size 64)"), gpu_type


def test_a_trace_of_more_lines_than_the_memory_holds_is_refused_while_read(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """10 million lines of `0,1,100` (an 80 MB file, under the 1 GiB cap) took 7 GB and 107 s
    to read, and the replay filled the memory; the cap is scaled down here to keep the test short."""
    from scheduler.sim import trace

    monkeypatch.setattr(trace, "MAX_TRACE_LINES", 100)
    text = "submit_time,num_gpus,duration\n" + "# a comment\n\n" + "0,1,100\n" * 99
    (tmp_path / "ok.csv").write_text(text)
    assert len(read_trace_as(tmp_path / "ok.csv")[0]) == 99  # blank lines and comments do not count
    err = _error(tmp_path, text + "0,1,100\n")
    assert "/t.csv:103: more than 100 lines: the simulator holds every job in memory" in str(err), str(err)


def test_a_line_without_end_is_refused_while_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One endless line (a stream of digits, a binary export without NUL bytes) was read
    whole, up to the 1 GiB cap, before it was refused: 629 MB took 1.9 GB and 10 s first.
    It is refused once the line passes MAX_LINE_BYTES (scaled down here to keep the test
    short), naming its line; JSON (one line may be a whole Philly log) is not held to it."""
    import os
    import threading

    from scheduler.sim import trace

    monkeypatch.setattr(trace, "MAX_LINE_BYTES", 1 << 18, raising=False)  # (raising: before it was)

    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    sent = [0]

    def write() -> None:
        try:
            with open(fifo, "wb") as out:
                out.write(b"submit_time,num_gpus,duration\n0,1,")
                while sent[0] < 4096 * trace.MAX_LINE_BYTES:  # (the 1 GiB cap)
                    out.write(b"1" * (1 << 20))
                    sent[0] += 1 << 20
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with pytest.raises(TraceError) as err:
        read_trace_as(fifo)
    writer.join(30)
    assert "t.csv:2: a line longer than " in str(err.value), str(err.value)
    assert sent[0] <= 16 << 20, sent[0]
    import json

    job = {"status": "Pass", "vc": "vc1", "user": "u1", "submitted_time": "2017-10-03 10:00:00", "attempts": [
        {"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 11:00:00",
         "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}
    log = json.dumps([{**job, "jobid": f"application_{i}"} for i in range(1_500)])  # Philly's, on one line
    assert len(log) > trace.MAX_LINE_BYTES
    (tmp_path / "philly.json").write_text(log)
    assert len(read_trace_as(tmp_path / "philly.json")[0]) == 1_500
