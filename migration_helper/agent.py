"""The HelperAgent gRPC service each helper serves to its peers, and the client
side that streams a checkpoint to a peer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from migration_helper.ramdisk import (
    CheckpointError,
    CheckpointExists,
    DigestMismatch,
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


def agent_server(ramdisk: Ramdisk, token: str = "", now: Callable[[], float] = time.time) -> grpc.aio.Server:
    """The gRPC server a helper serves its peers on (ports still to add): the HelperAgent
    service, with bytes that are not its messages refused as INVALID_ARGUMENT."""
    server = grpc.aio.server(interceptors=[MalformedRequestInterceptor()], options=server_options())
    helper_pb2_grpc.add_HelperAgentServicer_to_server(HelperAgentServicer(ramdisk, token, now), server)
    return server


class HelperAgentServicer(helper_pb2_grpc.HelperAgentServicer):
    """Takes checkpoints streamed by peers into the ramdisk.

    With a helper token (``token``), a stream is taken only with the scheduler's
    transfer ticket for this helper and the stream's job (scheduler.auth): the
    scheduler issues one only with a TransferCheckpoint to a registered helper, so
    only registered helpers sending what the scheduler asked for get in, whatever
    certificate they hold. Without a token (a cluster without --auth token) only
    TLS (``--tls-client-ca``) guards this port.

    ``now``: the scheduler's wall clock as this helper knows it (tickets expire on it;
    this server's own clock may be hours off)."""

    def __init__(self, ramdisk: Ramdisk, token: str = "", now: Callable[[], float] = time.time) -> None:
        self._ramdisk = ramdisk
        self._token = token
        self._now = now

    async def PutCheckpoint(
        self,
        request_iterator: AsyncIterator[helper_pb2.CheckpointChunk],
        context: grpc.aio.ServicerContext,
    ) -> helper_pb2.PutCheckpointResponse:
        chunks = request_iterator
        if self._token:
            ticket = next((v for k, v in context.invocation_metadata() or () if k == auth.TICKET_HEADER), "")
            # The ticket names the job: read the first chunk (which names it) before anything is written.
            first = await anext(aiter(request_iterator), None)
            try:
                auth.check_transfer_ticket(self._token, str(ticket), first.job_id if first else "", self._now())
            except Unauthenticated as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            except PermissionDenied as exc:
                log.warning("checkpoint stream from %s refused: %s", context.peer(), exc)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            chunks = _prepend(first, request_iterator)
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
        except DigestMismatch as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        except CheckpointError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return helper_pb2.PutCheckpointResponse(path=str(path), bytes=size)


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


async def send_checkpoint(
    address: str, directory: Path, job_id: str, name: str | None = None, timeout_s: float = 300.0,
    security: ClientSecurity | None = None, ticket: str = "",
) -> helper_pb2.PutCheckpointResponse:
    """Stream ``directory`` to the HelperAgent at ``address``; returns where it landed.
    ``ticket``: the scheduler's transfer ticket for that helper and job.

    Raises CheckpointError for a bad local directory and grpc.aio.AioRpcError when the
    peer refuses it or is unreachable.
    """
    chunks = checkpoint_chunks(directory, job_id, name)
    # Take the first chunk now so a missing or empty directory fails before connecting.
    first = next(chunks)
    async with aio_channel(address, security) as channel:
        stub = helper_pb2_grpc.HelperAgentStub(channel)
        response: helper_pb2.PutCheckpointResponse = await stub.PutCheckpoint(
            itertools.chain([first], chunks), timeout=timeout_s,
            metadata=((auth.TICKET_HEADER, ticket),) if ticket else None,
        )
        return response
