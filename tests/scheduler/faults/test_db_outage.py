"""The database briefly unreachable: calls fail with UNAVAILABLE and a clear
message, and the service recovers by itself, without a restart."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.core import Settings

from ...in_process import run_gandiva
from ...integration.test_observe import CHROMIUM, chromium_dom
from ...relay import TcpProxy


@pytest.fixture
def proxied_pg_url(pg_url: str) -> Iterator[tuple[str, TcpProxy]]:
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
    yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy
    proxy.stop()


def _http(address: str, path: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


DOWN = re.compile(r"the scheduler is up; its database is unreachable since \d\d:\d\d:\d\d UTC \(\w+")


@pytest.mark.pg
def test_database_outage_gives_unavailable_then_recovers(proxied_pg_url, make_scheduler, wait_for, capsys) -> None:  # type: ignore[no-untyped-def]
    """Calls fail UNAVAILABLE naming the outage; the scheduler's own health stays in view:
    /metrics answers (gandiva_database_up 0, rounds skipped), /api/state, the dashboard
    and `gandiva get servers` say the scheduler is up and its database is unreachable
    since when. Before, /metrics failed as a whole and the page read "cannot reach the
    scheduler (HTTP 500)"."""
    url, proxy = proxied_pg_url
    sched = make_scheduler(url, tick_s=0.2, http_listen="127.0.0.1:0")
    web = sched.server.http_address
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec())).job
        up = wait_for(lambda: (m := _samples(_http(web, "/metrics")[1]))[
            ("gandiva_scheduling_rounds_total", (("outcome", "ok"),))] > 0 and m, 30)
        assert up[("gandiva_database_up", ())] == 1.0
        proxy.cut()
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert DOWN.match(err.value.details()), err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.GetJob(scheduler_pb2.GetJobRequest(id=first.id), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        def skipped() -> dict | None:
            status, text = _http(web, "/metrics")
            assert status == 200, text
            now = _samples(text)
            return now if now[("gandiva_scheduling_rounds_total", (("outcome", "skipped"),))] >= 2 else None
        down = wait_for(skipped, 30)
        assert down[("gandiva_database_up", ())] == 0.0
        assert down[("gandiva_database_down_seconds", ())] > 0
        assert down[("gandiva_last_round_age_seconds", ())] > 0
        assert not any(name == "gandiva_jobs" for name, _ in down)  # no stale counts from before
        status, body = _http(web, "/api/state")
        assert status == 503 and DOWN.match(json.loads(body)["error"]), body
        assert [p["kind"] for p in json.loads(body)["problems"]] == ["database.down"], body
        # The CLI's entry function in this process (no Python start per command), output captured.
        cli = run_gandiva(capsys, "get", "servers", "--scheduler", sched.address)
        assert cli.returncode != 0 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
        assert f"the scheduler at {sched.address} is up; its database is unreachable since" in cli.stderr, cli.stderr
        # What needs a person still answers, from what the scheduler keeps in memory.
        problems = run_gandiva(capsys, "get", "problems", "--scheduler", sched.address)
        assert problems.returncode == 0 and re.search(r"^database\.down +- +\d+s +the scheduler is up; its database "
                                                      r"is unreachable since", problems.stdout, re.MULTILINE), problems
        top = run_gandiva(capsys, "top", "--once", "--http", web)
        assert top.returncode == 1 and DOWN.match(top.stderr.removeprefix("gandiva top: ")), top.stderr
        if CHROMIUM is not None or os.environ.get("GANDIVA_REQUIRE_BROWSER") == "1":
            dom = chromium_dom(f"http://{web}/")
            assert re.search(r'<div id="error" class="bad">the scheduler is up; its database is unreachable since '
                             r"\d\d:\d\d:\d\d UTC \(", dom), dom
            assert '<tr data-kind="database.down">' in dom, dom
        proxy.restore()
        wait_for(lambda: _samples(_http(web, "/metrics")[1])[("gandiva_database_up", ())] == 1.0, 30)
        status, body = _http(web, "/api/state")
        assert status == 200 and json.loads(body)["database"]["up"] is True, body
        # A database that answers nothing (its connect times out after 30 s): /metrics and
        # /api/state still answer within a scrape's 10 s (they took a minute each).
        proxy.cut()
        proxy.hole = True
        proxy.restore()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            (status, text), (state, body) = pool.map(lambda path: _http(web, path, timeout=10), ["/metrics", "/api/state"])
        assert status == 200 and not any(name == "gandiva_jobs" for name, _ in _samples(text))
        assert state == 503 and json.loads(body)["error"].startswith("the scheduler is up; its database "), body
        assert "problems" in json.loads(body), body
        proxy.cut()
        proxy.hole = False
        proxy.restore()
        second = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30).job
        jobs = {j.id for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs}
        # The submission that failed during the outage was not half-written.
        assert jobs == {first.id, second.id}


def _spec() -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=["python", "t.py"], gpus=1)


@pytest.mark.pg
def test_servers_stay_up_and_jobs_keep_their_process_across_a_database_outage(
    proxied_pg_url, make_scheduler, tmp_path: Path, wait_for  # type: ignore[no-untyped-def]
) -> None:
    """PostgreSQL unreachable for longer than the heartbeat timeout while a helper runs a
    job (a database restart or failover): the helper's heartbeats could not be recorded,
    which is no sign of the server's death. Once the database is back the server stays
    up and the job goes on in the same process (frozen by the lease meanwhile). Before,
    every server was marked down the moment the database was back and every job in the
    cluster was killed and restarted from its last checkpoint (here: from step 0)."""
    url, proxy = proxied_pg_url
    fake = tmp_path / "fake-job"
    fake.write_text(f"#!{sys.executable}\n" + (Path(__file__).parents[2] / "migration_helper" / "fake_job.py").read_text())
    fake.chmod(0o755)
    settings = Settings(heartbeat_interval_s=0.2, down_after_s=4.0)
    sched = make_scheduler(url, tick_s=0.1, settings=settings)
    with open(tmp_path / "helper.err", "w") as err:
        helper = subprocess.Popen(
            [sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "s1", "--gpus", "1", "--virtual",
             "--scheduler", sched.address, "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs")],
            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert helper.stdout is not None and "listening" in helper.stdout.readline()
        with grpc.insecure_channel(sched.address) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            spec = common_pb2.JobSpec(name="f", command=[str(fake)], workdir=str(tmp_path), gpus=1,
                                      env={"FAKE_STEPS": "0", "FAKE_STEP_S": "0.02"})
            job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id

            def job() -> common_pb2.Job:
                return stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=10)

            wait_for(lambda: job().steps >= 10, 30)
            before = job().steps
            proxy.cut()
            time.sleep(settings.down_after_s + 2.0)
            # The helper slow to come back (its reconnect back-off reaches 2 s): the first
            # rounds after the outage find its recorded heartbeats as old as the outage.
            os.kill(helper.pid, signal.SIGSTOP)
            time.sleep(0.1)
            proxy.restore()
            time.sleep(0.6)
            os.kill(helper.pid, signal.SIGCONT)
            wait_for(lambda: job().steps > before + 20, 30)  # training again
            time.sleep(settings.down_after_s)  # the server would be marked down by now
            servers = {s.name: s.up for s in stub.ListServers(scheduler_pb2.ListServersRequest()).servers}
            assert servers == {"s1": True}
            done = job()
            assert done.state == common_pb2.JOB_STATE_RUNNING, done.message
            assert [t.to_state for t in done.history] == [common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING], \
                [t.reason for t in done.history]
            stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=10)
    finally:
        os.kill(helper.pid, signal.SIGCONT)
        helper.terminate()
        helper.wait(15)
