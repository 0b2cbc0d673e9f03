"""The helper's agent (checkpoint streaming) takes checkpoints only from the
scheduler's registered helpers, sending what the scheduler asked for, and a helper
streams a checkpoint only to a registered helper: on real gRPC, with a real
scheduler (--auth token) and real helper daemons."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from migration_helper import daemon as daemon_mod
from migration_helper.agent import HelperAgentServicer, send_checkpoint
from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.ramdisk import Ramdisk
from protos.gandiva.v1 import helper_pb2, helper_pb2_grpc
from scheduler import auth
from scheduler.core import Settings
from scheduler.errors import FailedPrecondition, PermissionDenied, Unauthenticated
from scheduler.transport import ClientSecurity

from .conftest import make_token

DEST = "gdv.gpu2.secret-of-gpu2"
OTHER = "gdv.gpu3.secret-of-gpu3"


def ticket(token: str = DEST, job: str = "j-1", expires_in: float = 600.0, name: str = "ck") -> str:
    return auth.transfer_ticket(auth.digest(token), token.split(".")[1], job, name, time.time() + expires_in)


# Each ticket is made when its test runs (one made at collection could have expired by
# then, and its text, which holds the time, would differ between pytest-xdist's workers).
@pytest.mark.parametrize(("given", "refusal", "says"), [
    (lambda: "", Unauthenticated, "no transfer ticket"),
    (lambda: "gdvt.x.y", PermissionDenied, "malformed"),
    (lambda: "gdvt.123", PermissionDenied, "malformed"),
    (lambda: ticket(job="j-2"), PermissionDenied, "not the scheduler's for checkpoint 'ck' of job 'j-1'"),
    (lambda: ticket(name="ck2"), PermissionDenied, "not the scheduler's for checkpoint 'ck' of job 'j-1'"),
    (lambda: ticket(token=OTHER), PermissionDenied, "to helper 'gpu2'"),
    (lambda: ticket()[:-4] + "0000", PermissionDenied, "not the scheduler's"),
    (lambda: ticket(expires_in=-5), PermissionDenied, "expired"),
], ids=["none", "malformed-dots", "malformed-short", "other-job", "other-checkpoint", "other-helper", "forged",
        "expired"])
def test_a_transfer_ticket_is_good_for_one_helper_job_and_checkpoint_until_it_expires(
    given: Callable[[], str], refusal: type[Exception], says: str
) -> None:
    auth.check_transfer_ticket(DEST, ticket(), "j-1", "ck")  # the scheduler's, for this helper, job, name
    with pytest.raises(refusal, match=says):
        auth.check_transfer_ticket(DEST, given(), "j-1", "ck")


def checkpoint(root: Path, files: int = 2) -> Path:
    src = root / "ck"
    src.mkdir(parents=True)
    for i in range(files):
        (src / f"part-{i}.data").write_bytes(bytes([i]) * 3000)
    return src


@contextlib.asynccontextmanager
async def gpu2_agent(root: Path) -> AsyncIterator[str]:
    """gpu2's agent (its ramdisk ``root/rd``) on a real gRPC port; yields its address."""
    ramdisk = Ramdisk(root / "rd")
    ramdisk.prepare()
    server = grpc.aio.server()
    helper_pb2_grpc.add_HelperAgentServicer_to_server(HelperAgentServicer(ramdisk, DEST), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        yield address
    finally:
        await server.stop(None)


async def test_the_agent_takes_a_stream_only_with_the_schedulers_ticket(tmp_path: Path) -> None:
    src = checkpoint(tmp_path / "src")
    async with gpu2_agent(tmp_path) as address:
        for given, code in [("", grpc.StatusCode.UNAUTHENTICATED),
                            (ticket(job="j-2"), grpc.StatusCode.PERMISSION_DENIED),
                            (ticket(token=OTHER), grpc.StatusCode.PERMISSION_DENIED),
                            (ticket(expires_in=-5), grpc.StatusCode.PERMISSION_DENIED)]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await send_checkpoint(address, src, "j-1", "ck", ticket=given)
            assert err.value.code() == code, (given, err.value.details())
            assert not (tmp_path / "rd" / "j-1").exists(), "a refused stream leaves nothing behind"
        landed = await send_checkpoint(address, src, "j-1", "ck", ticket=ticket())
        assert Path(landed.path) == (tmp_path / "rd" / "j-1" / "ck").resolve()
        assert (Path(landed.path) / "part-1.data").read_bytes() == bytes([1]) * 3000


async def test_a_ticket_is_good_for_one_transfer_and_a_failed_one_may_be_retried(tmp_path: Path) -> None:
    """A ticket used to let its holder stream more checkpoints of the job for its hour
    (ck, then ck2, ck3, ... each up to --max-transfer-gib): now it is bound to one
    checkpoint name and spent once that checkpoint has landed; a stream cut short
    leaves it good, so the transfer can be tried again."""
    src = checkpoint(tmp_path / "src")
    given = ticket()
    async with gpu2_agent(tmp_path) as address:
        # A stream cut before its last chunk: refused, nothing kept, the ticket still good.
        async with grpc.aio.insecure_channel(address) as channel:
            cut = helper_pb2_grpc.HelperAgentStub(channel).PutCheckpoint(
                iter([helper_pb2.CheckpointChunk(job_id="j-1", checkpoint_name="ck", name="part-0.data",
                                                 data=b"x" * 100)]),
                metadata=((auth.TICKET_HEADER, given),))
            with pytest.raises(grpc.aio.AioRpcError, match="ended before its last chunk"):
                await cut
        assert not (tmp_path / "rd" / "j-1").exists(), "nothing kept, not even the job's directory"
        landed = await send_checkpoint(address, src, "j-1", "ck", ticket=given)  # the retry lands
        assert (Path(landed.path) / "part-1.data").read_bytes() == bytes([1]) * 3000
        # Replayed: under another name it is not the scheduler's; under its own, spent, also
        # once the checkpoint is gone (housekeeping removes old ones from the ramdisk).
        job_dir = tmp_path / "rd" / "j-1"
        for name, says, left in [("ck2", "not the scheduler's for checkpoint 'ck2'", ["ck"]),
                                 ("ck", "already used", ["ck"]), ("ck", "already used", [])]:
            if not left:
                shutil.rmtree(landed.path)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await send_checkpoint(address, src, "j-1", name, ticket=given)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and says in (err.value.details() or "")
            assert sorted(p.name for p in job_dir.iterdir()) == left, "nothing written"
        # The scheduler's next ticket for the same checkpoint is a new one, and good.
        assert (await send_checkpoint(address, src, "j-1", "ck", ticket=ticket(expires_in=601))).path == landed.path


async def test_a_ticket_carries_one_stream_at_a_time(tmp_path: Path) -> None:
    """Two streams under one ticket at once (its holder racing itself for two copies):
    the second is refused while the first runs; the first lands."""
    given, release = ticket(), asyncio.Event()
    chunks = [helper_pb2.CheckpointChunk(job_id="j-1", checkpoint_name="ck", name="part-0.data", data=b"x" * 100)]

    async def held() -> Any:
        yield chunks[0]
        await release.wait()
        yield helper_pb2.CheckpointChunk(last=True, sha256=hashlib.sha256(b"x" * 100).hexdigest())

    async with gpu2_agent(tmp_path) as address, grpc.aio.insecure_channel(address) as channel:
        put = helper_pb2_grpc.HelperAgentStub(channel).PutCheckpoint
        first = put(held(), metadata=((auth.TICKET_HEADER, given),), timeout=30)
        deadline = time.monotonic() + 20
        while not list((tmp_path / "rd").rglob(".incoming-*")) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the first stream is being written
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await put(iter(chunks), metadata=((auth.TICKET_HEADER, given),), timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "in use by another stream" in (err.value.details() or "")
        release.set()
        landed = await first
        assert (Path(landed.path) / "part-0.data").read_bytes() == b"x" * 100


async def test_checkpoints_go_only_between_registered_helpers(
    make_scheduler: Any, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the scheduler vouches for a transfer to a registered helper and refuses
    an unregistered address; a helper refuses to stream to an address the scheduler did
    not list; a destination refuses a stream the scheduler did not vouch for."""
    from scheduler.engine.live_migration import LivePorts

    monkeypatch.setattr(daemon_mod, "PEER_WAIT_S", 0.5)
    tokens = {n: await asyncio.to_thread(make_token, sqlite_url, n, "helper") for n in ("gpu1", "gpu2")}
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token",
                           settings=Settings(heartbeat_interval_s=0.2, down_after_s=10.0))
    helpers: dict[str, HelperDaemon] = {}
    try:
        for name, token in tokens.items():
            config = HelperConfig(server_name=name, scheduler=sched.address, ramdisk=tmp_path / name,
                                  log_dir=tmp_path / "logs", security=ClientSecurity(token=token))
            helpers[name] = HelperDaemon(config, CpuBackend(1, name))
            await helpers[name].start()
        a, b = helpers["gpu1"], helpers["gpu2"]
        deadline = time.monotonic() + 20
        while b.address not in a.peers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert a.peers.get(b.address) == "gpu2", "the scheduler lists the registered helpers to each helper"
        src = checkpoint(a.ramdisk.root / "j-1")
        ports = LivePorts(sched.server.core)

        def transfer(address: str) -> helper_pb2.HelperCommand:
            return helper_pb2.HelperCommand(command_id=f"c-{time.monotonic_ns()}", transfer=helper_pb2.TransferCheckpoint(
                job_id="j-1", checkpoint_path=str(src), dest_address=address, checkpoint_name="ck"))

        async def on_scheduler(coro: Any) -> Any:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, sched.loop))

        # The scheduler's way: a ticket for gpu2, which its agent accepts.
        sent = transfer(b.address)
        done = await on_scheduler(ports.helper_command("gpu1", sent, 30))
        assert done.ok, done.message
        assert (Path(done.checkpoint_path) / "part-0.data").is_file()
        assert Path(done.checkpoint_path).is_relative_to(b.ramdisk.root)
        # The source replays the ticket it was sent, for more checkpoints of the job (it
        # used to be good for an hour of them): refused, nothing written.
        for name in ("ck2", "ck"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await send_checkpoint(b.address, src, "j-1", name, ticket=sent.transfer.ticket)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
        assert [p.name for p in (b.ramdisk.root / "j-1").iterdir()] == ["ck"]

        # An address no helper registered: the scheduler sends no such command.
        with pytest.raises(FailedPrecondition, match="not the agent address of a registered helper"):
            await on_scheduler(ports.helper_command("gpu1", transfer("127.0.0.1:9"), 30))

        # The helper itself refuses an address the scheduler did not list (a command
        # that reached it some other way), before connecting anywhere.
        refused = await a.jobs.handle(transfer("127.0.0.1:9"))
        assert not refused.ok and "not the agent address of a registered helper" in refused.message

        # A registered destination refuses a stream without the scheduler's ticket: a
        # cluster certificate or a listed address alone is not enough.
        (b.ramdisk.root / "j-1").rename(b.ramdisk.root / "j-1-first")
        refused = await a.jobs.handle(transfer(b.address))
        assert not refused.ok and "no transfer ticket" in refused.message, refused.message
        assert not (b.ramdisk.root / "j-1").exists()

        # The scheduler's wall clock two hours behind the helpers' (a server whose clock
        # NTP never set): its tickets, good for an hour by its own clock, had all expired
        # on arrival ("the transfer ticket has expired"), so no checkpoint could reach that
        # helper. A helper checks them on the scheduler's clock, learnt from its heartbeats.
        sched.server.core.clock = lambda: time.time() - 2 * 3600
        deadline, done = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            done = await on_scheduler(ports.helper_command("gpu1", transfer(b.address), 30))
            if done.ok:
                break
            await asyncio.sleep(0.2)
        assert done is not None and done.ok, done.message if done else "no transfer"
        assert (Path(done.checkpoint_path) / "part-0.data").is_file()
    finally:
        for h in helpers.values():
            await h.stop()


async def test_a_restarted_helper_still_refuses_a_spent_ticket(
    make_scheduler: Any, sqlite_url: str, tmp_path: Path
) -> None:
    """Spent tickets were remembered in memory only: a destination helper restarted within
    a ticket's hour took that ticket's checkpoint once more (its holder, the source helper,
    could write it again once housekeeping had removed it). Now they are kept in the
    ramdisk and read back at start; only their hashes are written."""
    token = await asyncio.to_thread(make_token, sqlite_url, "gpu2", "helper")
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token")
    config = HelperConfig(server_name="gpu2", scheduler=sched.address, ramdisk=tmp_path / "gpu2",
                          log_dir=tmp_path / "logs", security=ClientSecurity(token=token))
    src = checkpoint(tmp_path / "src")
    given = auth.transfer_ticket(auth.digest(token), "gpu2", "j-1", "ck", time.time() + 600)
    helper = HelperDaemon(config, CpuBackend(1, "gpu2"))
    await helper.start()
    try:
        landed = await send_checkpoint(helper.address, src, "j-1", "ck", ticket=given)
    finally:
        await helper.stop()
    shutil.rmtree(landed.path)  # as housekeeping removes an old checkpoint
    assert given not in (tmp_path / "gpu2" / ".spent-tickets").read_text(), "only its hash is kept"
    helper = HelperDaemon(config, CpuBackend(1, "gpu2"))  # the same server, started again
    await helper.start()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send_checkpoint(helper.address, src, "j-1", "ck", ticket=given)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "already used" in (err.value.details() or ""), err.value.details()
        assert not Path(landed.path).exists(), "nothing written"
        # The scheduler's next ticket for that checkpoint is a new one, and good.
        again = auth.transfer_ticket(auth.digest(token), "gpu2", "j-1", "ck", time.time() + 601)
        assert (await send_checkpoint(helper.address, src, "j-1", "ck", ticket=again)).path == landed.path
    finally:
        await helper.stop()


def test_named_pipes_in_the_spent_tickets_places_do_not_hold_the_helper(tmp_path: Path) -> None:
    """The ramdisk is the helper's user's, and so its jobs': a named pipe a job put at
    `.spent-tickets` held the helper's start for ever, and one at `.spent-tickets.tmp` held
    its event loop when a checkpoint landed (open() of a pipe waits for the other end)."""
    import os
    import threading

    from migration_helper.agent import SPENT_FILE, SpentTickets

    path = tmp_path / SPENT_FILE
    os.mkfifo(path)
    os.mkfifo(path.with_name(f"{SPENT_FILE}.tmp"))
    given, found = ticket(), []

    def use() -> None:
        spent = SpentTickets(path)  # unreadable: started from empty, with a warning
        spent.add(given, time.time() + 600, time.time())
        found.append(given in SpentTickets(path))  # written, and read back as a new start reads it

    worker = threading.Thread(target=use, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # stuck in open(): the pipes' other ends coming and going free it
        for pipe in (path, path.with_name(f"{SPENT_FILE}.tmp")):
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
                with contextlib.suppress(OSError):
                    os.close(os.open(pipe, flags))
        raise AssertionError("the spent tickets' file held the helper for 10 s")
    assert found == [True]
