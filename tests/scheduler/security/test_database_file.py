"""The scheduler's SQLite file holds every job's environment and the tokens' hashes."""

from __future__ import annotations

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
