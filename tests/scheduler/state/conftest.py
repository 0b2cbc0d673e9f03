"""A SchedulerCore on a fresh database, for the state tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from gandiva_cli import main as gandiva_main
from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.state import migrate
from scheduler.state.db import make_engine

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


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def gandiva(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`gandiva ARGS...` through its entry function in this process, output captured:
    the same code as the installed script without a Python start per command (5 s each
    on a loaded CI machine). An argparse refusal (SystemExit) gives its exit code."""

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        try:
            code = gandiva_main.main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run
