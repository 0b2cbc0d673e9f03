"""A real local cluster for end-to-end tests: an in-process scheduler on a fresh
SQLite database and `gandiva helper` daemons as separate processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.local_cluster import stop_processes
from scheduler.core import Settings
from scheduler.policy.types import PolicyConfig

from .. import asking
from ..leases import remove_lease_folders


class Cluster:
    def __init__(self, sched, tmp: Path, wait_for: Callable) -> None:  # type: ignore[no-untyped-def]
        self.sched = sched
        self.tmp = tmp
        self.wait_for = wait_for
        self.helpers: list[subprocess.Popen] = []
        self.channel = grpc.insecure_channel(sched.address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def add_helper(self, name: str, gpus: int, *extra: str) -> None:
        with open(self.tmp / f"helper-{name}.log", "w") as log:
            self.helpers.append(subprocess.Popen(
                [sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", name,
                 "--gpus", str(gpus), "--scheduler", self.sched.address,
                 "--ramdisk", str(self.tmp / f"ramdisk-{name}"), "--log-dir", str(self.tmp / "logs"),
                 *extra],
                stdout=log, stderr=subprocess.STDOUT,
            ))
        self.wait_for(lambda: any(
            s.name == name and s.up
            for s in self.stub.ListServers(scheduler_pb2.ListServersRequest()).servers
        ), 60)

    def job(self, job_id: str):  # type: ignore[no-untyped-def]
        return self.stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id))

    def migrate(self, job_id: str, dest: str, within_s: float = 60) -> None:
        """MigrateJob, asked again while the job is busy, as `gandiva migrate` does; any
        other refusal fails at once (tests/asking.py)."""
        asking.migrate(self.stub, job_id, dest, within_s)

    def close(self) -> None:
        stop_processes(self.helpers)
        for proc in self.helpers:  # (one killed after its grace: reaped)
            proc.wait(10)
        remove_lease_folders(self.tmp.glob("ramdisk-*"))
        self.channel.close()


def _with_env_rules(policy: PolicyConfig) -> PolicyConfig:
    """GANDIVA_TEST_POLICY_OPTIONS="KEY=VALUE ..." (as `gandiva serve --policy-option`) turns
    rules on in every cluster these fixtures make, over the test's own knobs: the live tests
    of time-slicing, first turns and parks replayed with a rule measured for a default
    (docs/simulator.md, "... the checks before a switch"). Unset: the test's config as written."""
    import dataclasses

    from scheduler.cli.serve import policy_options

    options = os.environ.get("GANDIVA_TEST_POLICY_OPTIONS", "").split()
    return dataclasses.replace(policy, **policy_options(options)) if options else policy


def _cluster(make_scheduler, sqlite_url: str, tmp_path: Path, wait_for,  # type: ignore[no-untyped-def]
             policy: PolicyConfig | None = None, **extra: object) -> Iterator[Cluster]:
    sched = make_scheduler(
        sqlite_url,
        tick_s=0.2,
        policy_config=_with_env_rules(policy or PolicyConfig(quantum_s=1.5)),
        settings=Settings(heartbeat_interval_s=1.0, down_after_s=4.0),
        **extra,
    )
    c = Cluster(sched, tmp_path, wait_for)
    yield c
    c.close()


@pytest.fixture
def cluster(make_scheduler, sqlite_url: str, tmp_path: Path, wait_for) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    yield from _cluster(make_scheduler, sqlite_url, tmp_path, wait_for)


@pytest.fixture
def policy_cluster(make_scheduler, sqlite_url: str, tmp_path: Path, wait_for):  # type: ignore[no-untyped-def]
    """The same cluster with policy knobs of the test's choosing: call it with
    PolicyConfig fields (quantum_s is 1.5 unless given)."""
    made: list[Iterator[Cluster]] = []

    def make(**knobs: object) -> Cluster:
        gen = _cluster(make_scheduler, sqlite_url, tmp_path, wait_for, PolicyConfig(**{"quantum_s": 1.5, **knobs}))  # type: ignore[arg-type]
        made.append(gen)
        return next(gen)

    yield make
    for gen in made:
        next(gen, None)


@pytest.fixture
def observed_cluster(make_scheduler, sqlite_url: str, tmp_path: Path, wait_for) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """The same cluster with the scheduler's /metrics and dashboard on a free port
    (``cluster.sched.server.http_address``)."""
    yield from _cluster(make_scheduler, sqlite_url, tmp_path, wait_for, http_listen="127.0.0.1:0")


@pytest.fixture
def mlp() -> Callable[..., list[str]]:
    import importlib.util

    origin = importlib.util.find_spec("tf_runtime.examples.mlp").origin  # type: ignore[union-attr]

    def command(steps: int, sleep: float = 0.02, *extra: str) -> list[str]:
        return ["python", str(origin), "--steps", str(steps), "--step-sleep", str(sleep), *extra]

    return command
