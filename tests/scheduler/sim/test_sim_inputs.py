"""`gandiva sim` on traces as users hand them over: compressed, piped in on standard input, and
which reader took the file said in one line."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from gandiva_cli.main import main
from scheduler.sim import trace as trace_module
from scheduler.sim.trace import TraceError, read_trace, read_trace_as

TRACE = "job_id,num_gpu,submit_time,duration\na,1,0,60\nb,2,10,30\nc,1,20,90\n"


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err.replace("\n", " ")


@pytest.mark.parametrize("suffix,pack", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)])
def test_a_compressed_trace_is_read_as_the_plain_one(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     suffix: str, pack: object) -> None:
    """t.csv.gz (.bz2, .xz) replays the jobs of t.csv, named alike (t-a, not t.csv-a), and the
    CLI says it read it decompressed and as which format."""
    plain = tmp_path / "t.csv"
    plain.write_text(TRACE)
    packed = tmp_path / f"t.csv{suffix}"
    packed.write_bytes(pack(TRACE.encode()))  # type: ignore[operator]
    assert read_trace(packed) == read_trace(plain)
    assert [j.id for j in read_trace(packed)] == ["t-a", "t-b", "t-c"]
    code, out, err = _sim(capsys, "--trace", str(packed), "--cluster", "1x4", "-o", "json")
    name = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[suffix]
    assert code == 0 and '"jobs_finished": 3' in out
    assert f"read {packed} ({name}-compressed) as a tiresias trace (detected; --format chooses another)" in err


def test_archives_and_damaged_compressed_traces_are_one_line(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """A .tar.gz (how traces are published) says to extract it; a zip too; a gzip file cut
    short (a broken download) says so. Before: 'NUL byte at byte 8 ... decompress it first'."""
    plain = tmp_path / "t.csv"
    plain.write_text(TRACE)
    archive = tmp_path / "traces.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(plain, arcname="t.csv")
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(TRACE.encode() * 50)[:40])
    zipped = tmp_path / "t.zip"
    zipped.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    for path, said in ((archive, "a tar archive (gzip-compressed): extract it (tar xf traces.tar.gz)"),
                       (cut, "gzip data is damaged or cut short"), (zipped, "a zip archive: unzip it")):
        code, out, err = _sim(capsys, "--trace", str(path), "--cluster", "1x4")
        assert code == 2 and out == "", path
        assert err.startswith(f"gandiva sim: error: {path}: {said}") and err.count("error") == 1, err


def test_a_trace_on_standard_input(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`zcat t.csv.gz | gandiva sim --trace -` replays it (jobs named stdin-...); before:
    "-: cannot read trace: No such file or directory". A terminal is refused, not waited on."""
    piped = tmp_path / "piped"
    piped.write_bytes(gzip.compress(TRACE.encode()))
    with piped.open("rb") as fh:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(fh))
        code, out, err = _sim(capsys, "--trace", "-", "--cluster", "1x4", "--policy", "fifo", "-o", "json",
                              "--jobs-csv", str(tmp_path / "rows.csv"))
    assert code == 0 and '"jobs_finished": 3' in out, err
    assert "read standard input (gzip-compressed) as a tiresias trace" in err
    assert "fifo,stdin-a,finished" in (tmp_path / "rows.csv").read_text()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    code, out, err = _sim(capsys, "--trace", "-", "--cluster", "1x4")
    assert code == 2 and "standard input is a terminal; pipe the trace in" in err


def test_the_format_said_names_a_given_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,60\n5,2,30\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--format", "csv", "--cluster", "1x4", "-o", "json")
    # Without a header the fields are taken by their place: said, as a file of other columns
    # in that order (submit, duration, GPUs) replays wrongly without another word.
    assert code == 0 and (f"read {trace} as a csv trace without a header, its columns taken in the order "
                          f"submit_time,num_gpus,duration[,model] (--format)") in err
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n5,2,30\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "-o", "json")
    assert code == 0 and f"read {trace} as a csv trace (detected; --format chooses another)" in err
    assert "2 jobs on 1x4 (4 GPUs)" in err
    trace.write_text("submit_time,num_gpus,duration\n0,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x1", "-o", "json")
    assert code == 0 and "1 job on 1x1 (1 GPU)" in err  # ("1 jobs on" before)
    empty = tmp_path / "x.gz"
    empty.write_bytes(gzip.compress(b"\n# a comment\n"))
    with pytest.raises(TraceError, match="trace is empty"):
        read_trace(empty)


@pytest.mark.parametrize("header,row_a,row_b", [
    ("job_id,submitted,gpus,duration", "a,0,1,60", "b,10,2,30"),
    ("id,submit,n_gpus,runtime", "a,0,1,60", "b,10,2,30"),
    ("job_name,submitted_time,gpu_count,duration_seconds", "a,0,1,60", "b,10,2,30"),
    ("job_id,submit_time_secs,num_gpus,runtime_sec", "a,0,1,60", "b,10,2,30"),
    ("job_id,submit_time,num_gpus,duration_min", "a,0,1,1", "b,10,2,0.5"),
    ("job_id,submit_time_ms,num_gpus,duration_ms", "a,0,1,60000", "b,10000,2,30000"),
    ("job_id,duration_hours,num_gpus,arrival_time_min", "a,0.0166666666666666667,1,0", "b,0.00833333333333333333,2,0.16666666666666667"),
    ("JOB_ID,Submit_Time_H,NUM_GPUS,Duration_Mins", "a,2021-03-01 10:00:00,1,1", "b,2021-03-01 10:00:10,2,0.5"),
    ("Job ID,Submit time (s),GPU count,Duration (min)", "a,0,1,1", "b,10,2,0.5"),
    ("job id,submit [ms],gpus,run time [h]", "a,0,1,0.01666666666666666667", "b,10000,2,0.00833333333333333333"),
    ("Job,Submit Time,# GPUs,Duration (sec)", "a,0,1,60", "b,10,2,30"),
])
def test_renamed_columns_and_units_named_in_the_header(tmp_path: Path, header: str, row_a: str, row_b: str) -> None:
    """Headers of other tools (`submitted`, `runtime`, `gpu_count`) and times in the unit the
    column's name gives (`duration_ms`, `submit_time_min`; a date stays a date) read as the
    same two jobs. Before: 'the header names no submit_time column' / 'no duration column'."""
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{row_a}\n{row_b}\n")
    jobs = read_trace(path)
    assert [(j.id, j.submit_time, j.num_gpus) for j in jobs] == [("t-a", 0, 1), ("t-b", pytest.approx(10), 2)]
    assert [j.duration_s for j in jobs] == [pytest.approx(60), pytest.approx(30)]


def test_a_time_past_its_bound_is_named_in_its_unit(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,num_gpus,duration_ms\na,0,1,3e13\n")
    with pytest.raises(TraceError, match=r"t.csv:2: duration '3e13' is more than a year \(31,536,000,000 ms\)"):
        read_trace(path)
    path.write_text("job_id,submit_time,num_gpus,wall\na,0,1,60\n")
    with pytest.raises(TraceError, match="names it: duration_ms, duration_min, duration_h"):
        read_trace(path)


ALI_POD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
           "scheduled_time\nopenb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n"
           "openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175\n")

ALI_2025 = ("instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,"
            "memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,"
            "deletion_time\ninstance_0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,\n")


@pytest.mark.parametrize("content,fmt,said", [
    (ALI_POD, "auto", "Alibaba GPU trace v2023, openb_pod_list (name,cpu_milli,"),
    (ALI_POD, "pai", "Alibaba GPU trace v2023, openb_pod_list (name,cpu_milli,"),
    ("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0227,32000,262144,0,\nopenb-node-0228,128000,786432,8,G3\n",
     "auto", "Alibaba GPU trace v2023, openb_node_list (sn,cpu_milli,memory_mib,gpu,model): a cluster description"),
    ("j1,t1,i1,w1,x1,Terminated,1590000000,1590003600,m1\n", "auto",
     "Alibaba PAI 2020 trace, pai_instance_table (job_name,task_name,inst_name,"),
    (ALI_2025, "auto", "Alibaba GPU trace v2025, disaggregated_DLRM_trace (instance_sn,role,app_name,"),
    # cluster-trace-v2018's batch_task (CPU jobs); before: "expected 3 or 4 CSV columns, got 9 ... an ITP,
    # Tiresias or Helios trace needs its header line"
    ("M1,1,j_1,1,Terminated,157213,157256,100,0.59\nR2_1,1,j_1,1,Terminated,157257,157300,100,0.59\n", "auto",
     "Alibaba cluster-trace-v2018 batch_task (task_name,instance_num,job_name,task_type,status,start_time,end_time,"),
])
def test_alibaba_2023_and_pai_instance_tables_are_refused_saying_how_to_write_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, fmt: str, said: str) -> None:
    """Before: "the header names no submit_time column (nor ...)" for the v2023 pod list,
    "expected 3 or 4 CSV columns, got 9" for PAI's instance table."""
    trace = tmp_path / "ali.csv"
    trace.write_text(content)
    code, out, err = _sim(capsys, "--trace", str(trace), "--format", fmt)
    assert code == 2 and out == "" and err.count("gandiva sim") == 1
    assert err.startswith(f"gandiva sim: error: {trace}:1: {said}"), err
    if "pod_list" in said:
        assert "write one line per pod as --format csv: submit_time (creation_time), num_gpus (num_gpu" in err
        assert "duration (deletion_time - scheduled_time)" in err
        assert err.endswith("or give --fractional-gpus ceil to replay it so as it is ")


def test_an_alibaba_2023_pod_list_replays_with_fractional_gpus_ceil(tmp_path: Path) -> None:
    """Before: refused whatever was given. Now --fractional-gpus ceil replays a job per pod:
    num_gpu GPUs (a GPU-sharing pod, gpu_milli below 1000, holds 1: counted as rounded up),
    submitted at creation_time, running deletion_time - scheduled_time; CPU pods, pods never
    scheduled and pods still running at the end left out, each counted by its reason."""
    trace = tmp_path / "openb_pod_list_default.csv"
    trace.write_text(ALI_POD + "openb-pod-0023,4000,15258,0,0,,BE,Running,9679175,9973826,9679175\n"
                     "openb-pod-0024,4000,15258,2,1000,V100M16,LS,Pending,9679175,,\n"
                     "openb-pod-0025,4000,15258,1,1000,,LS,Running,9679180,,9679190\n"
                     "openb-pod-0026,4000,15258,1,500,,LS,Failed,9679180,9679300,9679200\n")
    left_out: list[TraceError] = []
    how: dict[str, str] = {}
    jobs, fmt = read_trace_as(trace, left_out=left_out, how=how, fractional="ceil")
    assert fmt == "pai" and how["rounded"] == "2"
    assert [(j.id, j.num_gpus, j.submit_time, j.duration_s) for j in jobs] == [
        ("openb_pod_list_default-openb-pod-0017", 8, 9437497.0, 1332357.0),
        ("openb_pod_list_default-openb-pod-0022", 1, 9679175.0, 294651.0),
        ("openb_pod_list_default-openb-pod-0026", 1, 9679180.0, 100.0)]
    assert [(e.line, e.reason.split(" (")[0]) for e in left_out] == [
        (4, "a CPU pod"), (5, "never scheduled"), (6, "no deletion_time")]
    trace.write_text(ALI_POD + "openb-pod-0017,1,1,1,1000,,LS,Running,5,3,4\n")
    with pytest.raises(TraceError, match=r":4: pod 'openb-pod-0017' is also on line 2"):
        read_trace(trace, fractional="ceil")


@pytest.mark.parametrize("content,said", [
    ('{\n  "v100": {\n    "(\'ResNet-18 (batch size 16)\', 1)": {\n      "null": 4.79\n    }\n  }\n}\n',
     "a Gavel throughput table (simulation_throughputs.json), not a trace: give it as --throughputs FILE"),
    ('{\n    "philly": ["500:0:0"]\n}\n',
     "a Gavel cluster spec (cluster_specs.json: GPUs of each type, v100:p100:k80), not a trace: give the cluster"),
    # kubectl get pods -o json (and -o json of one pod); before: "JSON, not a trace this reader knows"
    (('{\n    "apiVersion": "v1",\n    "items": [\n        {\n            "apiVersion": "v1",\n            "kind": '
     '"Pod"\n        }\n    ],\n    "kind": "List"\n}\n'),
     "a Kubernetes object list (kubectl get pods -o json), not a trace: write one line per pod as CSV"),
    ('{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}', "a Kubernetes object list (kubectl get pods"),
    # kubectl get pods -o yaml, and its table; before: "one column only, no comma or tab between its fields: a
    # CSV trace separates them with commas, a Gavel trace with tabs (were its tabs turned into spaces?"
    ("apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\n",
     "a Kubernetes object dump (kubectl get pods as YAML or a table), not a trace: write one line per pod as CSV"),
    ("NAME          READY   STATUS    RESTARTS   AGE\ntrain-0       1/1     Running   0          5d\n",
     "a Kubernetes object dump (kubectl get pods as YAML or a table)"),
    # a PBS/Torque accounting log; before: "one column only, its fields separated by ';': save the trace with commas"
    (("04/01/2021 10:00:00;Q;123.pbs01;queue=gpu\n04/01/2021 11:00:00;E;123.pbs01;user=ann qtime=1617271200 "
     "Resource_List.ngpus=4 resources_used.walltime=00:59:00\n"),
     "a PBS/Torque accounting log (DATE;RECORD;JOBID;key=value ...), not a trace this reader knows: write one line"),
    # sacct --json (Slurm 21+): before, "JSON, not a trace this reader knows"
    (('{\n  "meta": {"plugin": {"type": "openapi/v0.0.37"}, "Slurm": {"release": "23.02.6"}},\n  "jobs": [\n    '
     '{"job_id": 1, "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 4}]}}\n  ]\n}\n'),
     "a Slurm sacct --json export, not a trace this reader knows: export it as text, sacct -P -o JobID,"),
])
def test_the_gavel_files_beside_its_traces_are_named_when_given_as_a_trace(tmp_path: Path, content: str,
                                                                           said: str) -> None:
    """Before: "JSON, not a trace this reader knows: write it as CSV ..." for both."""
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=re.escape(f"x.json:1: {said}")):
        read_trace(path)


def test_a_large_trace_is_said_before_its_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100-MB trace took ~20 s to read with nothing printed; from LARGE_TRACE_BYTES (10 MiB) a
    line names it and its size first (lowered here so that the test stays small)."""
    trace = tmp_path / "itp.csv"
    trace.write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
                     "a1,0,7628,bert,5985,64,1,60\na2,5,7628,bert,5985,64,2,30\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "-o", "json")
    assert code == 0 and "reading" not in err and f"read {trace} as an itp trace (detected" in err
    monkeypatch.setattr("scheduler.sim.cli.LARGE_TRACE_BYTES", 100)
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "-o", "json")
    assert code == 0 and err.startswith(f"reading {trace} (0 MB)... read {trace} as an itp trace"), err


def test_durations_on_a_clock_as_slurm_writes_them(tmp_path: Path) -> None:
    """sacct's Elapsed (`01:00:00`, `1-00:00:00`) is a duration; before: "duration '01:00:00' is not
    a number" / "the header names no duration column" (Elapsed)."""
    path = tmp_path / "sacct.csv"
    path.write_text("JobID,Submit,Elapsed,NGPUS\n101,2023-01-01T10:00:00,01:00:00,1\n"
                    "102,2023-01-01T10:05:00,1-00:00:30.5,2\n103,2023-01-01T10:06:00,00:00:07,1\n")
    assert [(j.id, j.submit_time, j.num_gpus, j.duration_s) for j in read_trace(path)] == [
        ("sacct-101", 0, 1, 3600), ("sacct-102", 300, 2, 86430.5), ("sacct-103", 360, 1, 7)]
    for clock, said in (("00:00:00", "duration '00:00:00' must be positive"),
                        ("400-00:00:00", "duration '400-00:00:00' is more than a year"),
                        ("1:61:00", "duration '1:61:00' is not a number")):
        path.write_text(f"job_id,submit_time,num_gpus,duration\na,0,1,{clock}\n")
        with pytest.raises(TraceError, match=re.escape(f"sacct.csv:2: {said}")):
            read_trace(path)
    path.write_text("job_id,submit_time,num_gpus,duration\na,1614592800000,1,60\n")
    with pytest.raises(TraceError, match="divide by 1,000. or a date, or name the column submit_time_ms"):
        read_trace(path)


SACCT = """JobID|JobName|Submit|Start|End|Elapsed|AllocTRES|State
1001|train|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T11:05:00|01:00:00|billing=8,cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
1001.batch|batch|2024-03-01T10:05:00|2024-03-01T10:05:00|2024-03-01T11:05:00|01:00:00|cpu=8,gres/gpu=4,mem=64G,node=1|COMPLETED
1001.extern|extern|2024-03-01T10:05:00|2024-03-01T10:05:00|2024-03-01T11:05:00|01:00:00|billing=8,gres/gpu=4,node=1|COMPLETED
1001.0|python|2024-03-01T10:05:10|2024-03-01T10:05:10|2024-03-01T11:04:50|00:59:40|cpu=8,gres/gpu=4,node=1|COMPLETED
1002_4|sweep|2024-03-01T10:10:00|2024-03-01T10:10:05|2024-03-01T10:40:05|00:30:00|cpu=2,gres/gpu:a100=1,gres/gpu=1|FAILED
1003|prep|2024-03-01T10:20:00|2024-03-01T10:20:01|2024-03-01T10:25:01|00:05:00|billing=2,cpu=2,mem=8G,node=1|COMPLETED
1004|big|2024-03-01T10:30:00|Unknown|Unknown|00:00:00||PENDING
1005|run|2024-03-01T10:31:00|2024-03-01T10:32:00|Unknown|00:10:00|billing=8,cpu=8,gres/gpu=2,node=1|RUNNING
1006|cancel|2024-03-01T10:33:00|None|2024-03-01T10:34:00|00:00:00||CANCELLED by 0
1007|typed|2024-03-01T10:35:00|2024-03-01T10:35:00|2024-03-01T10:36:00|00:01:00|gres/gpu:a100=2,gres/gpu:v100=1|COMPLETED
"""


def test_a_slurm_sacct_export_is_read_as_users_hand_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`sacct -P -o JobID,JobName,Submit,Start,End,Elapsed,AllocTRES,State`: before, refused
    as "one column only, its fields separated by '|': save the trace with commas", which
    split AllocTRES apart. Now read by its header: GPUs from AllocTRES's gres/gpu, job steps
    (1001.batch, 1001.0) not jobs, an array task (1002_4) a job, jobs that never ran, CPU
    jobs and jobs still running left out, counted by reason."""
    trace = tmp_path / "sacct.txt"
    trace.write_text(SACCT)
    left_out: list[TraceError] = []
    how: dict[str, str] = {}
    jobs, _ = read_trace_as(trace, left_out=left_out, how=how)
    assert [(j.id, j.submit_time, j.num_gpus, j.duration_s) for j in jobs] == [
        ("sacct-1001", 0, 4, 3600), ("sacct-1002_4", 600, 1, 1800), ("sacct-1007", 2100, 3, 60)]
    assert how["steps"] == "3"
    assert [(e.line, e.reason.split(" (")[0]) for e in left_out] == [
        (7, "a CPU job"), (8, "never ran"), (9, "still running when exported"), (10, "never ran")]
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x4", "-o", "json")
    assert code == 0 and json.loads(out)["gandiva"]["jobs_left_out"] == 4, err
    assert "its 3 job step lines (123.batch, 123.0: parts of their job) are not jobs" in err
    # A record left out without a JobID is named by its line (was "sacct-", the trace's name and a dash).
    trace.write_text(SACCT + "|x|2024-03-01T10:40:00|Unknown|Unknown|00:00:00||PENDING\n")
    left_out.clear()
    read_trace_as(trace, left_out=left_out)
    assert [e.job_id for e in left_out][-2:] == ["sacct-1006", ""]
    # JobIDRaw (beside JobID or alone) and ElapsedRaw (seconds); AllocTRES before ReqTRES. Before:
    # "names the job_id twice" / 77.batch replayed as a job of its own.
    trace.write_text("JobIDRaw|User|Submit|ElapsedRaw|ReqTRES|AllocTRES\n"
                     "77|ann|2024-03-01T10:00:00|3600|cpu=1,gres/gpu=8|cpu=1,gres/gpu=2\n"
                     "77.batch|ann|2024-03-01T10:00:00|3600||cpu=1,gres/gpu=2\n")
    assert [(j.id, j.num_gpus, j.duration_s) for j in read_trace(trace)] == [("sacct-77", 2, 3600)]
    trace.write_text("JobID|JobIDRaw|Submit|Elapsed|AllocTRES\n5_1|6|0|60|gres/gpu=1\n5_2|7|0|60|gres/gpu=1\n")
    assert [j.id for j in read_trace(trace)] == ["sacct-5_1", "sacct-5_2"]
    # AllocTRES beside AllocGRES (and ReqGRES): was "the header names the alloc_tres twice".
    trace.write_text("JobID|Submit|Elapsed|ReqGRES|AllocGRES|AllocTRES\n8|0|60|gpu:4|gpu:2|cpu=1,gres/gpu=2\n")
    assert [j.num_gpus for j in read_trace(trace)] == [2]
    # What sacct writes otherwise is refused, saying how to export it.
    for text, said in (
            (SACCT.split("\n", 1)[1], "its fields separated by '|', and no header line naming them (sacct -P -n?)"),
            (SACCT.replace("|", ","), ("expected 7 or 8 CSV columns, got 12 (the header on line 1 names 8; a field "
                                      "with a comma must be quoted); sacct's AllocTRES holds commas")),
            (("JobID           JobName  Partition      State\n------------ ---------- ---------- ----------\n"
             "1001              train      gpu  COMPLETED\n"), "a table of fixed-width columns (sacct's default output")):
        trace.write_text(text)
        with pytest.raises(TraceError, match=re.escape(said)):
            read_trace(trace)
    trace.write_text("JobID|JobName|Submit|Elapsed|AllocTRES\n1|a|b|0|01:00:00|cpu=1,gres/gpu=1\n")
    with pytest.raises(TraceError, match=re.escape("got 6 (the header on line 1 names 5; a field with a comma must be "
                                                   "quoted); a field holds a | (a JobName?): leave JobName out of")):
        read_trace(trace)


@pytest.mark.parametrize("header", ["jobId,submitTime,numGpus,duration", "job-id,submit-time,num-gpus,duration",
                                    "Job ID,Submit Time,Num GPUs,Duration"])
def test_header_names_in_camel_case_or_with_hyphens(tmp_path: Path, header: str) -> None:
    """Before: "the header names no num_gpu column" for `numGpus` and `num-gpus`."""
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\na,0,2,60\n")
    assert [(j.id, j.num_gpus, j.duration_s) for j in read_trace(path)] == [("t-a", 2, 60)]


def test_a_philly_machine_list_is_named_as_a_cluster_description(tmp_path: Path) -> None:
    path = tmp_path / "cluster_machine_list"
    path.write_text("machineId,number of GPUs,single GPU mem\nm1,8,24GB\nm2,2,12GB\n")
    with pytest.raises(TraceError, match=re.escape("cluster_machine_list:1: a machine list (Philly's cluster_machine_"
                                                   "list: machineId,number of GPUs,...), a cluster description")):
        read_trace(path)


def test_dates_written_year_first_with_slashes(tmp_path: Path) -> None:
    """`2021/03/01 10:00:00` (many schedulers' logs) was "neither seconds nor an ISO 8601 date";
    a day-or-month-first date (03/01/2021) stays refused: which is the month is not known."""
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,num_gpus,duration\na,2021/03/01 10:00:00,1,60\nb,2021/03/01 10:01:00,1,60\n")
    assert [(j.id, j.submit_time) for j in read_trace(path)] == [("t-a", 0), ("t-b", 60)]
    path.write_text("job_id,submit_time,num_gpus,duration\na,03/01/2021 10:00:00,1,60\n")
    with pytest.raises(TraceError, match="t.csv:2: submit time '03/01/2021 10:00:00' is neither seconds nor an ISO"):
        read_trace(path)


def test_a_gavel_trace_on_standard_input_takes_no_table_from_the_current_folder(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--trace -` looked for simulation_throughputs.json around the current folder, as if the
    trace were there: any table lying there timed the steps, without a word. Now standard input
    has no folder: the note says so and --throughputs FILE picks the table."""
    (tmp_path / "simulation_throughputs.json").write_text('{"v100": {"(\'LM (batch size 20)\', 1)": {"null": 2.0}}}')
    piped = tmp_path / "piped"
    piped.write_text("LM (batch size 20)\tpython3 lm.py\t-n\t1\t1200\t0.000000\t1\n")
    monkeypatch.chdir(tmp_path)
    with piped.open("rb") as fh:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(fh))
        code, _, err = _sim(capsys, "--trace", "-", "--cluster", "1x4", "--policy", "fifo", "-o", "json")
    assert code == 0 and "read from standard input, it has no folder to find simulation_throughputs.json in" in err
    assert "rates from built-in defaults" in err


def test_a_scheduler_log_of_start_and_end_times(tmp_path: Path) -> None:
    """A log with Start and End but no duration (sacct, a Philly-like CSV) was refused ("add a
    duration column of end_time - start_time"); now its run time is End - Start, in the
    columns' unit or as dates, and a line that cannot give one says why."""
    path = tmp_path / "log.csv"
    path.write_text("JobID,Submit,Start,End,NGPUS\n1,2023-01-01T10:00:00,2023-01-01T10:05:00,2023-01-01T11:05:00,1\n"
                    "2,2023-01-01T10:01:00,2023-01-01T10:02:00,2023-01-01T10:02:30.5,2\n")
    assert [(j.id, j.submit_time, j.duration_s) for j in read_trace(path)] == [("log-1", 0, 3600), ("log-2", 60, 30.5)]
    path.write_text("job_id,submit_time,start_time_ms,end_time_ms,num_gpus\nj1,0,5000,65000,4\n")
    assert [j.duration_s for j in read_trace(path)] == [60]
    assert [j.duration_s for j in read_trace(path, "helios")] == [60]  # (a KeyError traceback, found by fuzzing)
    for start, end, said in (("5", "", "end_time is missing (a job that never started, or still ran at the end"),
                             ("5", "5", "end_time '5' is not after start_time '5': a job of no length"),
                             ("5", "2023-01-01T10:00:00", "start_time and end_time are not of one kind"),
                             ("0", "4e7", "it ran 40,000,000 s (end_time - start_time), more than a year")):
        path.write_text(f"job_id,submit_time,start_time,end_time,num_gpus\nj1,0,{start},{end},4\nj2,0,1,2,1\n")
        with pytest.raises(TraceError, match=re.escape(f"log.csv:2: {said}")):
            read_trace(path)
        skipped: list[TraceError] = []
        assert [j.id for j in read_trace_as(path, skipped=skipped)[0]] == ["log-j2"] and len(skipped) == 1


def test_a_dash_for_an_output_is_refused_not_a_file_named_dash(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--trace -` reading standard input, `--jobs-csv -` and `--plot -` wrote a file and a
    folder named '-' in the current folder after the whole replay; now refused at once."""
    monkeypatch.chdir(tmp_path)
    for flag, said in (("--jobs-csv", "- would be a file named '-'; give a file name (/dev/stdout writes the rows"),
                       ("--plot", "- would be a folder named '-'; give the folder to write the plots in")):
        with pytest.raises(SystemExit) as exit_:
            main(["sim", "--no-progress", "--jobs", "3", "--cluster", "1x4", flag, "-"])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_data_files_of_other_tools_are_named(tmp_path: Path) -> None:
    """A workbook, a Parquet/HDF5/Feather file (how datasets are shared): before, "NUL byte at
    byte N: not a text trace (a compressed file? ...)" or "a zip archive"; now named, with
    what to do."""
    book = tmp_path / "trace.xlsx"
    with zipfile.ZipFile(book, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/workbook.xml", "<workbook/>")
    cases = [(book, "an Excel workbook (.xlsx), not text: save it as CSV UTF-8"),
             (b"PAR1\x15\x04\x15\x00", "a Parquet file, not text: write it as CSV (pandas"),
             (b"\x89HDF\r\n\x1a\n\x00\x00", "an HDF5 file, not text: write it as CSV"),
             (b"ARROW1\x00\x00", "an Arrow/Feather file, not text: write it as CSV"),
             (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1\x00", "an Excel 97 workbook (.xls), not text: save it as CSV UTF-8")]
    for content, said in cases:
        path = content if isinstance(content, Path) else tmp_path / "data.bin"
        if isinstance(content, bytes):
            path.write_bytes(content)
        with pytest.raises(TraceError, match=re.escape(f"{path}: {said}")):
            read_trace(path)
    # A text trace that starts with the letters of a magic is text.
    for first in ("BZh_job", "PAR1_job", "ARROW1_id"):
        path = tmp_path / "text.csv"
        path.write_text(f"{first},submit_time,num_gpus,duration\nx,0,1,60\n")
        assert len(read_trace(path)) == 1


def test_acme_trace_reads_as_helios_its_cpu_jobs_left_out(tmp_path: Path) -> None:
    """Shanghai AI Lab's AcmeTrace (trace_seren.csv): Helios's columns and more, dates at +08:00."""
    path = tmp_path / "trace_seren.csv"
    path.write_text("job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,"
                    "gpu_time\n5778432,u5907,1,8,128,Other,FAILED,2023-03-01 00:18:22+08:00,2023-03-01 00:18:54+08:00,"
                    "2023-03-01 00:20:51+08:00,117,32,936.0\n5778470,u5908,0,0,16,Other,COMPLETED,2023-03-01 "
                    "00:24:58+08:00,2023-03-01 00:25:11+08:00,2023-03-01 01:09:04+08:00,2600,13,0\n"
                    "5778469,u5907,1,8,128,Other,COMPLETED,2023-03-01 00:23:58+08:00,2023-03-01 00:24:11+08:00,"
                    "2023-03-01 01:09:04+08:00,2693,13,21544.0\n")
    left_out: list[TraceError] = []
    jobs, fmt = read_trace_as(path, left_out=left_out)
    assert fmt == "helios" and [(j.id, j.submit_time, j.num_gpus, j.duration_s) for j in jobs] == [
        ("trace_seren-5778432", 0, 8, 117), ("trace_seren-5778469", 336, 8, 2693)]
    assert [e.reason for e in left_out] == ["a CPU job (gpu_num 0): no GPU job to replay"]


def test_a_spreadsheets_empty_rows_are_blank_lines(tmp_path: Path) -> None:
    """Rows of empty fields only (`,,,`, as a spreadsheet saves its unused rows) stopped the read:
    "job id is missing" / "submit time is missing"; now they are blank lines."""
    path = tmp_path / "t.csv"
    path.write_text(",,,\r\njob_id,submit_time,num_gpus,duration\r\na,0,1,60\r\n,,,\r\nb,5,1,60\r\n,,,\r\n,,,\r\n")
    assert [(j.id, j.submit_time) for j in read_trace(path)] == [("t-a", 0), ("t-b", 5)]
    path.write_text("0,1,60\n,,\n5,2,30\n")
    assert [(j.id, j.num_gpus) for j in read_trace(path)] == [("t-0", 1), ("t-1", 2)]
    path.write_text(",,\n\n,,\n")
    with pytest.raises(TraceError, match="t.csv: trace is empty"):
        read_trace(path)


def test_a_url_as_the_trace_says_to_download_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "https:/host/t.csv: cannot read trace: No such file or directory" (the path's // folded)."""
    url = "https://example.org/traces/cluster_log.csv.gz"
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "--no-progress", "--trace", url])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"{url} is a URL: download the trace first (curl -LO {url})" in err
    assert f"curl -sL {url} | gandiva sim --trace -" in err


def test_the_first_row_of_a_file_without_a_header_names_the_order_it_was_read_in(tmp_path: Path) -> None:
    """`job_1,0,1,60` (an id first, no header) was "submit time 'job_1' is neither seconds nor an ISO
    8601 date" only: now it says which order a header-less row is read in and to name the columns."""
    path = tmp_path / "t.csv"
    path.write_text("job_1,0,1,60\njob_2,5,2,30\n")
    with pytest.raises(TraceError, match=re.escape(
            "t.csv:1: submit time 'job_1' is neither seconds nor an ISO 8601 date (e.g. 2021-03-01 10:00:00) (without "
            "a header line its columns are taken in the order submit_time,num_gpus,duration[,model]: name them")):
        read_trace(path)
    path.write_text("0,1,60\n0,0,5\n")  # a later row's error is that row's own
    with pytest.raises(TraceError, match=r"t.csv:2: GPU count '0' must be at least 1$"):
        read_trace(path)


def test_a_pollux_workload_and_excel_serial_dates_are_named(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """A Pollux/AdaptDL workload (no job length): before, "the header names none of the
    columns this reader knows", now named, saying what to write. Excel serial dates in the
    submit column (44256.5 = 2021-03-01 12:00): before replayed as seconds without a word."""
    trace = tmp_path / "workload.csv"
    trace.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,1,128\n")
    with pytest.raises(TraceError, match=re.escape("workload.csv:1: a Pollux/AdaptDL workload (name,time,application,"
                                                   "num_replicas,batch_size): it gives no job length")):
        read_trace(trace)
    trace.write_text("job_id,submit_time,num_gpus,duration\na,44256.5,1,3600\nb,44256.75,2,600\nc,44257,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "-o", "json")
    assert code == 0
    assert ("warning: every submit time is between 25,569 and 73,051, some with a fraction: Excel serial dates (days "
            "since 1899-12-30)? 44256.5 would be 2021-03-01 12:00:00") in err
    trace.write_text("job_id,submit_time,num_gpus,duration\na,44256.5,1,3600\nb,144256.75,2,600\n")  # seconds
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "-o", "json")
    assert code == 0 and "Excel" not in err


def test_pais_two_gb_instance_table_is_named_not_said_to_be_split(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """pai_instance_table.csv is 1.98 GB: before, "larger than 1024 MiB; split the trace", and
    split, each part was then refused as a table that holds no GPU counts."""
    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 1 << 20)
    trace = tmp_path / "pai_instance_table.csv"
    trace.write_text("j1,t1,i1,w1,x1,Terminated,1590000000,1590003600,m1\n" * 30_000)
    with pytest.raises(TraceError, match=re.escape("pai_instance_table.csv:1: Alibaba PAI 2020 trace, "
                                                   "pai_instance_table (")):
        read_trace(trace)
    trace.write_text("0,1,60\n" * 200_000)  # any other file over the cap is still said to be
    with pytest.raises(TraceError, match="larger than 1 MiB; split the trace"):
        read_trace(trace)
