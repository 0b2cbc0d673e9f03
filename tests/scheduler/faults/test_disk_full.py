"""The disk holding the scheduler's SQLite database full: calls that write fail with
UNAVAILABLE saying the disk is full (not "database unreachable"), nothing is written,
and once there is room again the next call succeeds without a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from ...migration_helper.test_ramdisk_transfer import small_tmpfs  # noqa: F401 - a fixture


def test_a_full_disk_under_the_database_is_named_and_outlived(
        make_scheduler: Any, small_tmpfs: Path) -> None:  # noqa: F811
    sched = make_scheduler(f"sqlite+aiosqlite:///{small_tmpfs / 'state.db'}", tick_s=0.2)
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
        filler = small_tmpfs / "filler"
        with open(filler, "wb", buffering=0) as out:  # every byte left
            try:
                while out.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        refused: grpc.RpcError | None = None
        for _ in range(3):  # the last pages of the WAL may still take a small write or two
            try:
                stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10)
            except grpc.RpcError as err:
                refused = err
                break
        assert refused is not None, "submissions still written with the disk full"
        err = refused
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "the disk holding the database is full (database or disk is full)" in err.details(), err.details()
        # Reads still work, so nothing but the refused call said so: `gandiva get problems` does.
        said = {p.kind: p for p in stub.ListProblems(scheduler_pb2.ListProblemsRequest(), timeout=10).problems}
        assert "the disk holding the database is full" in said["database.cannot_write"].what, said
        assert said["database.cannot_write"].next.startswith("free space on the database's disk")
        filler.unlink()
        again = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
        ids = [j.id for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs]
        assert first in ids and again in ids
