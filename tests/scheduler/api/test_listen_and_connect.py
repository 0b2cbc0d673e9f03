"""Found by a hostile-input pass over the live system: a second scheduler bound a port
already in use and took half the calls; a migration of a job whose runtime had not
connected started a second live copy of its program (the destination's pre-warm); an
operator's suspend of such a job answered after a minute, past the CLI's deadline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from gandiva_cli import main as gandiva_main
from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.client import Client, CliError
from scheduler.core import Settings
from scheduler.engine import live
from scheduler.policy.types import GpuRef, Migrate
from scheduler.transport import SERVER_OPTIONS, add_port, check_listen

from .test_fencing import Fake


def _scheduler(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gandiva_cli.main", "scheduler", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_a_second_scheduler_on_a_port_in_use_stops_saying_so(make_scheduler: Any, sqlite_url: str,
                                                             tmp_path: Path) -> None:
    first = make_scheduler(sqlite_url)
    out = _scheduler("--listen", first.address, "--db", f"sqlite+aiosqlite:///{tmp_path / 'b.db'}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"--listen {first.address}: cannot listen there: the address is in use" in out.stderr
    # The first one still answers every call (no second listener shares its port).
    for _ in range(6):  # new connections, each to the first one
        with grpc.insecure_channel(first.address) as ch:
            scheduler_pb2_grpc.SchedulerStub(ch).ListServers(scheduler_pb2.ListServersRequest(), timeout=5)
    bad = _scheduler("--listen", "127.0.0.1:99999", "--db", f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    assert bad.returncode == 2 and "port 99999 is out of range (0-65535)" in bad.stderr, bad.stderr


async def test_every_gandiva_server_refuses_a_port_in_use() -> None:
    """The helper's agent and the scheduler share add_port and SERVER_OPTIONS."""
    one = grpc.aio.server(options=SERVER_OPTIONS)
    port = add_port(one, "127.0.0.1:0", None)
    await one.start()
    try:
        two = grpc.aio.server(options=SERVER_OPTIONS)
        with pytest.raises(OSError, match=f"--listen 127.0.0.1:{port}: cannot listen there"):
            add_port(two, f"127.0.0.1:{port}", None)
    finally:
        await one.stop(0)
    for listen in ("127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="--listen"):
            check_listen(listen)
    check_listen("unix:/tmp/gandiva.sock")
    with pytest.raises(CliError, match="port 109465 is out of range"):
        Client("127.0.0.1:109465")
    await asyncio.sleep(0)


def test_a_job_whose_runtime_has_not_connected_is_never_migrated(scheduler_server: Any, wait_for: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Its program would be started at the destination to pre-warm, and without a runtime
    nothing holds it there: a second live copy (a plain Python job wrote from two
    processes). The migration is refused, the job keeps running where it is, untouched.
    (An operator's migration waits OPERATOR_CONNECT_WAIT_S for a runtime first: one
    reconnecting is back by then, tests/migration_helper/test_migrate_reconnecting.py.)"""
    monkeypatch.setattr(live, "OPERATOR_CONNECT_WAIT_S", 0.5)
    f = Fake(scheduler_server.address)
    try:
        job_id = f.submit()
        server, launch = f.launched(job_id, wait_for)
        dest = "b" if server == "a" else "a"
        with pytest.raises(grpc.RpcError) as err:
            f.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "has no runtime connected" in err.value.details(), err.value.details()
        job = f.job(job_id)
        assert job.state == common_pb2.JOB_STATE_RUNNING and job.placement[0].server == server
        assert not any("migrat" in t.reason for t in job.history), [t.reason for t in job.history]
        f.shim(job_id, launch.incarnation)  # once it connects, it can be migrated
        moving = f.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest))
        assert moving.state == common_pb2.JOB_STATE_MIGRATING
    finally:
        f.close()


def test_an_operator_suspend_of_a_job_without_runtime_answers_in_seconds(
        scheduler_server: Any, wait_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to wait the policy's command timeout (60 s) for the runtime, past the CLI's
    own deadline (15 s), which then blamed the scheduler ("overloaded or stuck?")."""
    monkeypatch.setattr(live, "OPERATOR_CONNECT_WAIT_S", 0.5)
    f = Fake(scheduler_server.address)
    try:
        job_id = f.submit()
        f.launched(job_id, wait_for)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            f.api.SuspendJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=30)
        assert time.monotonic() - t0 < 10
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "has no runtime connected" in err.value.details()
        assert "try again once it shows progress" in err.value.details()
        assert f.job(job_id).state == common_pb2.JOB_STATE_RUNNING
    finally:
        f.close()


@pytest.mark.parametrize("db,says", [
    ("nonsense", "not a database URL; give one like"),
    ("sqlite+aiosqlite:///", "an in-memory SQLite database lives in one connection"),
    ("sqlite+aiosqlite:///:memory:", "an in-memory SQLite database lives in one connection"),
    ("sqlite+aiosqlite:///{tmp}/text.db", "the file is not an SQLite database"),
    ("sqlite+aiosqlite:///{tmp}/text.db/sub/g.db", "cannot make the database's directory"),
    ("sqlite+aiosqlite:////proc/self/g.db", "check that its directory exists and is writable"),
    ("postgresql+asyncpg://u:secret@127.0.0.1:9/x", "cannot reach the database (Connection refused)"),
])
def test_a_database_the_scheduler_cannot_use_stops_it_in_one_line(db: str, says: str, tmp_path: Path) -> None:
    """Each used to end in a traceback, or (in-memory) to start a scheduler whose every
    round and call failed with "database unreachable"."""
    (tmp_path / "text.db").write_text("not a database\n")
    out = _scheduler("--listen", "127.0.0.1:0", "--db", db.format(tmp=tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("gandiva scheduler: ") and says in line, out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "secret" not in out.stdout + out.stderr


def test_a_move_refused_before_it_began_is_said_where_people_look(make_scheduler: Any, sqlite_url: str,
                                                                  wait_for: Any, capsys: Any) -> None:
    """The policy's move of a job whose runtime had gone (in `gandiva demo`: an unpack of a
    job that had just finished, its exit not yet reported) is refused before it begins. That
    was said in the scheduler's log only: the demo and the dashboard's decision log showed
    "migrate lr0.03-h32 unpack onto idle GPUs ... on node-3/1", the job's last decision on
    the page, and nothing said that it never moved. Now a job.migration event says so, and
    a not-done line in the decision log after the move."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0",
                           settings=Settings(down_after_s=600.0))  # the fake helpers never heartbeat
    f = Fake(sched.address)
    try:
        job_id = f.submit()
        server, _ = f.launched(job_id, wait_for)
        dest = GpuRef("b" if server == "a" else "a", 0)
        # What the policy decides (logged as a round logs it; apply: as each round's decisions are carried out).
        sched.server.engine.observer.log.add(time.time(), "migrate", job_id, (f"{dest.server}/0",),
                                             "unpack onto idle GPUs")
        sched.call(sched.server.engine.apply(Migrate(job_id, (dest,), "unpack onto idle GPUs")))
        refusal = (f"not started (unpack onto idle GPUs; to {dest.server}/0): job {job_id} has no runtime "
                   "connected")
        said = wait_for(lambda: [e.message for e in f.api.ListEvents(scheduler_pb2.ListEventsRequest(
            job_id=job_id)).events if e.kind == "job.migration"])
        assert len(said) == 1 and said[0].startswith(refusal), said
        # Decided again (each round, as a job not connected yet would be): said once, not every round.
        engine = sched.server.engine
        sched.call(engine.apply(Migrate(job_id, (dest,), "unpack onto idle GPUs")))
        wait_for(lambda: job_id not in engine.inflight)
        assert len([e for e in f.api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
                    if e.kind == "job.migration"]) == 1
        with urllib.request.urlopen(f"http://{sched.server.http_address}/api/decisions", timeout=10) as answer:
            decisions = [(d["kind"], d["job"], d["reason"]) for d in json.load(answer)["decisions"]]
        assert decisions[-1][:2] == ("not-done", job_id) and decisions[-1][2].startswith(refusal), decisions
        assert [d[0] for d in decisions].count("not-done") == 1, decisions
        # Whether the move was kept, in the log of the last minutes (session 51): the API and `gandiva top`.
        with urllib.request.urlopen(f"http://{sched.server.http_address}/api/decisions?since=600&job={job_id}",
                                    timeout=10) as answer:
            assert [(d["kind"], d["outcome"]) for d in json.load(answer)["decisions"]] == [
                ("place", ""), ("migrate", "not done"), ("not-done", "")]
        capsys.readouterr()
        assert gandiva_main.main(["top", "--http", sched.server.http_address, "--decisions", "10m",
                                  "--job", job_id]) == 0
        printed = capsys.readouterr().out
        assert f"{job_id} (t) {dest.server}/0: unpack onto idle GPUs -> not done" in printed, printed
        assert "gone" not in printed.splitlines()[0], printed
        assert printed.splitlines()[-1] == "tried changes: migrate 1: not done 1", printed
        job = f.job(job_id)
        assert job.state == common_pb2.JOB_STATE_RUNNING and job.placement[0].server == server
        # The job's own summary (describe's Sharing, the page's one-job view) counts it too.
        with urllib.request.urlopen(f"http://{sched.server.http_address}/api/job?id={job_id}", timeout=10) as answer:
            assert json.load(answer)["sharing"]["moves_not_done"] == ["not started"]
        assert gandiva_main.main(["describe", "job", job_id, "--scheduler", sched.address]) == 0
        moves = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("Moves:")]
        said = (f"  Moves:   none; 1 more decided but not carried out (not started): gandiva get events "
                f"--job {job_id} --kind job.migration")
        assert moves == [said], moves
    finally:
        f.close()


def test_an_operator_migration_waiting_for_a_runtime_answers_once_the_job_is_killed(
        scheduler_server: Any, wait_for: Any) -> None:
    """`gandiva migrate` waits up to OPERATOR_CONNECT_WAIT_S (10 s) for a runtime not yet
    connected; a job killed meanwhile was answered only when that wait ran out."""
    from concurrent.futures import ThreadPoolExecutor

    f = Fake(scheduler_server.address)
    try:
        f.keep_alive("a", "b")
        job_id = f.submit()
        server, _ = f.launched(job_id, wait_for)
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(f.api.MigrateJob, scheduler_pb2.MigrateJobRequest(
                id=job_id, to_server="b" if server == "a" else "a"), timeout=30)
            time.sleep(0.5)
            assert not asked.done(), asked.exception() or asked.result()
            f.api.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=10)
            killed = time.monotonic()
            err = asked.exception(timeout=30)
            took = time.monotonic() - killed
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
        assert "only a running or suspended job can migrate" in err.details(), err.details()
        assert took < 5.0, f"answered {took:.1f}s after the kill"
    finally:
        f.close()
