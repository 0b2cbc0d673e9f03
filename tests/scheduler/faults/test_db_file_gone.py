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
        # Or refused, "retry shortly", and not stored: a connection the scheduler opened
        # before its watch noticed (within a second) made a new, empty file at the path
        # (seen once in CI on "deleted": "no such table: jobs"). Known limit, docs/scheduler.md.
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
    wait_for(sched.server.lost.is_set, 10)
    sched.stop()
    why = sched.server.lost_why
    if fault == "replaced" or "was replaced by another file" in why:
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
