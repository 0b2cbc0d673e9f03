"""The HelperAgent gRPC service each helper serves to its peers, and the client
side that streams a checkpoint to a peer."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc

from migration_helper import tcplink
from migration_helper.files import open_regular
from migration_helper.ramdisk import (
    CHUNK_BYTES,
    CheckpointError,
    CheckpointExists,
    DigestMismatch,
    DiskFailed,
    Ramdisk,
    TransferTooLarge,
    checkpoint_chunks,
)
from protos.gandiva.v1 import helper_pb2, helper_pb2_grpc
from scheduler import auth
from scheduler.errors import PermissionDenied, Unauthenticated
from scheduler.transport import (
    ClientSecurity,
    MalformedRequestInterceptor,
    aio_channel,
    server_options,
)

log = logging.getLogger(__name__)

# A stream whose pace over the last PACE_WINDOW_S says it cannot end within its limit is
# given up then, not at the limit (see send_checkpoint).
PACE_WINDOW_S = 20.0
TRANSFER_LIMIT_S = 300.0  # a checkpoint's stream, at most (the scheduler's MigrationTimeouts.transfer_s)
PING_SLACK_S = 30.0
# A stream that took no chunk and heard no TCP ACK from its peer for this long, bytes in
# flight, is given up as cut (a live link, however slow, keeps ACKing what drains).
LINK_SILENCE_S = 20.0


def agent_server(ramdisk: Ramdisk, token: str = "", now: Callable[[], float] = time.time) -> grpc.aio.Server:
    """The gRPC server a helper serves its peers on (ports still to add): the HelperAgent
    service, with bytes that are not its messages refused as INVALID_ARGUMENT."""
    # Its pings' and settings' answers wait behind a checkpoint's bytes on a slow link.
    options = [*server_options(), *_patient_http2(TRANSFER_LIMIT_S)]
    server = grpc.aio.server(interceptors=[MalformedRequestInterceptor()], options=options)
    helper_pb2_grpc.add_HelperAgentServicer_to_server(HelperAgentServicer(ramdisk, token, now), server)
    return server


class HelperAgentServicer(helper_pb2_grpc.HelperAgentServicer):
    """Takes checkpoints streamed by peers into the ramdisk.

    With a helper token (``token``), a stream is taken only with the scheduler's
    transfer ticket for this helper, the stream's job and the checkpoint name it writes
    (scheduler.auth): the scheduler issues one only with a TransferCheckpoint to a
    registered helper, so only registered helpers sending what the scheduler asked for
    get in, whatever certificate they hold. A ticket is good for one transfer: once a
    stream under it has landed it is spent (kept in the ramdisk until it expires, so
    also across a restart of this helper: SpentTickets), and while one
    is under way a second with it is refused; a stream that failed leaves it unspent, so
    the transfer can be tried again. Without a token (a cluster without --auth token)
    only TLS (``--tls-client-ca``) guards this port.

    ``now``: the scheduler's wall clock as this helper knows it (tickets expire on it;
    this server's own clock may be hours off)."""

    def __init__(self, ramdisk: Ramdisk, token: str = "", now: Callable[[], float] = time.time) -> None:
        self._ramdisk = ramdisk
        self._token = token
        self._now = now
        self._spent = SpentTickets(ramdisk.root / SPENT_FILE if token else None)
        self._busy: set[str] = set()  # tickets of the streams under way

    def _take_ticket(self, ticket: str, first: helper_pb2.CheckpointChunk | None) -> float:
        """Checks the stream's ticket and marks it busy; returns its expiry. Raises
        Unauthenticated or PermissionDenied, saying why."""
        job, name = (first.job_id, first.checkpoint_name) if first else ("", "")
        now = self._now()
        expires = auth.check_transfer_ticket(self._token, ticket, job, name, now)
        if ticket in self._spent:
            raise PermissionDenied(f"the transfer ticket for checkpoint {name!r} of job {job!r} was already "
                                   "used: a ticket is good for one transfer (the scheduler issues a new one "
                                   "with each TransferCheckpoint)")
        if ticket in self._busy:
            raise PermissionDenied(f"the transfer ticket for checkpoint {name!r} of job {job!r} is in use by "
                                   "another stream: a ticket is good for one transfer")
        self._busy.add(ticket)
        return expires

    async def PutCheckpoint(
        self,
        request_iterator: AsyncIterator[helper_pb2.CheckpointChunk],
        context: grpc.aio.ServicerContext,
    ) -> helper_pb2.PutCheckpointResponse:
        if not self._token:
            return await self._receive(request_iterator, context)
        ticket = str(next((v for k, v in context.invocation_metadata() or () if k == auth.TICKET_HEADER), ""))
        # The ticket names the job and checkpoint: read the first chunk (which names them)
        # before anything is written.
        first = await anext(aiter(request_iterator), None)
        try:
            expires = self._take_ticket(ticket, first)
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except PermissionDenied as exc:
            log.warning("checkpoint stream from %s refused: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        try:
            landed = await self._receive(_prepend(first, request_iterator), context)
            self._spent.add(ticket, expires, self._now())
            return landed
        finally:
            self._busy.discard(ticket)

    async def _receive(
        self, chunks: AsyncIterator[helper_pb2.CheckpointChunk], context: grpc.aio.ServicerContext
    ) -> helper_pb2.PutCheckpointResponse:
        try:
            path, size = await self._ramdisk.receive(chunks)
        except CheckpointExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except TransferTooLarge as exc:
            # The sender is still writing: read the rest of its stream away first (for a
            # while), so that it gets this answer. Refused while it writes, an asyncio
            # client sees "INTERNAL: Internal error from Core" instead (grpc/grpc#36066).
            await _drain(chunks, DRAIN_S)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except DiskFailed as exc:
            await _drain(chunks, DRAIN_S)  # as above: the sender gets this answer, not INTERNAL
            log.error("checkpoint stream from %s refused: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except DigestMismatch as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        except CheckpointError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return helper_pb2.PutCheckpointResponse(path=str(path), bytes=size)


# The spent transfer tickets, in the ramdisk (its helper's user's only, mode 700): a
# dot-name, which no job id or checkpoint name can be (ramdisk.safe_name).
SPENT_FILE = ".spent-tickets"
MAX_SPENT_BYTES = 16 << 20  # an hour of transfers is about 100 bytes each; more is not this file


class SpentTickets:
    """The transfer tickets whose checkpoint has landed here, each until it expires (the
    scheduler's clock), kept in ``path`` (None: in memory only) and read back when the
    helper starts again: held in memory only, a restarted helper took a spent ticket's
    checkpoint again within its hour (docs/security.md). Only each ticket's SHA-256 is
    written; the file is replaced whole (a crash leaves the old one or the new one), and
    holds only tickets not yet expired, so it is bounded by the transfers of an hour."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._spent: dict[str, float] = self._load() if path is not None else {}

    def _load(self) -> dict[str, float]:
        assert self._path is not None
        try:
            # Not read_text(): the ramdisk is the helper's user's, and so its jobs' (a named
            # pipe put here held the helper's start for ever; open_regular refuses it).
            with open_regular(self._path) as f:
                data = json.loads(f.read(MAX_SPENT_BYTES))
            return {str(k): float(v) for k, v in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("spent transfer tickets %s unreadable (%s): the tickets spent before this start are "
                        "not known; each is refused again once its hour is over", self._path, exc)
            return {}

    def __contains__(self, ticket: str) -> bool:
        return _ticket_key(ticket) in self._spent

    def add(self, ticket: str, expires: float, now: float) -> None:
        self._spent = {k: e for k, e in self._spent.items() if e >= now}  # expired ones are refused anyway
        self._spent[_ticket_key(ticket)] = expires
        if self._path is None:
            return
        tmp = self._path.with_name(f"{self._path.name}.tmp")
        try:
            # A named pipe a job put at tmp held the helper's event loop for ever (open() of a
            # pipe for writing waits for a reader); whatever is there is replaced.
            tmp.unlink(missing_ok=True)
            with open_regular(tmp, "wb") as f:
                f.write(json.dumps(self._spent).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
        except OSError as exc:  # the checkpoint has landed: the transfer is not failed for this
            log.error("could not record a spent transfer ticket in %s (%s): a restarted helper would "
                      "take it again within its hour", self._path, exc)


def _ticket_key(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


# How long a refused transfer's remaining chunks are read and dropped before the refusal.
DRAIN_S = 10.0


async def _drain(chunks: AsyncIterator[helper_pb2.CheckpointChunk], limit_s: float) -> None:
    async def read_all() -> None:
        async for _ in chunks:
            pass

    with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError, StopAsyncIteration):
        await asyncio.wait_for(read_all(), limit_s)


async def _prepend(
    first: helper_pb2.CheckpointChunk | None, rest: AsyncIterator[helper_pb2.CheckpointChunk]
) -> AsyncIterator[helper_pb2.CheckpointChunk]:
    if first is not None:
        yield first
        async for chunk in rest:
            yield chunk




def _patient_http2(limit_s: float) -> list[tuple[str, int]]:
    """gRPC's HTTP/2 pings and SETTINGS wait behind a checkpoint's bytes on a slow link,
    and one unanswered for 60 s (the defaults) ended the connection: "UNAVAILABLE: ping
    timeout" at the sender, a reset by the agent ("Connection reset by peer") for a
    settings ACK; 1 MB over 96 kbit/s (87 s) never arrived, a 2.2 MB migration over
    128 kbit/s (140 s) was restarted at its source. The stream's own limit and its pace
    (send_checkpoint) decide instead.

    The kernel's TCP_USER_TIMEOUT likewise: gRPC sets it to 20 s on every connection a
    server accepts (none on a client's unless keepalive is on), and the agent's own small
    segments (WINDOW_UPDATEs, ping ACKs) are ACKed by the sender from behind its queued
    bytes: over 96 kbit/s their round trip grew to 17 s and, past 20 s, the agent's kernel
    dropped the connection (TcpExtTCPAbortOnTimeout; the sender read "Connection reset by
    peer" 58-60 s into a 1 MB stream, 2 runs of 5). gRPC takes the timeout from
    keepalive_timeout_ms, which waits for a keepalive ping only when keepalive is on
    (every 2 h on a server by default)."""
    ms = int((limit_s + PING_SLACK_S) * 1000)
    return [("grpc.http2.ping_timeout_ms", ms), ("grpc.http2.settings_timeout", ms), ("grpc.keepalive_timeout_ms", ms)]


class TransferTooSlow(Exception):
    """The link to the peer is too slow for the checkpoint to arrive within the limit, or cut."""


async def send_checkpoint(
    address: str, directory: Path, job_id: str, name: str | None = None, timeout_s: float = TRANSFER_LIMIT_S,
    security: ClientSecurity | None = None, ticket: str = "", window_s: float = PACE_WINDOW_S,
    silence_s: float = LINK_SILENCE_S,
) -> helper_pb2.PutCheckpointResponse:
    """Stream ``directory`` to the HelperAgent at ``address``; returns where it landed.
    ``ticket``: the scheduler's transfer ticket for that helper and job.

    Raises CheckpointError for a bad local directory, grpc.aio.AioRpcError when the
    peer refuses it or is unreachable, and TransferTooSlow once the bytes sent over the
    last ``window_s`` (looked at each second from then on) say the rest cannot follow
    within ``timeout_s``: over a 128 kbit/s link a 19 MB checkpoint held its job, training
    nowhere, for 80 s until gRPC's ping timeout ended the stream ("UNAVAILABLE: ping
    timeout"); now 20-30 s, saying why (tests/multihost/test_degraded_links.py -k
    too_slow). gRPC's pings wait as long as the stream may (test_degraded_transfer.py).
    TransferTooSlow too once the link is cut: no chunk taken and no TCP ACK heard from the
    peer for ``silence_s`` while bytes wait for one (the two helpers still reaching the
    scheduler, nothing marked down: before, the stream waited out its 300-s limit, the job
    training nowhere; test_degraded_transfer.py -k cut)."""
    chunks = checkpoint_chunks(directory, job_id, name)
    # Take the first chunk now so a missing or empty directory fails before connecting.
    first = next(chunks)
    total = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    sent = [0]

    def counted() -> Iterator[helper_pb2.CheckpointChunk]:
        for chunk in itertools.chain([first], chunks):
            yield chunk  # taken by gRPC once the one before is written: the link's pace
            sent[0] += len(chunk.data)

    async with aio_channel(address, security, _patient_http2(timeout_s)) as channel:
        stub = helper_pb2_grpc.HelperAgentStub(channel)
        call = stub.PutCheckpoint(counted(), timeout=timeout_s,
                                  metadata=((auth.TICKET_HEADER, ticket),) if ticket else None)
        watch = asyncio.create_task(_watch_pace(call, sent, total, timeout_s, window_s,
                                                Silence(address, silence_s)))
        try:
            response: helper_pb2.PutCheckpointResponse = await call
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            if watch.done() and not watch.cancelled() and watch.result():
                raise TransferTooSlow(watch.result()) from None
            raise
        finally:
            watch.cancel()
        return response


class Silence:
    """Whether the link to a peer is cut: ``limit_s`` with no chunk taken by gRPC, and no
    TCP ACK from the peer for as long while our bytes wait for one (tcplink)."""

    def __init__(self, address: str, limit_s: float) -> None:
        self.address, self.limit_s = address, limit_s
        self.peers: set[tuple[str, int]] | None = None
        self.moved_at, self.sent = 0.0, -1

    async def why(self, now: float, sent: int, total: int, start: float) -> str:
        """Why the stream is given up as cut ("" while it is not)."""
        if sent != self.sent:
            self.moved_at, self.sent = now, sent
        if now - self.moved_at < self.limit_s:
            return ""
        if self.peers is None:
            self.peers = await tcplink.peers_of(self.address)
        silent = tcplink.unacked_silence_s(self.peers)
        if silent is None or silent < self.limit_s:
            return ""  # the link answers (a slow one, or a peer not reading): the pace decides
        tcplink.abort_silent(self.peers, self.limit_s)
        # An MTU black hole reads the same (small packets pass, full-size segments are dropped
        # with no ICMP said back): its heartbeats and commands go through, so "cut" alone sent
        # the operator looking for a partition that is not there (probed, s51).
        return (f"the link is cut: no acknowledgement of the bytes in flight for {silent:.0f}s "
                f"({sent / 1e6:.1f} MB of {total / 1e6:.1f} MB sent); given up after {now - start:.0f}s "
                "(if the two hosts still reach each other, full-size packets may be dropped on the way: "
                "check the MTU of every link between them)")


async def _watch_pace(call: grpc.aio.StreamUnaryCall, sent: list[int], total: int, timeout_s: float,
                      window_s: float, silence: Silence) -> str:
    """Cancels ``call`` when it cannot end in time; returns why ("" if it ended)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    seen: list[tuple[float, int]] = [(start, 0)]
    while not call.done():
        await asyncio.sleep(1.0)
        now = loop.time()
        cut = await silence.why(now, sent[0], total, start)
        if cut:
            call.cancel()
            return cut
        seen.append((now, sent[0]))
        while len(seen) > 1 and seen[1][0] <= now - window_s:
            seen.pop(0)
        then, before = seen[0]
        if now - then < window_s * 0.99 or sent[0] >= total:
            continue  # too early to judge, or every byte handed over (the answer is due)
        # gRPC takes a chunk (1 MiB) once the one before is written: up to a chunk more than
        # was counted may have left meanwhile. Judged on that most it could be, a link slower
        # than a chunk per window is not given up while it could still make it (before, a
        # 2.2 MB checkpoint over 128 kbit/s, 140 s, was given up at 30 s, "0.0 kB/s").
        rate = (sent[0] - before + CHUNK_BYTES) / (now - then)
        left = total - sent[0]
        if (now - start) + left / rate > timeout_s:
            why = (f"the link is too slow: at most {rate / 1e3:.1f} kB/s over the last {window_s:.0f}s, so "
                   f"the {left / 1e6:.1f} MB left of {total / 1e6:.1f} MB would take {left / rate:.0f}s or "
                   f"more, past the {timeout_s:.0f}s limit; given up after {now - start:.0f}s")
            call.cancel()
            return why
    return ""
