"""The SQLite file under a running scheduler deleted, moved away or replaced, or its
write-ahead log deleted (a clean-up script, a mistaken `rm`, a backup restored with `mv`).

SQLite goes on writing to the file it opened, whatever became of its name. Before, the
scheduler went on as if nothing happened, accepting submissions, and its next start found
no database (or a log-less file holding nothing: every job was in the log) and made an
empty one: every job, server and event was gone. Now it notices within a second, stops
(exit 2 from `gandiva scheduler`), and puts the database as it had it back at its path
(or beside it, when another database was put there): a restart finds every job."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.conftest import SQLITE_PREFIX


def submit(address: str, name: str) -> str:
    with grpc.insecure_channel(address) as ch:
        spec = common_pb2.JobSpec(name=name, command=["python", "train.py"], gpus=1)
        return scheduler_pb2_grpc.SchedulerStub(ch).SubmitJob(
            scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id


def job_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(r[0] for r in db.execute("SELECT id FROM jobs"))


@pytest.mark.parametrize("fault", ["deleted", "moved away", "replaced", "its log deleted"])
def test_a_database_file_taken_from_under_the_scheduler_loses_no_job(
        fault: str, make_scheduler: Any, sqlite_url: str, sqlite_schema: Path, tmp_path: Path,
        wait_for: Any) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.2)
    path = Path(sqlite_url[len(SQLITE_PREFIX):])
    jobs = [submit(sched.address, "a"), submit(sched.address, "b")]
    if fault == "deleted":
        path.unlink()
    elif fault == "moved away":
        path.rename(tmp_path / "elsewhere.db")
    elif fault == "replaced":  # another database moved onto its name
        shutil.copyfile(sqlite_schema, tmp_path / "other.db")
        os.replace(tmp_path / "other.db", path)
    else:
        Path(f"{path}-wal").unlink()
    try:
        jobs.append(submit(sched.address, "c"))  # accepted meanwhile: kept too
    except grpc.RpcError as err:
        # Or refused, "retry shortly", and not stored: a connection one of the scheduler's
        # pools opens before its watch notices (within a second) is refused (SqliteFile).
        # It used to make a new, empty database at the path ("no such table: jobs", in CI).
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert "no such table" not in (err.details() or ""), err.details()
    wait_for(sched.server.lost.is_set, 10)
    sched.stop()
    why = sched.server.lost_why
    if fault == "replaced":
        # The file put there is left alone (as SQLite left it: it applies the old log to
        # whatever file has the name); this scheduler's database is beside it.
        (copy,) = tmp_path.glob("state.db.recovered-*")
        assert job_ids(copy) == sorted(jobs)
        assert f"is in {copy}: move it to {path}" in why, why
        return
    assert f"stopped; the database as this scheduler had it is back at {path}" in why, why
    assert not list(tmp_path.glob("state.db.recovered-*"))
    again = make_scheduler(sqlite_url, tick_s=0.2)
    with grpc.insecure_channel(again.address) as ch:
        listed = scheduler_pb2_grpc.SchedulerStub(ch).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
    assert sorted(j.id for j in listed) == sorted(jobs)
    assert all(j.state == common_pb2.JOB_STATE_QUEUED for j in listed)


@pytest.mark.parametrize("fault", ["deleted", "replaced"])
async def test_no_pool_opens_a_connection_on_another_file_than_the_first_one(
        fault: str, sqlite_schema: Path, tmp_path: Path) -> None:
    """Each pool of a scheduler (its async engines, writer and readers) opens connections
    when it first needs them. One opened after the file was deleted made a new, empty
    database at the name ("no such table: jobs"); one opened after another file was moved
    there read (and reset the write-ahead log index of) that other file. Now each such
    connection is refused before it touches anything: a database unreachable (a request:
    UNAVAILABLE, retry shortly) for the second until the watch stops the scheduler."""
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import text

    from scheduler.core import SchedulerCore
    from scheduler.errors import Unavailable
    from scheduler.state.db import make_engine

    path = tmp_path / "state.db"
    shutil.copyfile(sqlite_schema, path)
    engine = make_engine(f"{SQLITE_PREFIX}{path}")
    core = SchedulerCore(engine)
    first = await engine.connect()  # held, as the scheduler's own connections are
    query = text("SELECT message FROM events WHERE kind = 'k'")
    try:
        await first.execute(text("INSERT INTO events (at, kind, job_id, server, message) "
                                 "VALUES (1.0, 'k', '', '', 'kept')"))
        await first.commit()
        if fault == "deleted":
            path.unlink()
        else:
            shutil.copyfile(sqlite_schema, tmp_path / "other.db")
            os.replace(tmp_path / "other.db", path)
        other = path.read_bytes() if fault == "replaced" else b""

        async def new_connection() -> list[str]:
            async with engine.connect() as conn:  # the first one is checked out: a new one
                return list((await conn.execute(query)).scalars())

        async def read_engine() -> list[str]:
            async with core.read_engine.connect() as conn:
                return list((await conn.execute(query)).scalars())

        for pool, read in [("engine", new_connection), ("read engine", read_engine),
                           ("writer", lambda: core.write_sync(lambda c: list(c.execute(query).scalars()))),
                           ("reader", lambda: core.read_sync(lambda s: list(s.execute(query).scalars())))]:
            try:
                seen = await read()
            except (sa_exc.OperationalError, Unavailable) as err:
                assert "no such table" not in str(err), f"{pool}: {err}"
            else:  # a connection opened before the fault: the scheduler's own state
                assert seen == ["kept"], f"{pool} read another database: {seen}"
        # Those pools' connections closed (a connection on the other file, the last on it,
        # would write the scheduler's log into it and delete the log), the first one held.
        await core.dispose()
        await engine.dispose()
        if fault == "deleted":
            assert not path.exists(), "a connection made a new database at the name"
        else:
            assert path.read_bytes() == other, "the file moved there was written to"
        # The scheduler's state is whole, through the connection it held.
        assert list((await first.execute(query)).scalars()) == ["kept"]
    finally:
        await first.close()
        await core.dispose()
        await engine.dispose()
