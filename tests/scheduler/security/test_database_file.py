"""The scheduler's SQLite file holds every job's environment and the tokens' hashes."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .conftest import make_token


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_file_is_its_owners_only(make_scheduler: Any, tmp_path: Path, connect: Any) -> None:
    """Created under the usual umask (022) it was mode 644: any user of the scheduler's host read
    every job's environment (API keys) and the tokens' hashes, with which runtime tokens and
    transfer tickets are made. Now a new database is 600, and one readable by others (its -wal
    and -shm files too) is made so when the scheduler opens it."""
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh" / "state.db"
        make_token(f"sqlite+aiosqlite:///{fresh}", "alice")  # `gandiva token create` on a new database
        assert _mode(fresh) == 0o600

        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        token = make_token(url, "alice")
        db = tmp_path / "old.db"
        db.chmod(0o644)
        sched = make_scheduler(url, tick_s=0.2, auth="token")
        alice = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, token))
        alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["python", "t.py"], gpus=1, env={"WANDB_API_KEY": "secret"})))
        for part in (db, tmp_path / "old.db-wal", tmp_path / "old.db-shm"):
            assert not part.exists() or _mode(part) == 0o600, (part, oct(_mode(part)))
        assert _mode(db) == 0o600
    finally:
        os.umask(old)


def test_a_database_holding_job_states_this_version_does_not_know_is_refused_at_start(
        make_scheduler: Any, sqlite_url: str) -> None:
    """States are text: a newer gandiva's (this one run again after a rollback, the schema
    unchanged) or a hand edit's were taken at start, and then `gandiva get jobs` answered every
    caller INTERNAL (ValueError: 'PREEMPTED' is not a valid JobState) as long as the job was
    listed. Now the start is refused, naming the states, a job and what to do."""
    import asyncio
    import sqlite3

    import grpc

    from scheduler.server import SchedulerServer

    sched = make_scheduler(sqlite_url, tick_s=0.2)
    with grpc.insecure_channel(sched.address) as channel:
        job = scheduler_pb2_grpc.SchedulerStub(channel).SubmitJob(scheduler_pb2.SubmitJobRequest(
            spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
    sched.stop()
    with sqlite3.connect(sqlite_url.removeprefix("sqlite+aiosqlite:///")) as db:
        db.execute("UPDATE jobs SET state = 'PREEMPTED' WHERE id = ?", (job,))

    async def start() -> str:
        server = SchedulerServer(db_url=sqlite_url, listen="127.0.0.1:0")
        try:
            await server.start()
        except ValueError as refused:
            return str(refused)
        await server.stop(0.1)
        return "started"

    said = asyncio.run(start())
    assert f"holds jobs in states this gandiva does not know: 'PREEMPTED' (1 job, e.g. {job})" in said, said
    assert "Nothing was changed" in said, said


def test_a_damaged_database_file_says_so_and_how_to_save_what_it_holds(
        tmp_path: Path, capsys: Any) -> None:
    """A database file cut short (a disk that filled, a copy taken mid-write) was "database disk
    image is malformed" alone, for `gandiva scheduler`, `db current` and `token list`: nothing of
    what it means or what to do. Now: damaged, restore it or recover it with sqlite3, in one line;
    the file is left as it was."""
    import hashlib

    from gandiva_cli.main import main

    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    make_token(url, "alice")
    db = tmp_path / "g.db"
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 2)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    capsys.readouterr()
    root = logging.getLogger()  # `gandiva scheduler` in-process sets it up onto captured stderr
    handlers, level = list(root.handlers), root.level
    for argv in (["db", "current"], ["token", "list"], ["scheduler", "--listen", "127.0.0.1:0"]):
        try:
            code = main([*argv, "--db", url])
        finally:
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        assert (code, out, err.count("\n")) == (2, "", 1), (argv, out, err)
        assert err.endswith(f"--db {url}: database disk image is malformed: the file is damaged (cut short or "
                            "partly written over: a disk that filled, a copy taken while a scheduler wrote it); "
                            "restore it from a backup, or save what it holds with `sqlite3 FILE .recover | "
                            "sqlite3 NEW.db` and give --db that one\n"), (argv, err)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
