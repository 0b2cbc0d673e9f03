"""HelperServicer._within (a helper's heartbeat, GPU samples and process exits bounded while
the database is slow or cut off): what it keeps once the work is done."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from scheduler.api.helper_api import HelperServicer
from scheduler.errors import NotFound


def test_a_made_up_server_name_leaves_nothing_behind() -> None:
    """ReportGpuSamples and ReportProcessExit key their work by the server named, checked
    only inside it: 1,000 made-up names kept 1,000 ended tasks (and their errors) for good."""
    core = SimpleNamespace(db_health=SimpleNamespace(up=True, text=lambda: ""), settings=SimpleNamespace(lease=6.0))
    servicer = HelperServicer(core, None)  # type: ignore[arg-type]

    async def unknown() -> None:
        raise NotFound("server", "never registered")

    async def main() -> None:
        for i in range(1000):
            with pytest.raises(NotFound):
                await servicer._within(("exit", f"ghost-{i}"), unknown)
        await asyncio.sleep(0)  # (done callbacks run on the next turn of the loop)

    asyncio.run(main())
    assert servicer._pending == {}


async def test_helpers_are_answered_from_memory_only_until_another_scheduler_could_act(sqlite_url: str) -> None:
    """A scheduler cut off from PostgreSQL but not from its helpers answered their heartbeats
    from memory for the whole cut (each answer vouched for the next), while a standby that
    took the database once PostgreSQL ended the lost session (~11 s) called their servers
    down and ran their jobs elsewhere: two copies of each job trained. Now the answers stop
    once the lock has gone unconfirmed for PG_SESSION_END_MIN_S + down_after_s - lease -
    LEASE_MARGIN_S: the helpers freeze their jobs before any standby can call them down."""
    from scheduler.core import LEASE_MARGIN_S, SchedulerCore, Settings
    from scheduler.state.db import PG_SESSION_END_MIN_S, make_engine

    engine = make_engine(sqlite_url)
    now = [1000.0]
    core = SchedulerCore(engine, Settings(down_after_s=10.0), clock=lambda: now[0])
    unconfirmed = [0.0]
    core.lock_unconfirmed_s = lambda: unconfirmed[0]
    try:
        bound = core.memory_answers_s()
        assert bound == PG_SESSION_END_MIN_S + 10.0 - core.settings.lease - LEASE_MARGIN_S == 8.0
        # The latest moment a helper's lease is renewed, plus its lease and the watchdog's
        # margin, comes before a standby's first chance to call its server down.
        assert bound + core.settings.lease + LEASE_MARGIN_S <= PG_SESSION_END_MIN_S + core.settings.down_after_s
        core._vouched["a"] = now[0]  # a heartbeat of "a" recorded just now
        answered = []
        for _ in range(6):  # a cut: each heartbeat answered from memory vouches for the next
            now[0] += 2.0
            unconfirmed[0] += 2.0
            answered.append(core.heartbeat_unrecorded("a"))
        assert answered == [True, True, True, True, False, False]  # up to 8 s unconfirmed, not at 10 or 12
        unconfirmed[0] = 0.5  # the lock confirmed again (the link back)
        core._vouched["a"] = now[0]
        assert core.heartbeat_unrecorded("a")
        unconfirmed[0] = float("inf")  # a lock never confirmed
        assert not core.heartbeat_unrecorded("a")
    finally:
        await core.dispose()
        await engine.dispose()


def test_stops_a_slow_recording_works_out_reach_the_helper_with_a_later_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database slower than SLOW_DB_S per heartbeat: each heartbeat of a vouched helper is
    answered from memory while its recording goes on, and the stops that recording works out
    (a stale launch the helper still runs) were thrown away, worked out again by the next
    recording and thrown away again: no stop reached the helper for as long as the database
    stayed that slow. Now they go with the helper's next answer, once."""
    from protos.gandiva.v1 import helper_pb2
    from scheduler.api import helper_api

    monkeypatch.setattr(helper_api, "SLOW_DB_S", 0.05)

    async def heartbeat(name: str, running: list[tuple[str, str]], instance: str) -> tuple:
        await asyncio.sleep(0.2)  # slower than SLOW_DB_S, every time
        stop = [helper_pb2.StopJob(job_id=j, incarnation=i) for j, i in running if i == "stale"]
        return True, stop, None

    async def reconcile(*_: object) -> None:
        return None

    async def peers() -> tuple[int, list]:
        return 1, []

    core = SimpleNamespace(
        db_health=SimpleNamespace(up=True, text=lambda: ""), settings=SimpleNamespace(lease=6.0),
        vouched=lambda name: True, heard=lambda name, instance: True, heartbeat_unrecorded=lambda name: True,
        heartbeat=heartbeat, clock=lambda: 1000.0, peers=peers)
    servicer = HelperServicer(core, SimpleNamespace(reconcile_server=reconcile))  # type: ignore[arg-type]
    beat = helper_pb2.HeartbeatRequest(name="a", running=[helper_pb2.JobIncarnation(job_id="j", incarnation="stale")])

    async def main() -> list[list[tuple[str, str]]]:
        stops = []
        for _ in range(4):
            reply = await servicer.Heartbeat(beat, None)
            assert reply.known
            stops.append([(s.job_id, s.incarnation) for s in reply.stop])
            await asyncio.sleep(0.25)  # the heartbeat interval: the recording ends meanwhile
        return stops

    stops = asyncio.run(main())
    assert stops[0] == [] and ("j", "stale") in stops[1], stops
    assert all(s.count(("j", "stale")) <= 1 for s in stops), stops


async def test_a_write_after_the_lock_went_unconfirmed_asks_the_database_first(sqlite_url: str) -> None:
    """A scheduler whose host was frozen (a paused VM) past PostgreSQL's keepalives: its
    lock's socket reads open until it sends again, while a standby may hold the database.
    Its writes went on (heartbeats recorded, leases renewed) until the watch's next query,
    up to 2 s later. Now a write after PG_SESSION_END_MIN_S unconfirmed asks the lock first."""
    from scheduler.core import SchedulerCore
    from scheduler.errors import Unavailable
    from scheduler.state import migrate
    from scheduler.state.db import PG_SESSION_END_MIN_S, make_engine

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    asked: list[float] = []
    unconfirmed = [PG_SESSION_END_MIN_S + 10.0]  # the freeze
    answer: list[bool | None] = [False]  # another scheduler took the database meanwhile

    async def confirm() -> bool | None:
        asked.append(unconfirmed[0])
        return answer[0]

    core.lock_unconfirmed_s, core.lock_confirm = lambda: unconfirmed[0], confirm
    try:
        with pytest.raises(Unavailable):
            await core._check_held()
        assert asked == [unconfirmed[0]]
        answer[0] = True  # still its own: the write goes on
        await core._check_held()
        unconfirmed[0] = 1.0  # confirmed lately by the watch: not asked again
        await core._check_held()
        assert len(asked) == 2
    finally:
        await core.dispose()
        await engine.dispose()


async def test_a_helpers_last_word_keeps_its_successors_claim_made_meanwhile(sqlite_url: str) -> None:
    """A helper stopping (its last word, `leaving`) while its successor registers (systemd's
    restart, the last word's write waiting for the database): the leaving helper's write,
    done after, dropped the successor's claim of the name, and a third helper given the same
    name was let in beside the live successor. Now that claim stays: the third is refused."""
    from protos.gandiva.v1 import common_pb2, helper_pb2
    from scheduler.core import SchedulerCore, Settings
    from scheduler.errors import FailedPrecondition
    from scheduler.state import migrate
    from scheduler.state.db import make_engine

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine, Settings(down_after_s=10.0))

    def helper(instance: str) -> helper_pb2.RegisterServerRequest:
        return helper_pb2.RegisterServerRequest(name="a", gpus=[common_pb2.Gpu(index=0)], instance=instance)
    try:
        await core.register_server(helper("old"))
        await asyncio.gather(core.server_leaving("a", "old"), core.register_server(helper("new")))
        assert core._instances["a"][0] == "new"
        with pytest.raises(FailedPrecondition, match="held by another live helper"):
            await core.register_server(helper("third"))
    finally:
        await core.dispose()
        await engine.dispose()


async def test_a_peer_list_read_while_a_helper_registers_is_not_kept(sqlite_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat read the registered helpers while another helper's registration was
    being written, and the scheduler kept that list: the new helper was missing from every
    helper's peer list until a later registration, and each checkpoint streamed to it was
    refused ("is not the agent address of a registered helper (the scheduler lists 1 ...)",
    the move falling back to a restart at its source; CI of session 50). Now a list read
    before a registration is answered once but not kept."""
    from protos.gandiva.v1 import common_pb2, helper_pb2
    from scheduler.core import SchedulerCore, Settings
    from scheduler.state import migrate, repo
    from scheduler.state.db import make_engine

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine, Settings(down_after_s=10.0))

    def helper(name: str) -> helper_pb2.RegisterServerRequest:
        return helper_pb2.RegisterServerRequest(name=name, gpus=[common_pb2.Gpu(index=0)], instance=name,
                                                address={"a": "127.0.0.1:4001", "b": "127.0.0.1:4002"}[name])
    read, go = asyncio.Event(), asyncio.Event()
    real = repo.helper_agents

    async def slow_read(session):  # type: ignore[no-untyped-def]
        agents = await real(session)
        read.set()
        await go.wait()  # the registration of b commits meanwhile
        return agents
    try:
        await core.register_server(helper("a"))
        monkeypatch.setattr(repo, "helper_agents", slow_read)
        heartbeat = asyncio.ensure_future(core.peers())
        await read.wait()
        await core.register_server(helper("b"))
        go.set()
        assert [n for n, _ in (await heartbeat)[1]] == ["a"]  # read before b: answered as read
        monkeypatch.setattr(repo, "helper_agents", real)
        assert [n for n, _ in (await core.peers())[1]] == ["a", "b"]
    finally:
        await core.dispose()
        await engine.dispose()
