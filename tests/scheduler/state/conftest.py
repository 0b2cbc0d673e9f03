"""A SchedulerCore on a fresh database, for the state tests."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.state import migrate
from scheduler.state.db import make_engine

from ...in_process import run_gandiva

SPEC = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)


@asynccontextmanager
async def running_core(url: str) -> AsyncIterator[SchedulerCore]:
    engine = make_engine(url)
    core = SchedulerCore(engine)
    await migrate.upgrade(engine)
    await core.submit(SPEC)  # the first submission reads the largest server: done here
    try:
        yield core
    finally:
        await core.dispose()
        await engine.dispose()


@pytest.fixture
async def core(sqlite_url: str):  # type: ignore[no-untyped-def]
    """On a SQLite file (its writer thread)."""
    async with running_core(sqlite_url) as c:
        yield c


@pytest.fixture
async def any_core(db_url: str):  # type: ignore[no-untyped-def]
    """On SQLite, then on PostgreSQL."""
    async with running_core(db_url) as c:
        yield c



@pytest.fixture
def gandiva(capsys: pytest.CaptureFixture[str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`gandiva ARGS...` through its entry function in this process (tests/in_process.py)."""
    return lambda *argv: run_gandiva(capsys, *argv)
