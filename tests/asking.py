"""Asking the scheduler again while it answers "busy", as a user (and the CLI) would."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc


def migrate(stub: scheduler_pb2_grpc.SchedulerStub, job_id: str, dest: str, within_s: float = 60,
            also: Callable[[grpc.RpcError], bool] = lambda err: False) -> float:
    """MigrateJob, asked again while the job is busy (a periodic checkpoint or a policy
    command in flight: scheduler/errors.Busy, told by `client.is_busy`), or while ``also``
    says a refusal is worth asking again; seconds until it was taken. Any other refusal,
    or one still given after ``within_s``, fails the test with its details."""
    from scheduler.cli.client import is_busy

    t0 = time.monotonic()
    while True:
        try:
            stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest), timeout=30)
            return time.monotonic() - t0
        except grpc.RpcError as err:
            if not (is_busy(err) or also(err)):
                raise AssertionError(f"MigrateJob of {job_id} to {dest} refused: {err.details()}") from err
            if time.monotonic() - t0 > within_s:
                raise AssertionError(
                    f"MigrateJob of {job_id} to {dest} refused for {within_s:.0f}s: {err.details()}") from err
            time.sleep(0.25)
