"""Other public deep-learning cluster traces a user brings to `gandiva sim`: Microsoft
Philly's cluster_job_log (read), SenseTime Helios (read; its CPU jobs left out, counted),
Alibaba PAI 2020 (refused in one line saying how to write it as CSV). The sample files are
written here from the published column layouts."""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gandiva_cli.main import main
from scheduler.sim.trace import TraceError, read_trace, read_trace_as

T0 = datetime(2017, 10, 3, 3, 0, 0)


def _at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def _philly_job(jobid: str, submit: int, attempts: list[tuple[int | None, int | None, list[int]]],
                status: str = "Pass") -> dict:
    """A cluster_job_log entry; each attempt (start, end, GPUs per machine), None: "None"."""
    return {"status": status, "vc": "vc1", "jobid": jobid, "user": "u1", "submitted_time": _at(submit),
            "attempts": [{"start_time": "None" if s is None else _at(s), "end_time": "None" if e is None else _at(e),
                          "detail": [{"ip": f"m{k}", "gpus": [f"gpu{g}" for g in range(n)]}
                                     for k, n in enumerate(machines)]}
                         for s, e, machines in attempts]}


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sim", "--no-progress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err.replace("\n", " ")


attempt = st.tuples(st.one_of(st.none(), st.integers(0, 5000)), st.one_of(st.none(), st.integers(0, 5000)),
                    st.lists(st.sampled_from([0, 1, 2, 4, 8]), max_size=3))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.lists(attempt, max_size=3),
                          st.sampled_from(["Pass", "Killed", "Failed"])), min_size=1, max_size=8))
def test_a_philly_job_log_is_read_as_its_attempts_ran(tmp_path_factory: pytest.TempPathFactory,
                                                      jobs: list[tuple[int, list, str]]) -> None:
    """GPUs: the most one attempt held; length: the attempts' run times added up; a job that
    never ran, held no GPU or ran 0 s is left out with its reason; the status is not read."""
    jobs = [(submit, [(s, e, m) for s, e, m in attempts if s is None or e is None or e >= s], status)
            for submit, attempts, status in jobs]
    path = tmp_path_factory.mktemp("philly") / "cluster_job_log"
    path.write_text(json.dumps([_philly_job(f"application_{i}", *job) for i, job in enumerate(jobs)], indent=1))
    expected, gone = {}, {}
    for i, (submit, attempts, _) in enumerate(jobs):
        done = [(s, e, sum(m)) for s, e, m in attempts if s is not None and e is not None]
        ran = sum(e - s for s, e, g in done if g)
        gpus = max((g for _, _, g in done), default=0)
        name = f"cluster_job_log-application_{i}"
        if not done:
            gone[name] = "never ran"
        elif not gpus:
            gone[name] = "held no GPU"
        elif ran <= 0:
            gone[name] = "ran 0 s"
        else:
            expected[name] = (submit, gpus, ran)
    left_out: list[TraceError] = []
    if not expected:
        with pytest.raises(TraceError, match=r"no job can be replayed: all \d+ jobs were left out"):
            read_trace_as(path, left_out=left_out)
        return
    read, fmt = read_trace_as(path, left_out=left_out)
    assert fmt == "philly"
    first = min(submit for submit, _, _ in expected.values())
    assert {j.id: (j.submit_time, j.num_gpus, j.duration_s) for j in read} == {
        name: (submit - first, gpus, ran) for name, (submit, gpus, ran) in expected.items()}
    assert {e.job_id: e.reason.split(" (")[0].split("' ", 1)[1] for e in left_out} == gone


def test_philly_through_gandiva_sim_counts_and_names_the_jobs_left_out(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    log = tmp_path / "cluster_job_log"
    log.write_text(json.dumps([
        _philly_job("application_1", 0, [(5, 3605, [2, 2])]),
        _philly_job("application_2", 10, [], "Killed"),
        _philly_job("application_3", 20, [(30, 630, [1]), (700, 1000, [1])], "Failed"),
        _philly_job("application_4", 30, [(40, 100, [])]),
        _philly_job("application_5", 40, [(50, None, [1])], "Killed"),
        {"jobid": "application_6", "submitted_time": "yesterday", "attempts": []},
    ]))
    jobs_csv = tmp_path / "jobs.csv"
    code, out, err = _sim(capsys, "--trace", str(log), "--cluster", "2x4", "--compare", "fifo,gandiva",
                          "-o", "json", "--jobs-csv", str(jobs_csv), "--skip-invalid")
    assert code == 0, err
    assert "note: left out 3 of 6 jobs, which the philly trace says are no GPU job to replay:" in err
    assert "2 like job 'application_2' never ran" in err and "1 like job 'application_4' held no GPU" in err
    for counts in json.loads(out).values():
        assert (counts["jobs_finished"], counts["jobs_left_out"]) == (2, 4)
    with jobs_csv.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["policy"] == "fifo"]
    # The job --skip-invalid left out is named by its place in the log (its row's job_id was "").
    assert {r["job_id"]: r["status"] for r in rows} == {
        "cluster_job_log-application_1": "finished", "cluster_job_log-application_3": "finished",
        "cluster_job_log-application_2": "left_out", "cluster_job_log-application_4": "left_out",
        "cluster_job_log-application_5": "left_out", "entry-6": "left_out"}
    done = {r["job_id"]: r for r in rows if r["status"] == "finished"}
    assert done["cluster_job_log-application_1"]["num_gpus"] == "4"
    assert done["cluster_job_log-application_3"]["num_gpus"] == "1"


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
              st.sampled_from(["None", "", "2017-10-03 03:04:35", "x", "application_1", "gpu0"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["jobid", "submitted_time", "attempts", "start_time", "end_time", "detail", "gpus",
                         "status"]), inner, max_size=5)), max_leaves=25)


@settings(max_examples=150, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=4))
def test_any_json_with_philly_keys_is_read_or_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                                  data: list) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "log.json"
    path.write_text('[{"jobid": "a", "attempts": []},\n' + json.dumps(data)[1:])
    try:
        jobs = read_trace(path, "philly")
    except TraceError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        return
    for job in jobs:
        assert job.num_gpus >= 1 and job.duration_s is not None and 0 < job.duration_s <= 365 * 86400
        assert math.isfinite(job.submit_time) and job.submit_time >= 0


HELIOS = ("job_id,user,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
          "j1,u1,8,48,1,COMPLETED,2020-04-01 00:00:10,2020-04-01 00:00:20,2020-04-01 01:00:20,3600,vc1\n"
          "j2,u2,0,4,1,COMPLETED,2020-04-01 00:01:00,2020-04-01 00:01:00,2020-04-01 00:02:00,60,vc1\n"
          "j3,u1,1,6,1,CANCELLED,2020-04-01 00:02:00,,2020-04-01 00:03:00,0,vc2\n"
          "j4,u3,2,12,1,FAILED,2020-04-01 00:05:00,2020-04-01 00:06:00,2020-04-01 00:16:00,600,vc2\n")


def test_helios_leaves_out_its_cpu_jobs_and_jobs_that_never_ran_counted(capsys: pytest.CaptureFixture[str],
                                                                       tmp_path: Path) -> None:
    trace = tmp_path / "cluster_log.csv"
    trace.write_text(HELIOS)
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "2x8", "--policy", "fifo", "-o", "json")
    assert code == 0, err
    assert "left out 2 of 4 job lines, which the helios trace says are no GPU job to replay:" in err
    assert "1 like line 3: a CPU job (gpu_num 0)" in err and "1 like line 4: never ran (duration 0" in err
    fifo = json.loads(out)["fifo"]
    assert (fifo["jobs_finished"], fifo["jobs_left_out"]) == (2, 2)
    code, out, _ = _sim(capsys, "--trace", str(trace), "--cluster", "2x8", "--policy", "fifo")
    # The table's row says they were left out without --skip-invalid (it said "(--skip-invalid)").
    assert code == 0 and [ln.split("│")[2].strip() for ln in out.splitlines()
                          if "jobs left out (no GPU job, or --skip-invalid)" in ln] == ["2"]
    # Without its header, --format helios reads its column order.
    bare = tmp_path / "bare.csv"
    bare.write_text(HELIOS.split("\n", 1)[1])
    with pytest.raises(TraceError, match="got 11 .*or --format itp/tiresias/helios"):
        read_trace(bare)
    jobs = read_trace(bare, "helios")
    assert [(j.id, j.num_gpus, j.submit_time, j.duration_s) for j in jobs] == [
        ("bare-j1", 8, 0.0, 3600.0), ("bare-j4", 2, 290.0, 600.0)]


PAI_JOB = "6f2a1c,inst-1,u9,Terminated,5083.0,5103.0\n7a1b2c,inst-2,u9,Failed,5100.0,\n"
PAI_TASK = ("6f2a1c,worker,1,Terminated,5083.0,5103.0,600.0,29.3,50.0,MISC\n"
            "7a1b2c,tensorflow,2,Terminated,5100.0,5200.0,600.0,29.3,100.0,T4\n")


@pytest.mark.parametrize(("content", "fmt", "table"), [
    (PAI_JOB, "auto", "pai_job_table (job_name,inst_id,user,status,start_time,end_time), which holds no GPU counts"),
    (PAI_TASK, "auto", "pai_task_table (job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,"),
    ("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n" + PAI_TASK,
     "auto", "pai_task_table ("),
    (PAI_TASK, "pai", "pai_task_table ("),
    ('"' + "a" * 200_000 + "\n", "pai", "pai_job_table/pai_task_table: not replayed"),  # was a csv.Error traceback
])
def test_alibaba_pai_tables_are_refused_in_one_line_saying_how_to_write_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, fmt: str, table: str) -> None:
    trace = tmp_path / "pai.csv"
    trace.write_text(content)
    code, out, err = _sim(capsys, "--trace", str(trace), "--format", fmt)
    assert code == 2 and out == ""
    assert err.startswith(f"gandiva sim: error: {trace}:1: Alibaba PAI 2020 trace, {table}")
    assert "as --format csv" in err and "plan_gpu / 100" in err and "rounded up to a whole GPU" in err
    assert err.count("gandiva sim") == 1
    # Which flag replays it as it is: the task table itself, or, for the others, that table.
    assert ("or give --fractional-gpus ceil to replay it so as it is" in err if "pai_task_table (" in table else
            "or give the pai_task_table with --fractional-gpus ceil" in err)


# Alibaba PAI 2020's pai_task_table in its published layout (no header): job A's one task
# holds half a GPU; B's 2 instances 1 GPU each, its parameter server no GPU (plan_gpu empty)
# and starts earlier; C is CPU only; D's GPU task never started; E's 3 instances 0.6 GPU each,
# on lines apart from its other task (0.1 x 3 = 0.30000000000000004 is not rounded above 2).
PAI_TASK_HEADER = "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type"
PAI_TASKS = ("a,worker,1.0,Terminated,5083.0,5103.0,600.0,29.3,50.0,MISC\n"
             "b,tensorflow,2.0,Terminated,5100.0,5200.0,600.0,29.3,100.0,T4\n"
             "b,ps,1.0,Terminated,5090.0,5210.0,600.0,29.3,,\n"
             "e,worker,3.0,Terminated,6000.0,6100.0,600.0,29.3,60.0,V100\n"
             "c,worker,1.0,Terminated,5000.0,5100.0,600.0,29.3,,\n"
             "d,worker,1.0,Waiting,,,600.0,29.3,25.0,\n"
             "e,evaluator,3.0,Terminated,5990.0,6150.0,600.0,29.3,10.0,V100\n")


@pytest.mark.parametrize("header", ["", PAI_TASK_HEADER + "\n"])
def test_a_pai_task_table_replays_with_fractional_gpus_ceil(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            header: str) -> None:
    """Before: refused whatever was given. Now --fractional-gpus ceil reads it: a job per
    job_name, its GPU tasks' inst_num x plan_gpu / 100 summed and rounded up, submitted at
    their earliest start, running to their latest end; CPU jobs and jobs that never ran
    left out, counted by reason, and the read line says how many jobs were rounded up."""
    trace = tmp_path / "pai_task_table.csv"
    trace.write_text(header + PAI_TASKS)
    jobs = read_trace(trace, fractional="ceil")
    assert [(j.id, j.num_gpus, j.submit_time, j.duration_s) for j in jobs] == [
        ("pai_task_table-a", 1, 5083.0, 20.0), ("pai_task_table-b", 2, 5100.0, 100.0),
        ("pai_task_table-e", 3, 5990.0, 160.0)]  # e: 3 x 0.6 + 3 x 0.1 = 2.1 GPUs
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--fractional-gpus", "ceil",
                          "-o", "json")
    assert code == 0, err
    assert "as a pai trace (detected; --format chooses another); 2 jobs of a fraction of a GPU rounded up" in err
    assert "left out 2 of 5 jobs" in err
    shift = 1 if header else 0
    assert f"like line {5 + shift}: job 'c' is a CPU job" in err and f"like line {6 + shift}: job 'd' never ran" in err
    summary = json.loads(out)["gandiva"]
    assert summary["jobs_finished"] == 3 and summary["jobs_left_out"] == 2
    # A wrong task line is named (and, with --skip-invalid, its job left out whole).
    trace.write_text(header + PAI_TASKS + "a,ps,x,Terminated,5083.0,5103.0,600.0,29.3,50.0,MISC\n")
    with pytest.raises(TraceError, match=f":{8 + shift}: inst_num 'x' is not a number"):
        read_trace(trace, fractional="ceil")
    skipped: list[TraceError] = []
    jobs, _ = read_trace_as(trace, skipped=skipped, left_out=[], fractional="ceil")
    assert [j.id for j in jobs] == ["pai_task_table-b", "pai_task_table-e"] and len(skipped) == 1
    # A task listed again (a retry) holds its GPUs once, not twice; a time of 0 is PAI's "none"
    # (Alibaba's analysis reads it so): before, b held 4 GPUs and f's 0-to-1.58e9 run was refused
    # as "ran more than a year", stopping the read.
    trace.write_text(header + PAI_TASKS + PAI_TASKS.split("\n")[1] + "\n"
                     "f,worker,1.0,Terminated,0.0,1582551795.0,600.0,29.3,100.0,T4\n"
                     "b,chief,1.0,Terminated,5100.0,5200.0,600.0,29.3,NaN,NaN\n")  # pandas' na_rep="NaN": a CPU task
    left_out: list[TraceError] = []
    jobs, _ = read_trace_as(trace, left_out=left_out, fractional="ceil")
    assert [(j.id, j.num_gpus) for j in jobs] == [("pai_task_table-a", 1), ("pai_task_table-b", 2),
                                                  ("pai_task_table-e", 3)]
    assert left_out[-1].reason == "job 'f' never ran (no GPU task of it has a start_time and an end_time other than 0)"
    # The job table holds no GPU counts: the flag says to give the task table.
    trace.write_text(PAI_JOB)
    with pytest.raises(TraceError, match="--fractional-gpus ceil reads the pai_task_table .pai_task_table.csv."):
        read_trace(trace, fractional="ceil")


def test_a_fraction_of_a_gpu_in_a_csv_is_rounded_up_with_fractional_gpus_ceil(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Before: a fraction was the line's error, whatever was given. A row left out for
    another reason is not counted as rounded."""
    trace = tmp_path / "f.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,0.5,60\n10,1,60\n20,2.25,60\n30,1.5,x\n")
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--fractional-gpus", "ceil",
                          "--skip-invalid", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["gandiva"]["jobs_finished"] == 3
    assert "2 jobs of a fraction of a GPU rounded up to whole GPUs (--fractional-gpus ceil)" in err
    assert [j.num_gpus for j in read_trace_as(trace, skipped=[], fractional="ceil")[0]] == [1, 1, 3]
    # A Gavel trace's scale factor too (before: refused, the message naming the flag all the same).
    gavel = tmp_path / "g.trace"
    gavel.write_text("ResNet-18 (batch size 64)\tpython3 main.py\t--num_steps\t1000\t0\t0.5\n"
                     "ResNet-18 (batch size 64)\tpython3 main.py\t--num_steps\t1000\t5\t2\n")
    how: dict[str, str] = {}
    jobs, fmt = read_trace_as(gavel, how=how, fractional="ceil")
    assert fmt == "gavel6" and [j.num_gpus for j in jobs] == [1, 2] and how["rounded"] == "1"


def test_a_fraction_of_a_gpu_is_refused_saying_the_simulator_places_whole_gpus(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "f.csv"
    trace.write_text("submit_time,num_gpus,duration\n0,0.5,60\n10,1,60\n")
    code, _, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4")
    assert code == 2
    assert "f.csv:2: GPU count '0.5' is not a whole number: the simulator places jobs on whole GPUs; round it up" in err
    assert "--fractional-gpus ceil does so" in err
    assert "--skip-invalid" in err
    code, out, err = _sim(capsys, "--trace", str(trace), "--cluster", "1x4", "--skip-invalid", "-o", "json")
    assert code == 0 and json.loads(out)["gandiva"]["jobs_left_out"] == 1


def test_help_names_the_other_clusters_formats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for says in ("helios SenseTime Helios CSV", "philly Microsoft Philly's cluster_job_log",
                 "pai Alibaba PAI 2020", "A GPU count that is not a whole number (0.5) is refused",
                 "Slurm's sacct -P export", "--fractional-gpus {refuse,ceil}"):
        assert says in text, says


def test_a_pretty_printed_philly_log_is_not_held_to_the_line_cap(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """Philly's log written with indent takes ~25 lines a job: its 117,000 jobs are 2.9
    million lines, past the 2,000,000-line cap of line traces, which refused it ("split the
    trace"). A JSON log is held to the cap in jobs instead."""
    from scheduler.sim import trace

    monkeypatch.setattr(trace, "MAX_TRACE_LINES", 40)
    log = tmp_path / "cluster_job_log"
    log.write_text(json.dumps([_philly_job(f"application_{i}", i, [(i, i + 60, [1])]) for i in range(4)], indent=2))
    assert len(log.read_text().splitlines()) > 40
    assert len(read_trace(log)) == 4
    log.write_text(json.dumps([_philly_job(f"application_{i}", i, [(i, i + 60, [1])]) for i in range(41)]))
    with pytest.raises(TraceError, match="more than 40 jobs"):
        read_trace(log)
    lines = tmp_path / "t.csv"
    lines.write_text("submit_time,num_gpus,duration\n" + "0,1,60\n" * 41)
    with pytest.raises(TraceError, match="more than 40 lines"):
        read_trace(lines)


@pytest.mark.parametrize(("text", "fmt", "says"), [
    ('[{"jobid": ' + "9" * 5000 + ', "attempts": []}]', "auto",
     "log.json: not a Philly cluster_job_log: it holds a number too long to read (Exceeds the limit"),
    ("[" * 100000 + "]" * 100000, "philly", "log.json: JSON nested too deep: not a Philly cluster_job_log"),
    ('[{"jobid": "a", "attempts": [], "submitted_time": "2017-10-03 03:04:35"}]', "csv",
     "(--format csv; the file's first line reads as philly: leave --format out)"),
])
def test_a_json_file_the_philly_reader_cannot_take_is_one_line_naming_the_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, fmt: str, says: str) -> None:
    """A 5,000-digit number was Python's own message without the file ("use
    sys.set_int_max_str_digits()"); --format csv on a Philly log said it reads as csv."""
    path = tmp_path / "log.json"
    path.write_text(text + "\n")
    code, out, err = _sim(capsys, "--trace", str(path), "--format", fmt)
    assert code == 2 and out == "" and says in err and "set_int_max_str_digits" not in err
    assert err.startswith(f"gandiva sim: error: {path}") and err.count("error") == 1


def test_a_philly_log_written_with_sorted_keys_is_detected(tmp_path: Path) -> None:
    """json.dump(sort_keys=True, indent=2) puts a job's jobid after all its attempts: a first
    job of 30 attempts put it 400 lines in, past the 200 lines detection looked at ("JSON,
    not a trace this reader knows")."""
    log = tmp_path / "cluster_job_log"
    first = _philly_job("application_0", 0, [(10 * k, 10 * k + 5, [1]) for k in range(30)])
    log.write_text(json.dumps([first, _philly_job("application_1", 5, [(6, 66, [2])])], indent=2, sort_keys=True))
    assert log.read_text().splitlines().index('    "jobid": "application_0",') > 200
    jobs, fmt = read_trace_as(log)
    assert fmt == "philly" and [(j.num_gpus, j.duration_s) for j in jobs] == [(1, 150.0), (2, 60.0)]


def test_a_philly_log_as_json_lines_is_read(tmp_path: Path) -> None:
    """One job object a line (the log converted with jq -c '.[]'): was "not JSON (Extra
    data)"; a broken line is named by its number."""
    log = tmp_path / "jobs.jsonl"
    jobs = [_philly_job("application_0", 0, [(1, 61, [1])]), _philly_job("application_1", 5, [(6, 36, [4])])]
    log.write_text("\n".join(json.dumps(j) for j in jobs) + "\n\n")
    assert [(j.id, j.num_gpus, j.duration_s) for j in read_trace(log)] == [
        ("jobs-application_0", 1, 60.0), ("jobs-application_1", 4, 30.0)]
    log.write_text("\n".join(json.dumps(j) for j in jobs) + '\n{"jobid": "application_2", \n')
    with pytest.raises(TraceError, match=r"jobs.jsonl:3: not JSON \(Expecting property name"):
        read_trace(log)


def test_read_trace_says_in_one_warning_how_many_records_it_left_out(caplog: pytest.LogCaptureFixture,
                                                                     tmp_path: Path) -> None:
    """read_trace (benchmarks/sim_traces.py reads with it) logged one warning per CPU job:
    hundreds of thousands of lines for a Helios log. Now one, with the count and an example."""
    trace = tmp_path / "cluster_log.csv"
    trace.write_text(HELIOS.split("\n", 1)[0] + "\n" + "".join(
        f"c{i},u1,0,4,1,COMPLETED,2020-04-01 00:00:{i:02d},,,60,vc1\n" for i in range(50)) + HELIOS.split("\n", 2)[1])
    with caplog.at_level("WARNING", logger="scheduler.sim.trace"):
        assert [j.id for j in read_trace(trace)] == ["cluster_log-j1"]
    [record] = [r for r in caplog.records if "left out" in r.getMessage()]
    assert "left out 50 record(s) that are no GPU job to replay (e.g." in record.getMessage()
    assert "cluster_log.csv:2: a CPU job (gpu_num 0)" in record.getMessage()


def test_a_philly_job_with_a_placeholder_date_is_its_own_error(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """A submitted_time of 9999-12-31 beside 2017's refused the whole log, even with
    --skip-invalid; now it is that job's error, and --skip-invalid leaves it out, counted."""
    jobs = [_philly_job("application_1", 0, [(5, 65, [1])]), _philly_job("application_2", 10, [(15, 45, [2])])]
    jobs.append({**_philly_job("application_3", 20, [(25, 85, [1])]), "submitted_time": "9999-12-31 00:00:00"})
    log = tmp_path / "cluster_job_log"
    log.write_text(json.dumps(jobs))
    code, _, err = _sim(capsys, "--trace", str(log), "--cluster", "1x4")
    assert code == 2 and "job 'application_3': submitted_time is 2.52e+11 s after the log's earliest" in err
    assert "(or --skip-invalid" in err
    code, out, err = _sim(capsys, "--trace", str(log), "--cluster", "1x4", "--skip-invalid", "-o", "json")
    assert code == 0 and (json.loads(out)["gandiva"]["jobs_finished"], json.loads(out)["gandiva"]["jobs_left_out"]) == (2, 1)
