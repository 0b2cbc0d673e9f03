"""Two schedulers started on one database by mistake (another --listen port, a
second unit, a restart while the old process still runs): the second is refused,
naming the one that holds the database, and nothing it could have done happens.
Once the first is gone (even killed with -9), a scheduler starts on it at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .test_restart import free_port, start_scheduler


def second_scheduler(db_url: str, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", f"127.0.0.1:{port}", "--db", db_url],
        check=False, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def test_a_second_scheduler_on_one_database_is_refused(db: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    db_url = str(request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url"))
    port = free_port()
    first = start_scheduler(db_url, port, tmp_path)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
                spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
            second = second_scheduler(db_url, free_port())
            assert second.returncode == 2, second.stderr
            err = second.stderr.strip().splitlines()[-1]
            assert "another scheduler is running on this database" in err, err
            assert f"pid {first.pid}" in err and f":{port}" in err, err  # who holds it
            # The first goes on as before, alone.
            assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job)).state == common_pb2.JOB_STATE_QUEUED
        if db != "sqlite":
            return  # a PostgreSQL session's locks end with its connection: nothing new below
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        # Killed with -9, it held nothing any more: the next one starts on the database.
        first = start_scheduler(db_url, port, tmp_path)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            assert [j.id for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs] == [job]
    finally:
        first.kill()
        first.wait(10)


@pytest.mark.pg
def test_a_scheduler_whose_database_was_taken_while_its_connection_was_lost_stops(
        pg_url: str, tmp_path: Path) -> None:
    """Its lock's connection cut (as a database restart does) and the lock taken by
    another meanwhile: it stops (exit 2) saying so, instead of acting beside the other."""
    import asyncpg

    from scheduler.state.owner import PG_LOCK_KEY
    from tests.conftest import PG_ADMIN_DSN

    db = pg_url.rsplit("/", 1)[1]
    proc = start_scheduler(pg_url, free_port(), tmp_path)

    async def take_over() -> None:
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        other = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{db}",
                                      server_settings={"application_name": "the other one"})
        try:
            holder = await admin.fetchval(
                "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = $1", db)
            assert holder, "the scheduler holds no lock on its database"
            await admin.fetchval("SELECT pg_terminate_backend($1)", holder)
            deadline = time.monotonic() + 10
            while not await other.fetchval("SELECT pg_try_advisory_lock($1)", PG_LOCK_KEY):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert proc.wait(30) == 2
        finally:
            await other.close()
            await admin.close()

    try:
        asyncio.run(take_over())
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert "another scheduler is running on this database (the other one" in err, err
    finally:
        proc.kill()
        proc.wait(10)


def test_a_lock_file_that_is_a_link_or_a_directory_is_refused_not_followed(tmp_path: Path) -> None:
    """The lock file beside an SQLite database (in /tmp, say) was opened through a symbolic link
    someone had put there: a scheduler run as root truncated the link's target (/etc/passwd) and
    wrote its pid into it. A directory (or a link) there let it start with no lock at all."""
    from scheduler.state.owner import SchedulerLock

    db = tmp_path / "g.db"
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    lock = SchedulerLock(f"sqlite+aiosqlite:///{db}", "127.0.0.1:1", str(db))
    lock.path.symlink_to(victim)
    with pytest.raises(ValueError, match=r"g\.db\.scheduler-lock is a symbolic link, not this scheduler's lock file"):
        asyncio.run(lock.acquire())
    assert victim.read_text() == "keep me\n"
    lock.path.unlink()
    lock.path.mkdir()
    with pytest.raises(ValueError, match=r"g\.db\.scheduler-lock is a directory, not this scheduler's lock file"):
        asyncio.run(lock.acquire())
    lock.path.rmdir()
    asyncio.run(lock.acquire())  # a plain file, made by the lock itself
    asyncio.run(lock.release())


@pytest.mark.pg
def test_the_lock_is_taken_back_from_its_own_session_left_open_by_a_partition(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock's connection lost to a partition (the server never heard it end: its
    session, this scheduler's, still holds the lock when the link is back). Before, the
    scheduler stopped itself on the link's return, naming itself as "another scheduler
    is running on this database"; now it ends its old session and takes the lock again.
    (The partition itself, with real hosts: tests/multihost/test_db_host_cut.py.)"""
    import asyncpg

    from scheduler.state import owner

    monkeypatch.setattr(owner, "CHECK_EVERY_S", 0.05)
    dsn = pg_url.replace("+asyncpg", "")

    async def run() -> None:
        lost: list[str] = []
        lock = owner.SchedulerLock(pg_url, "127.0.0.1:1", "db", lost.append)
        await lock.acquire()
        old = lock._conn  # the session the partition leaves open on the server
        old_pid = old.get_server_pid()
        stand_in = await asyncpg.connect(dsn)
        lock._conn = stand_in  # what the scheduler holds: found closed, as a lost one is
        await stand_in.close()
        look = await asyncpg.connect(dsn)
        try:
            deadline = time.monotonic() + 20
            while not lost and time.monotonic() < deadline:
                holder = await look.fetchval(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND (classid::bigint << 32 | objid::bigint) = $1", owner.PG_LOCK_KEY)
                now = lock._conn  # (assigned once its lock is taken)
                if now is not None and now is not stand_in and holder == now.get_server_pid():
                    break
                await asyncio.sleep(0.05)
            assert lost == [], lost
            assert holder == lock._conn.get_server_pid() != old_pid
            # The old session was ended: read on the server, not by a query on `old` (the lock's
            # watch may have a `SELECT 1` of its own in flight there: asyncpg then raised
            # InternalClientError "another operation is in progress", 1 run in 3).
            for _ in range(100):
                if not await look.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", old_pid):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the old session (pid {old_pid}) is still open on the server")
        finally:
            await look.close()
            old.terminate()
            await lock.release()

    asyncio.run(run())


@pytest.mark.pg
def test_no_write_while_the_lock_is_lost_and_maybe_taken(pg_url: str, make_scheduler: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Its lock's session ended (a restart; a partition PostgreSQL gave up on) and another
    scheduler took the database before the watch looks again (every 2 s, slowed here to
    never): a submission was written beside the other's work; now UNAVAILABLE until the
    lock is taken back (or the other found, and this one stops: the test above)."""
    import asyncpg

    from scheduler.state import owner
    from scheduler.state.owner import PG_LOCK_KEY

    monkeypatch.setattr(owner, "CHECK_EVERY_S", 3600.0)
    sched = make_scheduler(pg_url)
    dsn = pg_url.replace("+asyncpg", "")

    def submit() -> grpc.RpcError | None:
        with grpc.insecure_channel(sched.address) as ch:
            try:
                scheduler_pb2_grpc.SchedulerStub(ch).SubmitJob(scheduler_pb2.SubmitJobRequest(
                    spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1)), timeout=20)
            except grpc.RpcError as err:
                return err
        return None

    async def take_over() -> grpc.RpcError | None:
        other = await asyncpg.connect(dsn, server_settings={"application_name": "the other one"})
        try:
            pid = await other.fetchval(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())")
            await other.fetchval("SELECT pg_terminate_backend($1)", pid)
            for _ in range(100):
                if await other.fetchval("SELECT pg_try_advisory_lock($1)", PG_LOCK_KEY):
                    return await asyncio.to_thread(submit)  # (the other one holds the database)
                await asyncio.sleep(0.05)
            raise AssertionError("the lock was not let go")
        finally:
            await other.close()

    err = asyncio.run(take_over())
    assert err is not None, "a submission was taken while another scheduler held the database"
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert "lock's connection dropped" in (err.details() or ""), err.details()
