"""Retention: `gandiva db prune` deletes old finished jobs' events (and with --jobs
the jobs), never an unfinished job's; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from subprocess import CompletedProcess

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.state import migrate, prune, repo
from scheduler.state.db import make_engine


async def _jobs(core: SchedulerCore) -> list[str]:
    return [d.job.id for d in await core.list_jobs()]


async def test_prune_keeps_unfinished_and_recent(db_url: str) -> None:
    engine = make_engine(db_url)
    clock = [1000.0]
    core = SchedulerCore(engine, clock=lambda: clock[0])
    try:
        await migrate.upgrade(engine)
        spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
        old = (await core.submit(spec)).job.id
        running = (await core.submit(spec)).job.id
        await core.kill(old)
        clock[0] = 1000.0 + 10 * 86400
        recent = (await core.submit(spec)).job.id
        await core.kill(recent)
        done = await prune.prune(core, 5 * 86400, now=clock[0])
        assert done.events == 2 and done.jobs == 0  # old's submitted + killed events
        async with core.tx(read=True) as s:
            left = {e.job_id for e in await repo.list_events(s)}
        assert left == {running, recent}
        done = await prune.prune(core, 5 * 86400, jobs=True, now=clock[0])
        assert done.jobs == 1 and sorted(await _jobs(core)) == sorted([running, recent])
    finally:
        await core.dispose()
        await engine.dispose()


def test_db_prune_command(sqlite_url: str, gandiva: Callable[..., CompletedProcess[str]]) -> None:
    assert gandiva("db", "--db", sqlite_url, "upgrade").returncode == 0
    out = gandiva("db", "--db", sqlite_url, "prune", "--older-than", "30")
    assert out.returncode == 0, out.stderr
    assert "deleted 0 events and 0 jobs" in out.stdout
    bad = gandiva("db", "--db", sqlite_url, "prune", "--older-than", "nan")
    assert bad.returncode == 2 and "--older-than" in bad.stderr


def test_token_commands(sqlite_url: str, gandiva: Callable[..., CompletedProcess[str]]) -> None:
    def token(*args: str) -> CompletedProcess[str]:
        return gandiva("token", "--db", sqlite_url, *args)

    made = token("create", "alice", "--operator")
    assert made.returncode == 0 and made.stdout.startswith("gdv.alice.")
    secret = made.stdout.strip()
    listed = token("list")
    assert "alice" in listed.stdout and "operator" in listed.stdout and secret not in listed.stdout
    assert token("create", "alice").returncode == 2  # one live token per name
    assert token("revoke", "alice").returncode == 0
    assert "revoked" in token("list").stdout
    assert token("revoke", "alice").returncode == 2
    assert token("create", "bad/name").returncode == 2
