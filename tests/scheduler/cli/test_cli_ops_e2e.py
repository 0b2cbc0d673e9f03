"""`gandiva get|describe|kill|suspend|resume|priority|migrate` against a real scheduler."""

from __future__ import annotations

import json

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, helper_pb2, scheduler_pb2


def submit_jobs(stub, *names: str, gpus: int = 1) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name=name, command=["python", f"{name}.py"], gpus=gpus, priority=1))).job.id
        for name in names
    ]


def test_get_jobs_json_has_the_fields_scripts_rely_on(sched, stub, script) -> None:
    (job_id,) = submit_jobs(stub, "resnet", gpus=2)
    r = script("gandiva", "get", "jobs", "-o", "json")  # the installed entry point
    assert r.code == 0, r.err
    (job,) = json.loads(r.out)
    assert {k: job[k] for k in ("id", "name", "state", "gpus", "servers", "steps", "rate",
                                "priority")} == {
        "id": job_id, "name": "resnet", "state": "QUEUED", "gpus": 2, "servers": [],
        "steps": 0, "rate": 0.0, "priority": 1}


def test_get_jobs_table_filters_and_no_headers(gandiva, stub) -> None:
    a, b, c = submit_jobs(stub, "a", "b", "c")
    stub.KillJob(scheduler_pb2.JobActionRequest(id=b))
    r = gandiva("get", "jobs")
    lines = r.out.splitlines()
    assert r.code == 0 and lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == [a, b, c]
    r = gandiva("get", "jobs", "--state", "queued", "--no-headers")
    assert [line.split()[:3] for line in r.out.splitlines()] == [[a, "a", "QUEUED"], [c, "c", "QUEUED"]]
    r = gandiva("get", "jobs", b, "-o", "wide", "--no-headers")
    assert r.out.split()[2] == "KILLED" and "python b.py" in r.out
    r = gandiva("get", "jobs", "--state", "sleeping")
    assert r.code == 2 and "--state: unknown state 'sleeping'" in r.err


def test_servers_and_placement_of_a_running_job(gandiva, helper, stub, wait_for) -> None:
    job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="sleeper", command=["python", "sleep.py"], gpus=2))).job.id
    wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state
             == common_pb2.JOB_STATE_RUNNING)
    helper.progress(job_id, steps=50, rate=12.5)
    (server,) = json.loads(gandiva("get", "servers", "-o", "json").out)
    assert {k: server[k] for k in ("name", "gpus", "height", "affinity", "up")} == {
        "name": "n1", "gpus": 2, "height": 1, "affinity": 2, "up": True}
    assert gandiva("get", "servers", "--no-headers").out.split()[:5] == ["n1", "2", "2", "1", "2"]
    (job,) = json.loads(gandiva("get", "jobs", "-o", "json").out)
    assert (job["state"], job["servers"], job["steps"], job["rate"]) == ("RUNNING", ["n1"], 50, 12.5)
    assert sorted(p["gpu"] for p in job["placement"]) == [0, 1]
    assert gandiva("get", "jobs", "--no-headers").out.split()[4:7] == ["n1", "50", "12.5"]
    assert "Placement: n1:0,1" in gandiva("describe", "job", job_id).out
    # Host memory: unknown until the helper reports it; then held / total, and the job's own.
    assert gandiva("get", "servers", "--no-headers").out.split()[7] == "4.0Gi/-"  # 1 job, not measured yet
    assert "Host memory: not measured" in gandiva("describe", "job", job_id).out
    helper.helper.Register(helper_pb2.RegisterServerRequest(
        name="n1", gpus=[common_pb2.Gpu(index=i, memory_total_bytes=16 << 30) for i in range(2)],
        host_memory_bytes=64 << 30))
    helper.helper.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", host_memory=[
        helper_pb2.JobHostMemory(job_id=job_id, incarnation=helper.launched[job_id], rss_bytes=3 << 30)]))
    assert gandiva("get", "servers", "--no-headers").out.split()[7] == "3.0/64.0Gi"
    for bad, field in [
        (lambda: helper.helper.Register(helper_pb2.RegisterServerRequest(
            name="n1", gpus=[common_pb2.Gpu(index=0)], host_memory_bytes=-1)), "host_memory_bytes"),
        (lambda: helper.helper.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", host_memory=[
            helper_pb2.JobHostMemory(job_id=job_id, incarnation="x", rss_bytes=-5)])), "host_memory[0].rss_bytes"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            bad()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    (server,) = json.loads(gandiva("get", "servers", "-o", "json").out)
    assert (server["host_memory_bytes"], server["host_memory_used_bytes"]) == (64 << 30, 3 << 30)
    assert "Host memory: 3.0Gi" in gandiva("describe", "job", job_id).out
    assert json.loads(gandiva("get", "jobs", job_id, "-o", "json").out)[0]["host_memory_bytes"] == 3 << 30
    assert gandiva("kill", job_id).code == 0


def test_kill_goes_on_past_an_unknown_id(gandiva, stub) -> None:
    a, b = submit_jobs(stub, "a", "b")
    r = gandiva("kill", a, "nope", b, "--reason", "bad lr")
    assert r.code == 2
    assert f"job {a} killed (now KILLED)" in r.out and f"job {b} killed" in r.out
    assert r.err.count("\n") == 1 and "nope" in r.err and "not found" in r.err
    job = stub.GetJob(scheduler_pb2.GetJobRequest(id=a))
    assert job.state == common_pb2.JOB_STATE_KILLED and job.message == "bad lr"


def test_kill_of_a_multi_job_kills_its_jobs_that_have_not_ended(gandiva, stub) -> None:  # type: ignore[no-untyped-def]
    """A sweep's id (what gandiva-submit --sweep/--array prints) was "not found"; killing
    a sweep took a listing piped into kill. Now the multi-job's id stands for its jobs."""
    specs = [common_pb2.JobSpec(name=f"lr{i}", command=["python", "t.py"], gpus=1) for i in range(3)]
    reply = stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="sweep", jobs=specs))
    first, *rest = [j.id for j in reply.jobs]
    stub.KillJob(scheduler_pb2.JobActionRequest(id=first))  # ended already: left alone
    other, = submit_jobs(stub, "other")
    r = gandiva("kill", reply.multi_job_id, "--reason", "sweep over")
    assert r.code == 0, r.err
    assert sorted(line.split()[1] for line in r.out.splitlines()) == sorted(rest)
    for job_id in rest:
        job = stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
        assert job.state == common_pb2.JOB_STATE_KILLED and job.message == "sweep over"
    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=other)).state == common_pb2.JOB_STATE_QUEUED
    r = gandiva("kill", reply.multi_job_id)
    assert r.code == 0 and r.out == "" and "all 3 jobs have ended already" in r.err
    r = gandiva("kill", "mj-0000000000")
    assert r.code == 2 and "mj-0000000000" in r.err and "not found" in r.err


def test_priority_changes_and_refuses_negative(gandiva, stub) -> None:
    (job_id,) = submit_jobs(stub, "a")
    r = gandiva("priority", job_id, "7", "-o", "json")
    assert r.code == 0 and json.loads(r.out)["priority"] == 7
    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).spec.priority == 7
    for bad in ("-1", "99999999999999"):  # the latter was a traceback (protobuf's int32 range)
        r = gandiva("priority", job_id, bad)
        assert r.code == 2 and f"priority must be from 0 to 1000000, got {bad}" in r.err and "Traceback" not in r.err
    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).spec.priority == 7


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["suspend", "JOB"], "not possible now"),
        (["resume", "JOB"], "not possible now"),
        (["migrate", "JOB", "--to", "nowhere"], "nowhere"),
        (["describe", "job", "j-missing"], "not found"),
        (["get", "events", "--after", "-99999999999999999999999"], "--after must be an event id"),
    ],
)
def test_refused_actions_exit_2_with_the_reason(gandiva, stub, argv: list[str], fragment: str) -> None:
    (job_id,) = submit_jobs(stub, "a")
    r = gandiva(*[job_id if a == "JOB" else a for a in argv])
    assert r.code == 2
    assert fragment in r.err and r.err.count("\n") == 1
    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state == common_pb2.JOB_STATE_QUEUED


def test_describe_job_shows_spec_history_and_events(gandiva, stub) -> None:
    (job_id,) = submit_jobs(stub, "resnet", gpus=2)
    stub.SetPriority(scheduler_pb2.SetPriorityRequest(id=job_id, priority=4))
    stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id, reason="enough"))
    r = gandiva("describe", "job", job_id)
    assert r.code == 0
    for text in ("Name:        resnet", "Command:     python resnet.py", "GPUs:        2",
                 "Suspendable: yes", "Migratable:  yes",
                 "History:", "QUEUED  KILLED  enough", "job.priority", "job.submitted"):
        assert text in r.out
    r = gandiva("describe", "job", job_id, "-o", "json")
    described = json.loads(r.out)
    assert described["state"] == "KILLED"
    assert [h["to"] for h in described["history"]] == ["QUEUED", "KILLED"]
    assert [e["kind"] for e in described["events"]][:2] == ["job.submitted", "job.priority"]


def test_get_events_lists_what_happened(gandiva, stub) -> None:
    (job_id,) = submit_jobs(stub, "a")
    stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id))
    events = json.loads(gandiva("get", "events", "-o", "json").out)
    assert [(e["kind"], e["job_id"]) for e in events] == [("job.submitted", job_id),
                                                          ("job.state", job_id)]
    after = gandiva("get", "events", "--after", str(events[0]["id"]), "--no-headers").out
    assert len(after.splitlines()) == 1 and "job.state" in after


def test_unreachable_scheduler_is_one_clear_line(gandiva) -> None:
    r = gandiva("get", "jobs", "--scheduler", "127.0.0.1:1")
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1
    assert "cannot reach the scheduler at 127.0.0.1:1" in r.err and "GANDIVA_SCHEDULER" in r.err


def test_output_into_a_closed_pipe_is_a_quiet_exit(sched, stub, script_into_closed_pipe) -> None:
    """`gandiva describe job ID | head -1` ended in a BrokenPipeError traceback."""
    (job_id,) = submit_jobs(stub, "a")
    for argv in (("describe", "job", job_id), ("get", "jobs"), ("--help",)):
        r = script_into_closed_pipe("gandiva", *argv)
        assert (r.code, r.err) == (0, ""), argv
    # kill acts on every id even once nobody reads, and keeps its own exit code.
    (other,) = submit_jobs(stub, "b")
    r = script_into_closed_pipe("gandiva", "kill", job_id, "j-nope", other)
    assert r.code == 2 and "Traceback" not in r.err and "j-nope" in r.err
    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=other)).state == common_pb2.JOB_STATE_KILLED


def test_scheduler_may_be_given_before_the_command(gandiva, sched, stub, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`gandiva --scheduler ADDR get jobs` said "invalid choice" (the address was read
    as the command)."""
    (job_id,) = submit_jobs(stub, "a")
    monkeypatch.setenv("GANDIVA_SCHEDULER", "127.0.0.1:1")
    for argv in (("--scheduler", sched.address, "get", "jobs", "--no-headers"),
                 (f"--scheduler={sched.address}", "get", "jobs", "--no-headers"),
                 ("--scheduler", "127.0.0.1:1", "get", "jobs", "--no-headers", "--scheduler", sched.address)):
        r = gandiva(*argv)
        assert r.code == 0 and r.out.startswith(job_id), (argv, r.err)
    for argv, message in ((("-o", "json", "get", "jobs"), "-o: options go after the command"),
                          (("--scheduler", "x:1", "sim"), "--scheduler: `gandiva sim` takes no scheduler address")):
        with pytest.raises(SystemExit) as exit_:
            gandiva(*argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_top_explains_an_address_that_is_not_http_and_a_bad_interval(gandiva, sched,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`gandiva top --http <the gRPC port>` ended in http.client.BadStatusLine, and
    `--interval=-1` in "sleep length must be non-negative"."""
    r = gandiva("top", "--http", sched.address, "--once")
    assert r.code == 1 and "Traceback" not in r.err and r.out == ""
    assert r.err == (f"gandiva top: {sched.address} did not answer HTTP; is it the scheduler's "
                     "--http-listen address?\n")
    for interval in ("-1", "0", "nan"):
        with pytest.raises(SystemExit) as exit_:
            gandiva("top", "--http", sched.address, f"--interval={interval}")
        assert exit_.value.code == 2
        assert f"argument --interval: must be more than 0 seconds, got '{interval}'" in capsys.readouterr().err
    # --interval 0.0001 was taken: top polled the whole cluster view as fast as the scheduler answered.
    with pytest.raises(SystemExit) as exit_:
        gandiva("top", "--http", sched.address, "--interval", "0.0001")
    assert exit_.value.code == 2
    assert ("argument --interval: at least 0.5 seconds, got '0.0001': each refresh reads the whole cluster"
            in capsys.readouterr().err)


def test_get_events_since_and_kind_answer_what_happened_lately(gandiva, sched, stub, script, capsys) -> None:  # type: ignore[no-untyped-def]
    """"What happened in the last hour?": `get events` listed the whole history from the
    first event (--after ID only); now --since DURATION starts at the first event of the
    last DURATION (on the scheduler, not by paging through everything) and --kind keeps
    one kind or family, also for --watch."""
    import sqlite3
    import subprocess
    import sys
    import time

    now = time.time()
    with sqlite3.connect(sched.db_url.split("///", 1)[1]) as db:  # the scheduler's own SQLite file
        db.executemany("INSERT INTO events (at, kind, job_id, server, message) VALUES (?, ?, '', ?, ?)", [
            (now - 7200, "server.down", "old-node", "no heartbeat for 11s"),
            (now - 7100, "server.up", "old-node", "heartbeats resumed"),
            (now - 60, "server.down", "node-b", "no heartbeat for 11s"),
        ])
    a, b = submit_jobs(stub, "a", "b")

    def rows(*argv: str) -> list[list[str]]:
        r = gandiva("get", "events", "--no-headers", *argv)
        assert r.code == 0, r.err
        return [line.split()[2:4] for line in r.out.splitlines()]

    assert len(rows()) == 5  # the whole history
    assert rows("--since", "1h") == [["server.down", "-"], ["job.submitted", a], ["job.submitted", b]]
    assert rows("--since", "30s") == [["job.submitted", a], ["job.submitted", b]]
    assert rows("--since", "3h", "--kind", "server") == [["server.down", "-"], ["server.up", "-"],
                                                         ["server.down", "-"]]
    assert rows("--kind", "job.submitted", "--limit", "1") == [["job.submitted", a]]
    r = script("gandiva", "get", "events", "--since", "soon")
    assert r.code == 2 and "--since: expected how long ago (90s, 30m, 12h, 7d), a time of day (03:12" in r.err
    assert "got 'soon'" in r.err
    # "What happened between 03:10 and 03:15 last night?" (session 48): --until ends the listing;
    # a time of day or a date and time says when, by this machine's clock.
    between = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 7150))
    assert rows("--since", "3h", "--until", "1h") == [["server.down", "-"], ["server.up", "-"]]
    assert rows("--since", between, "--until", "90s") == [["server.up", "-"]]
    assert rows("--until", between) == [["server.down", "-"]]
    r = script("gandiva", "get", "events", "--since", "1h", "--until", "2h")
    assert r.code == 2 and "is not after --since" in r.err and "give a start before the end" in r.err
    # A window longer than the clock's past is the whole history: it was "invalid: since:
    # -8.6e+21: a unix time, 0 or more", a value the user never typed.
    assert len(rows("--since", "99999999999999999d")) == len(rows("--since", "1e308s")) == 5
    for odd in ("\u0665s", "1_000s", " 5m", "+5"):  # other scripts' digits, Python's literal forms
        with pytest.raises(SystemExit) as exit_:
            gandiva("get", "events", "--since", odd)
        assert exit_.value.code == 2
        said = capsys.readouterr().err
        assert "--since: expected how long ago (90s, 30m, 12h, 7d), a time of day" in said and f"got {odd!r}" in said
    with pytest.raises(grpc.RpcError) as err:
        stub.ListEvents(scheduler_pb2.ListEventsRequest(since=float("nan")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "since" in err.value.details()
    window = stub.ListEvents(scheduler_pb2.ListEventsRequest(until=now - 3600, page_size=1)).events  # by the scheduler
    assert [e.kind for e in window] == ["server.down"]
    assert [e.kind for e in stub.ListEvents(scheduler_pb2.ListEventsRequest(until=now - 3600)).events] == [
        "server.down", "server.up"]
    with pytest.raises(grpc.RpcError) as err:
        stub.ListEvents(scheduler_pb2.ListEventsRequest(until=float("nan")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "until" in err.value.details()
    # Following: the last hour's job events, then new ones as they come.
    watch = subprocess.Popen([sys.executable, "-m", "gandiva_cli.main", "get", "events", "-w", "--since", "1h",
                              "--kind", "job", "--no-headers", "--scheduler", sched.address],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = [watch.stdout.readline().split("\t")[2:4] for _ in range(2)]  # type: ignore[union-attr]
        (c,) = submit_jobs(stub, "c")
        seen.append(watch.stdout.readline().split("\t")[2:4])  # type: ignore[union-attr]
    finally:
        watch.kill()
        watch.wait()
    assert seen == [["job.submitted", a], ["job.submitted", b], ["job.submitted", c]]
