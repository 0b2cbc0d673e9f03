"""Trace readers: every supported layout, clear errors naming file and line, the real traces."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from scheduler.sim.trace import TraceError, read_trace, read_trace_as

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
    ("0,1,60\n\n10,1\n", "g.csv:3: expected 3 or 4 CSV columns, got 2 (submit_time,num_gpus,duration[,model])"),
    ("0,1,-5\n", "g.csv:1: duration '-5' is negative"),
])
def test_bad_line_error_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(_write(tmp_path, "g.csv", text))


@pytest.mark.parametrize("variant", [
    pytest.param(lambda t: t.replace("\n", "\r\n"), id="crlf"),
    pytest.param(lambda t: t.replace("\n", "\t \n"), id="trailing-tab"),
    pytest.param(lambda t: "# exported\njob_type\tcommand\tnum_steps_arg\tneeds_data_dir\ttotal_steps\t"
                           "arrival_time_s\tscale_factor\n\n" + t, id="comment-and-header"),
])
def test_a_gavel_export_with_other_line_ends_or_a_header_reads_the_same(tmp_path: Path, variant) -> None:  # type: ignore[no-untyped-def]
    jobs = read_trace(_write(tmp_path, "a.trace", variant(GAVEL7)))
    assert [(j.model, j.num_gpus, j.total_steps, j.submit_time) for j in jobs] == [
        ("LM (batch size 20)", 1, 1200, 0.0), ("ResNet-50 (batch size 64)", 4, 5000, 30.0)]


def test_bad_gavel_line_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"a.trace:2: expected 7 tab-separated columns, got 3"):
        read_trace(_write(tmp_path, "a.trace", GAVEL7.splitlines()[0] + "\nx\ty\tz\n"))


def test_an_endless_stream_is_refused_and_a_pipe_is_read_once(tmp_path: Path) -> None:
    """--trace /dev/zero read until memory ran out; --trace <(zcat ...) was read twice."""
    if Path("/dev/zero").exists():
        with pytest.raises(TraceError, match="^/dev/zero: NUL byte at byte 0: not a text trace"):
            read_trace("/dev/zero")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(ITP))
    writer.start()
    jobs, fmt = read_trace_as(fifo)
    writer.join(10)
    assert fmt == "itp" and [j.num_gpus for j in jobs] == [1, 8]


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


# Another cluster's export of the same jobs: each variant must replay exactly these jobs.
ITP_JOBS = [("cluster99-a1", 10.0, 1, "bert", 1265.0), ("cluster99-b2", 0.0, 8, "resnet50", 2066.0)]
ITP_HEAD = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration"
ITP_ROWS = ["a1,10,7628,bert,5985,64,1,1265", "b2,0,14137,resnet50,6955,64,8,2066"]
TIRESIAS_HEAD = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"
TIRESIAS_ROWS = ["a1,1,10,606,bert,1265,30", "b2,8,0,133,resnet50,2066,23"]


def _itp(head: str = ITP_HEAD, rows: list[str] = ITP_ROWS, end: str = "\n") -> bytes:
    return end.join([head, *rows, ""]).encode()


@pytest.mark.parametrize(("content", "fmt"), [
    pytest.param(b"\xef\xbb\xbf" + _itp(), "auto", id="byte-order-mark"),
    pytest.param(_itp(end="\r\n"), "auto", id="crlf"),
    pytest.param(_itp(head=ITP_HEAD.upper().replace(",", " , ")), "auto", id="header-case-and-spaces"),
    pytest.param(_itp("job_id,num_gpu,duration,submission_time,model_name",
                      ["a1,1,1265,10,bert", "b2,8,2066,0,resnet50"]), "auto", id="reordered-fewer-columns"),
    pytest.param(_itp(ITP_HEAD + ",user,queue", [r + ",alice,q1" for r in ITP_ROWS]), "auto", id="extra-columns"),
    pytest.param(b"# exported by cluster X\n\n" + _itp(rows=[ITP_ROWS[0], "", "  # a comment", ITP_ROWS[1]]),
                 "auto", id="comments-and-blank-lines"),
    pytest.param(_itp(rows=['"' + r.replace(",", '","') + '"' for r in ITP_ROWS]), "auto", id="quoted-fields"),
    pytest.param(_itp(rows=["a1,2021-03-01 10:00:10,7628,bert,5985,64,1,1265",
                            "b2,2021-03-01T10:00:00+00:00,14137,resnet50,6955,64,8,2066"]), "auto", id="iso-dates"),
    pytest.param(_itp(rows=ITP_ROWS[::-1]), "auto", id="unsorted"),
    pytest.param("\n".join(ITP_ROWS).encode(), "itp", id="itp-without-header"),
    pytest.param(_itp().replace(b",", b"\t"), "auto", id="tab-separated-with-header"),
    pytest.param("\n".join(ITP_ROWS).replace(",", "\t").encode(), "itp", id="tab-separated-without-header"),
    pytest.param(_itp(ITP_HEAD + ",user", [r + ",alice" for r in ITP_ROWS]), "auto", id="user-column"),
    pytest.param(_itp(TIRESIAS_HEAD, TIRESIAS_ROWS), "auto", id="tiresias-same-jobs"),
    pytest.param("\n".join(TIRESIAS_ROWS).encode(), "tiresias", id="tiresias-without-header"),
])
def test_another_clusters_export_replays_the_same_jobs(tmp_path: Path, content: bytes, fmt: str) -> None:
    path = tmp_path / "cluster99.csv"
    path.write_bytes(content)
    jobs = read_trace(path, fmt)
    assert [(j.id, j.submit_time, j.num_gpus, j.model, j.duration_s) for j in jobs] == ITP_JOBS[::-1]


@pytest.mark.parametrize(("content", "message"), [
    (_itp(rows=[ITP_ROWS[0], "a1,20,1,bert,1,1,2,60"]),
     "x.csv:3: job id 'a1' is also on line 2: job ids must be unique"),
    (_itp(rows=["a1,10,7628,bert,5985,64,1.5,1265"]), "x.csv:2: GPU count '1.5' is not a whole number"),
    (_itp(rows=["a1,10,7628,bert,5985,64,,1265"]), "x.csv:2: GPU count is missing"),
    (_itp(rows=["a1,10,7628,bert,5985,64,1,-3"]), "x.csv:2: duration '-3' is negative"),
    (_itp(rows=["a1,10,7628,resnet, 50,5985,64,1,1265"]), "x.csv:2: expected 8 ITP columns, got 9 (the header"),
    (_itp(TIRESIAS_HEAD, ["0,1,0,606,vgg19,0,30"]), "x.csv:2: duration '0' must be positive"),
    (_itp(rows=["a1,2021-03-01 10:00:10,7628,bert,5985,64,1,1265", "b2,5,1,bert,1,1,1,60"]),
     "x.csv:3: submit time '5' is a number of seconds but line 2's is a date"),
    (_itp(rows=["a1,-60,7628,bert,5985,64,1,1265"]), "x.csv:2: submit time '-60' is negative; shift the trace's"),
    (_itp(rows=["a1,03/01/2021,7628,bert,5985,64,1,1265"]),
     "x.csv:2: submit time '03/01/2021' is neither seconds nor an ISO 8601 date"),
    (_itp("job_id,submission_time,gpus_wanted,duration", ["a1,1,1,60"]),
     "x.csv:1: the header names no num_gpu column (nor num_gpus, gpus, gpu_num, gpu_count"),
    (b"time,count,length\n0,1,60\n", "x.csv:1: the header names none of the columns this reader knows"),
    (b'0,1,60\n"1,1,60\n', "x.csv:2: not a CSV line"),
    ("\n".join(ITP_ROWS).encode(), "x.csv:1: expected 3 or 4 CSV columns, got 8"),
    (b"# only a comment\n\n", "x.csv: trace is empty"),
    (_itp(rows=[]), "x.csv: trace has no jobs"),
    (b"\xef\xbb\xbfa\tb\tc\td\n", "x.csv:1: unrecognised trace layout (tab-separated with 4 columns"),
    (GAVEL7.replace("\t5000\t", "\t0\t").encode(), "x.csv:1: total steps '0' must be positive"),
    (b"\x1f\x8b\x08\x00\x12", "x.csv: gzip data is damaged or cut short"),
    (b"\x00\x01\x02", "x.csv: NUL byte at byte 0: not a text trace (a binary file or an archive?"),
    (b"job_id;submit_time;num_gpu;duration\na;0;1;60\n", "x.csv:1: one column only, its fields separated by ';'"),
    (GAVEL7.replace("\t", " ").encode(), "x.csv:1: one column only, no comma or tab between its fields: a CSV"),
])
def test_an_export_that_would_replay_wrongly_is_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(path)


# A cluster export in the shape of SenseTime's Helios traces: CPU jobs (0 GPUs), failed
# jobs of no length, a repeated id, a cut-off line, among the jobs that can be replayed.
HELIOS = (
    "job_id,user,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
    "j1,u1,8,48,1,COMPLETED,2020-04-01 00:00:05,2020-04-01 00:00:10,2020-04-01 02:00:10,7200,0\n"
    "j2,u2,1,6,1,COMPLETED,2020-04-01 00:10:00,2020-04-01 00:10:00,2020-04-01 00:40:00,1800,0\n"
    "j3,u3,0,6,1,COMPLETED,2020-04-01 00:12:00,2020-04-01 00:12:00,2020-04-01 00:40:00,1680,0\n"
    "j4,u3,2,6,1,FAILED,2020-04-01 00:13:00,2020-04-01 00:13:00,2020-04-01 00:13:00,0,0\n"
    "j5,u4,4,6,1,COMPLETED,2020-04-01 00:20:00,2020-04-01 00:20:00,2020-04-01 00:50:00,1800,0\n"
    "j2,u2,1,6,1,COMPLETED,2020-04-01 00:30:00,2020-04-01 00:30:00,2020-04-01 00:40:00,600,0\n"
    "j7,u3,0,6,1,COMPLETED,2020-04-01 00:42:00,2020-04-01 00:42:00,2020-04-01 00:50:00,480,0\n"
    "j8,u5,1,6\n"
)


def test_lines_that_cannot_be_replayed_stop_the_read_or_are_left_out_and_named(tmp_path: Path) -> None:
    """Helios's CPU jobs and jobs of duration 0 are no GPU job: left out always, counted
    apart; a repeated id or a cut-off line stops the read, or --skip-invalid leaves it out."""
    path = _write(tmp_path, "helios.csv", HELIOS)
    with pytest.raises(TraceError, match=r"helios.csv:7: job id 'j2' is also on line 3"):
        read_trace(path)
    skipped: list[TraceError] = []
    left_out: list[TraceError] = []
    jobs, fmt = read_trace_as(path, skipped=skipped, left_out=left_out)
    assert fmt == "helios"
    # The first j2 is kept, the repeat left out; dates become seconds after the earliest.
    assert [(j.id, j.num_gpus, j.submit_time, j.duration_s) for j in jobs] == [
        ("helios-j1", 8, 0.0, 7200.0), ("helios-j2", 1, 595.0, 1800.0), ("helios-j5", 4, 1195.0, 1800.0)]
    assert [(e.line, e.job_id, e.reason.split(" (")[0]) for e in left_out] == [
        (4, "helios-j3", "a CPU job"), (5, "helios-j4", "never ran"), (8, "helios-j7", "a CPU job")]
    assert [(e.line, e.reason.split(":")[0].split(" (")[0]) for e in skipped] == [
        (7, "job id 'j2' is also on line 3"),
        (9, "expected 10 or 11 Helios columns, got 4"),
    ]


def test_left_out_lines_do_not_rename_the_jobs_kept(tmp_path: Path) -> None:
    """Jobs of a layout without ids are named by their line once lines are left out, so
    the names of the jobs kept find their lines and do not depend on which others were
    left out; with none left out, the names are as without the flag."""
    gavel = GAVEL7 + "LM (batch size 20)\tpython3 lm.py\t-n\t1\t0\t40.000000\t1\n" \
        + "LM (batch size 20)\tpython3 lm.py\t-n\t1\t800\t50.000000\t2\n"
    skipped: list[TraceError] = []
    jobs, _ = read_trace_as(_write(tmp_path, "g.trace", gavel), skipped=skipped)
    assert sorted(j.id for j in jobs) == ["g-L1", "g-L2", "g-L4"]
    assert [e.line for e in skipped] == [3]
    clean = _write(tmp_path, "c.trace", GAVEL7)
    assert [j.id for j in read_trace_as(clean, skipped=[])[0]] == [j.id for j in read_trace(clean)]


def test_a_trace_with_no_job_left_says_why(tmp_path: Path) -> None:
    path = _write(tmp_path, "cpu.csv", "job_id,num_gpu,submit_time,duration\na,0,0,10\nb,0,5,10\n")
    with pytest.raises(TraceError, match=r"no job can be replayed: all 2 job lines were left out "
                                         r"\(the first: .*cpu.csv:2: GPU count '0' must be at least 1\)"):
        read_trace_as(path, skipped=[])
    # A file-level error is raised either way: nothing to leave out line by line.
    with pytest.raises(TraceError, match="the header names no"):
        read_trace_as(_write(tmp_path, "h.csv", "job_id,gpus,when\na,1,0\n"), skipped=[])
