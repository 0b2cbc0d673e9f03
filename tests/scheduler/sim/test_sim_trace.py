"""Trace readers: every supported layout, clear errors naming file and line, the real traces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler.sim.trace import TraceError, read_trace

TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(),
                                  reason=f"real traces not present at {TRACES.resolve()}")

GAVEL7 = "ResNet-50 (batch size 64)\tpython3 main.py\t-n\t1\t5000\t30.000000\t4\n" \
         "LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t0.000000\t1\n"
GAVEL10 = ("Transformer (batch size 128)\tpython3 t.py\ttranslation\t-step\t1\t346\t2\t3\t-1.0\t12\n")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_gavel_seven_column_trace_is_read_and_sorted_by_arrival(tmp_path: Path) -> None:
    jobs = read_trace(_write(tmp_path, "a.trace", GAVEL7))
    assert [(j.model, j.num_gpus, j.total_steps, j.submit_time) for j in jobs] == [
        ("LM (batch size 20)", 1, 1200, 0.0), ("ResNet-50 (batch size 64)", 4, 5000, 30.0)]


def test_gavel_ten_column_trace_keeps_priority_and_arrival(tmp_path: Path) -> None:
    (job,) = read_trace(_write(tmp_path, "p.trace", GAVEL10))
    assert (job.num_gpus, job.total_steps, job.priority, job.submit_time) == (2, 346, 3, 12.0)


def test_tiresias_csv_and_generic_csv(tmp_path: Path) -> None:
    tir = _write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                                    "0,1,0,606,vgg19,164,30\n1,8,30,133,vgg11,147,23\n")
    assert [(j.num_gpus, j.duration_s, j.model) for j in read_trace(tir)] == [
        (1, 164, "vgg19"), (8, 147, "vgg11")]
    gen = _write(tmp_path, "g.csv", "submit_time,num_gpus,duration,model\n5,2,600,lstm\n0,1,60\n")
    assert [(j.submit_time, j.num_gpus, j.duration_s, j.model) for j in read_trace(gen)] == [
        (0.0, 1, 60.0, ""), (5.0, 2, 600.0, "lstm")]


@pytest.mark.parametrize(("text", "message"), [
    ("0,1,60\n10,two,60\n", "g.csv:2: GPU count 'two' is not a number"),
    ("0,1,60\n10,0,60\n", "g.csv:2: GPU count '0' must be at least 1"),
    ("0,1,60\n\n10,1\n", "g.csv:3: expected submit_time,num_gpus,duration[,model], got 2 columns"),
    ("0,1,-5\n", "g.csv:1: duration '-5' is negative"),
])
def test_bad_line_error_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(_write(tmp_path, "g.csv", text))


def test_bad_gavel_line_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"a.trace:2: expected 7 tab-separated columns, got 3"):
        read_trace(_write(tmp_path, "a.trace", GAVEL7.splitlines()[0] + "\nx\ty\tz\n"))


def test_missing_and_empty_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.csv: cannot read trace"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="empty.csv: trace is empty"):
        read_trace(_write(tmp_path, "empty.csv", "\n"))


@needs_traces
def test_every_real_trace_reads() -> None:
    msr = sorted((TRACES / "gavel" / "traces" / "msr" / "seed=0").glob("*.trace"))
    assert sum(len(read_trace(p)) for p in msr) == 15264
    for path in (TRACES / "gavel" / "traces" / "physical_cluster").glob("*.trace"):
        assert read_trace(path)
    assert len(read_trace(TRACES / "tiresias" / "60_job.csv")) == 60


ITP = ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
       "b2,5016,14137,resnet50,6955,64,8,2066\n"
       "a1,5010,7628,bert,5985,64,1,1265\n")


def test_itp_trace_keeps_real_gpu_counts_and_durations(tmp_path: Path) -> None:
    jobs = read_trace(_write(tmp_path, "cluster99.csv", ITP))
    assert [(j.id, j.submit_time, j.num_gpus, j.model, j.duration_s) for j in jobs] == [
        ("cluster99-a1", 5010.0, 1, "bert", 1265.0), ("cluster99-b2", 5016.0, 8, "resnet50", 2066.0)]


@pytest.mark.parametrize(("row", "message"), [
    ("a,1,2,bert,3,4,1\n", "c.csv:2: expected 8 ITP columns, got 7"),
    ("a,1,2,bert,3,4,1,0\n", "c.csv:2: duration '0' must be positive"),
    ("a,1,2,bert,3,4,x,5\n", "c.csv:2: GPU count 'x' is not a number"),
])
def test_bad_itp_line_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(_write(tmp_path, "c.csv", ITP.splitlines(keepends=True)[0] + row))


@needs_traces
def test_every_itp_trace_reads() -> None:
    for path in sorted((TRACES / "itp").glob("cluster*.csv")):
        jobs = read_trace(path)
        assert len(jobs) > 200 and all(j.duration_s and j.duration_s > 0 for j in jobs)
