"""PostgreSQL starting up (recovering after a crash or a restart): for a few seconds it
answers every new connection "the database system is starting up" (SQLSTATE 57P03).
Calls then fail with UNAVAILABLE "database unreachable ...; retry shortly" (what
gandiva-submit retries), not INTERNAL "database error (DBAPIError)" with a traceback in
the scheduler's log; once it accepts connections, the next call succeeds."""

from __future__ import annotations

import asyncio
import struct

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from ...relay import Relay
from .test_db_outage import proxied_pg_url  # noqa: F401 - a fixture

# What PostgreSQL sends a client while it recovers: a FATAL ErrorResponse.
_FIELDS = b"".join(k + v + b"\0" for k, v in (
    (b"S", b"FATAL"), (b"V", b"FATAL"), (b"C", b"57P03"), (b"M", b"the database system is starting up")))
STARTING_UP = b"E" + struct.pack("!I", 4 + len(_FIELDS) + 1) + _FIELDS + b"\0"


class StartingUp(Relay):
    """The proxy's relay, answering new connections as a PostgreSQL that starts up."""

    starting = False

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if not self.starting:
            await super()._handle(cr, cw)
            return
        try:
            while True:
                length = struct.unpack("!I", await cr.readexactly(4))[0]
                code = struct.unpack("!I", (await cr.readexactly(length - 4))[:4])[0]
                if code == 80877103:  # SSLRequest: no SSL here
                    cw.write(b"N")
                    await cw.drain()
                    continue
                cw.write(STARTING_UP)  # the StartupMessage's answer
                await cw.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        cw.close()


@pytest.mark.pg
def test_calls_while_postgresql_starts_up_are_unavailable_and_retried(proxied_pg_url, make_scheduler) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    url, proxy = proxied_pg_url
    relay = proxy.relay
    relay.__class__ = StartingUp  # the same running relay, with the starting-up answer
    sched = make_scheduler(url, tick_s=0.2)
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        proxy.cut()  # the crash: every connection gone
        relay.starting = True  # type: ignore[attr-defined]
        proxy.restore()
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert "database is unreachable since" in err.value.details(), err.value.details()
        relay.starting = False  # type: ignore[attr-defined]  # recovered
        second = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30).job
        assert {j.id for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs} == {first.id, second.id}


@pytest.mark.pg
async def test_only_the_servers_own_answer_keeps_a_lost_lock_counted_as_confirmed(proxied_pg_url, pg_url) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A scheduler's lock session lost, its tries to take it back refused: a proxy beside
    it that stopped (or a firewall's REJECT) refuses it alone, while PostgreSQL, which ended
    the session at once, lets a standby take the lock. Its helpers' answers from memory
    must stop as for a partition (SchedulerLock.unconfirmed_s counts on): before, a refusal
    counted as "the server is down for everyone" and the lock read as confirmed for as long
    as it lasted, beside the standby holding the database. The server's own "starting up"
    is said to every scheduler: no standby can take the lock then."""
    from scheduler.state.owner import SchedulerLock

    url, proxy = proxied_pg_url
    relay = proxy.relay
    relay.__class__ = StartingUp
    lock = SchedulerLock(url, "a:1", "a")
    await lock.acquire()
    standby = SchedulerLock(pg_url, "b:1", "b")
    try:
        proxy.cut()
        for _ in range(100):  # its connection seen lost
            if not lock.held():
                break
            await asyncio.sleep(0.05)
        assert await lock.take_back() is None  # refused
        await standby.acquire()  # the database taken by another scheduler meanwhile
        await asyncio.sleep(0.1)
        assert lock.unconfirmed_s() > 0
        await standby.release()
        relay.starting = True  # type: ignore[attr-defined]
        proxy.restore()
        assert await lock.take_back() is None  # "the database system is starting up"
        assert lock.unconfirmed_s() == 0
    finally:
        await standby.release()
        await lock.release()


@pytest.mark.pg
async def test_a_lock_whose_socket_reads_open_is_asked_and_found_taken(proxied_pg_url, pg_url) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """This scheduler's lock session ended (PostgreSQL gave up on a frozen host) and a
    standby took the database, while its socket still reads open (nothing told it yet):
    `confirm` (what a write asks once the lock went unconfirmed) finds the standby."""
    import time

    import asyncpg
    from sqlalchemy.engine import make_url

    from scheduler.state.owner import SchedulerLock

    url, proxy = proxied_pg_url
    lost: list[str] = []
    lock = SchedulerLock(url, "a:1", "a", on_lost=lost.append)
    await lock.acquire()
    standby = SchedulerLock(pg_url, "b:1", "b")
    admin = await asyncpg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        assert await lock.confirm() is True
        proxy.loop.call_soon_threadsafe(time.sleep, 1.0)  # the link frozen: the session's end unseen here
        await asyncio.sleep(0.1)
        await admin.fetchval("SELECT pg_terminate_backend($1)", lock._backend)
        for _ in range(50):
            try:
                await standby.acquire()
                break
            except Exception:  # noqa: BLE001 - the old session still ending
                await asyncio.sleep(0.05)
        assert standby.held() and lock.held()  # its socket still reads open
        assert await lock.confirm() is False
        assert lost and "another scheduler" in lost[0]
    finally:
        await admin.close()
        await standby.release()
        await lock.release()
