"""The state layer on SQLite and PostgreSQL: submissions, the state machine,
atomicity of multi-job submission and server bookkeeping."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler import auth
from scheduler.core import SchedulerCore
from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound
from scheduler.lifecycle import JobState
from scheduler.state import migrate, repo
from scheduler.state.db import make_engine


@pytest.fixture
async def core(db_url: str) -> AsyncIterator[SchedulerCore]:
    engine = make_engine(db_url)
    await migrate.upgrade(engine)
    yield SchedulerCore(engine)
    await engine.dispose()


def spec(gpus: int = 1, **kw: object) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=["python", "train.py"], gpus=gpus, **kw)  # type: ignore[arg-type]


async def test_submit_persists_job_transition_and_event(core: SchedulerCore) -> None:
    d = await core.submit(spec(2, name="resnet", priority=3))
    got = await core.get_job(d.job.id)
    assert (got.job.name, got.job.gpus, got.job.priority, got.job.state) == ("resnet", 2, 3, "QUEUED")
    assert [t.to_state for t in got.history] == ["QUEUED"]
    events = await core.list_events(job_id=d.job.id)
    assert [e.kind for e in events] == ["job.submitted"]


async def test_a_restarted_scheduler_waits_before_calling_a_silent_server_down(db_url: str) -> None:
    """Servers that went quiet while the scheduler was stopped are not declared down (and
    their jobs not re-placed) until the new scheduler has itself waited `down_after_s`."""
    engine = make_engine(db_url)
    await migrate.upgrade(engine)
    now = [1000.0]
    first = SchedulerCore(engine, clock=lambda: now[0])
    gpus = [common_pb2.Gpu(index=0, model="virtual")]
    await first.register_server(helper_pb2.RegisterServerRequest(name="s1", gpus=gpus))
    # The scheduler is down for a long time; a new one starts.
    now[0] += 10 * first.settings.down_after_s
    second = SchedulerCore(engine, clock=lambda: now[0])
    assert await second.mark_stale_servers_down() == []
    now[0] += second.settings.down_after_s / 2
    assert await second.mark_stale_servers_down() == []
    (load,) = await second.list_servers()
    assert load.server.up
    # Still silent a whole down_after_s after the restart: down.
    now[0] += second.settings.down_after_s
    assert await second.mark_stale_servers_down() == ["s1"]
    await engine.dispose()


async def test_a_stall_that_begins_while_a_round_awaits_the_database_takes_no_server_down(
        core: SchedulerCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler stopped (SIGSTOP, a paused VM) for longer than `down_after_s` just as
    a round awaited the database, after that round had checked for a stall: when it runs
    again, its server is not called down (its helper gets a whole `down_after_s` to be
    heard, as after any stall). It used to be, its jobs re-queued and their processes told
    to exit (CI: test_scheduler_clock_jump)."""
    mono = [100.0]
    core.monotonic = lambda: mono[0]
    core.started_mono = mono[0]
    gpus = [common_pb2.Gpu(index=0, model="virtual")]
    await core.register_server(helper_pb2.RegisterServerRequest(name="s1", gpus=gpus))
    core._alive_at = mono[0]  # what watch_stalls does while the engine runs
    mono[0] += core.settings.down_after_s + 1  # up long enough; s1 heard just now
    core._heard["s1"] = core._alive_at = mono[0]
    up_servers = repo.up_servers

    async def stalled(s: object) -> object:
        mono[0] += core.settings.down_after_s + 1  # stopped while awaiting the database
        return await up_servers(s)  # type: ignore[arg-type]

    monkeypatch.setattr(repo, "up_servers", stalled)
    assert await core.mark_stale_servers_down() == []
    (load,) = await core.list_servers()
    assert load.server.up
    # Still silent a whole down_after_s after the stall: down.
    monkeypatch.setattr(repo, "up_servers", up_servers)
    core._alive_at = mono[0] = mono[0] + core.settings.down_after_s
    assert await core.mark_stale_servers_down() == ["s1"]


async def test_invalid_submission_writes_nothing(core: SchedulerCore) -> None:
    with pytest.raises(InvalidArgument) as err:
        await core.submit(spec(3))
    assert err.value.field == "spec.gpus"
    with pytest.raises(InvalidArgument) as err:
        await core.submit(common_pb2.JobSpec(gpus=1))
    assert err.value.field == "spec.command"
    with pytest.raises(InvalidArgument):
        await core.submit(spec(1, priority=-1))
    assert await core.list_jobs() == []
    assert list(await core.list_events()) == []


async def test_multi_job_is_all_or_nothing(core: SchedulerCore) -> None:
    with pytest.raises(InvalidArgument) as err:
        await core.submit_multi("sweep", [spec(1), spec(1), spec(0)])
    assert err.value.field == "jobs[2].gpus"
    assert await core.list_jobs() == []
    mj, _ = await core.submit_multi("sweep", [spec(1, index=i) for i in range(4)])
    listed = await core.list_jobs(multi_job_id=mj)
    assert sorted(d.job.array_index for d in listed) == [0, 1, 2, 3]


async def test_state_machine_rejects_illegal_transitions(core: SchedulerCore) -> None:
    d = await core.submit(spec())
    killed = await core.kill(d.job.id)
    assert killed.job.state == "KILLED"
    with pytest.raises(FailedPrecondition):
        await core.kill(d.job.id)
    async with core.tx() as s:
        job = await repo.get_job(s, d.job.id)
        with pytest.raises(FailedPrecondition, match="KILLED"):
            await repo.transition(s, job, JobState.RUNNING, 1.0)
    assert (await core.get_job(d.job.id)).job.state == "KILLED"


async def test_unknown_job_is_not_found(core: SchedulerCore) -> None:
    with pytest.raises(NotFound):
        await core.get_job("j-nope")
    with pytest.raises(NotFound):
        await core.set_priority("j-nope", 2)


async def test_server_registration_heights_and_down(core: SchedulerCore) -> None:
    gpus = [common_pb2.Gpu(index=i, model="virtual") for i in range(4)]
    await core.register_server(helper_pb2.RegisterServerRequest(name="s1", gpus=gpus))
    d = await core.submit(spec(2))
    async with core.tx() as s:
        job = await repo.get_job(s, d.job.id)
        await repo.set_placement(s, job.id, [("s1", 0), ("s1", 1)], core.clock())
        await repo.transition(s, job, JobState.RUNNING, core.clock(), "test placement")
    (load,) = await core.list_servers()
    assert (load.allocated, load.height, load.affinity) == (2, 1, 2)
    # The server stops heartbeating: it goes down and its job returns to the queue.
    core.monotonic = lambda: 10**10  # silence is measured on the monotonic clock
    assert await core.mark_stale_servers_down() == ["s1"]
    got = await core.get_job(d.job.id)
    assert got.job.state == "QUEUED" and got.placement == []
    (load,) = await core.list_servers()
    assert not load.server.up and load.allocated == 0


async def test_an_event_family_filter_is_the_same_on_both_databases(core: SchedulerCore) -> None:
    """`gandiva get events --kind job` lists job.submitted; `--kind JOB` or `--kind j_b`
    (LIKE's wildcard) lists nothing, as the CLI's own --watch filter and PostgreSQL do.
    Before, SQLite's LIKE (case-blind, on ASCII) listed job.submitted for `JOB` too."""
    await core.submit(spec())
    async with core.tx(read=True) as s:
        def kinds(*wanted: str):  # type: ignore[no-untyped-def]
            return repo.list_events(s, kinds=list(wanted))

        assert [e.kind for e in await kinds("job")] == ["job.submitted"]
        assert [e.kind for e in await kinds("job.submitted")] == ["job.submitted"]
        assert list(await kinds("JOB")) == [] and list(await kinds("Job.submitted")) == []
        assert list(await kinds("j_b")) == [] and list(await kinds("jo%")) == []


@pytest.fixture(params=["sqlite", pytest.param("postgresql-icu", marks=pytest.mark.pg)])
def url_any_collation(request: pytest.FixtureRequest, sqlite_url: str):  # type: ignore[no-untyped-def]
    """SQLite, then a PostgreSQL database made with an ICU locale (en-US), as an
    installation made with a locale has, not the C collation of the tests' server."""
    if request.param == "sqlite":
        yield sqlite_url
        return
    import asyncpg

    from ...conftest import fresh_pg_database, pg_skip_reason

    reason = pg_skip_reason()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(fresh_pg_database(
                "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"))
        except asyncpg.PostgresError as err:
            pytest.skip(f"this PostgreSQL cannot make an ICU database: {err}")
        yield url


async def test_servers_are_listed_in_one_order_on_both_databases(url_any_collation: str) -> None:
    """Servers whose names differ in case and punctuation come in code-point order
    (SQLite's) on a PostgreSQL whose collation is a locale's too: the listings (`gandiva
    get servers`), the largest server's tie and the snapshot a round reads. Before, that
    PostgreSQL gave gpu_c, gpu-a, gpu-B, gpuD (SQLite: gpu-B, gpu-a, gpuD, gpu_c)."""
    engine = make_engine(url_any_collation)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        names = ["gpu-a", "gpu_c", "gpuD", "gpu-B"]
        for name in names:
            await core.register_server(helper_pb2.RegisterServerRequest(name=name, gpus=[common_pb2.Gpu(index=0)]))
        want = sorted(names)
        assert want == ["gpu-B", "gpu-a", "gpuD", "gpu_c"]
        async with core.tx(read=True) as s:
            assert [name for name, _ in await repo.helper_agents(s)] == want
            assert await repo.largest_server(s) == (1, want[0])
            assert [load.server.name for load in await repo.server_loads(s)] == want
        rows = await core.read_sync(repo.snapshot_rows)
        assert [row.name for row in rows.servers] == want and list(rows.gpu_indices) == want
        async with core.tx() as s:  # `gandiva token list`: token names are of the same kind
            for name in names:
                await auth.create_token(s, name, "user")
        async with core.tx(read=True) as s:
            assert [t.name for t in await auth.list_tokens(s)] == want
    finally:
        await core.dispose()
        await engine.dispose()
