"""The HelperAgent gRPC service each helper serves to its peers, and the client
side that streams a checkpoint to a peer."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
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
from scheduler.transport import ClientSecurity, aio_channel

log = logging.getLogger(__name__)


class HelperAgentServicer(helper_pb2_grpc.HelperAgentServicer):
    def __init__(self, ramdisk: Ramdisk) -> None:
        self._ramdisk = ramdisk

    async def PutCheckpoint(
        self,
        request_iterator: AsyncIterator[helper_pb2.CheckpointChunk],
        context: grpc.aio.ServicerContext,
    ) -> helper_pb2.PutCheckpointResponse:
        try:
            path, size = await self._ramdisk.receive(request_iterator)
        except CheckpointExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except TransferTooLarge as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except DigestMismatch as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        except CheckpointError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return helper_pb2.PutCheckpointResponse(path=str(path), bytes=size)


async def send_checkpoint(
    address: str, directory: Path, job_id: str, name: str | None = None, timeout_s: float = 300.0,
    security: ClientSecurity | None = None,
) -> helper_pb2.PutCheckpointResponse:
    """Stream ``directory`` to the HelperAgent at ``address``; returns where it landed.

    Raises CheckpointError for a bad local directory and grpc.aio.AioRpcError when the
    peer refuses it or is unreachable.
    """
    chunks = checkpoint_chunks(directory, job_id, name)
    # Take the first chunk now so a missing or empty directory fails before connecting.
    first = next(chunks)
    async with aio_channel(address, security) as channel:
        stub = helper_pb2_grpc.HelperAgentStub(channel)
        response: helper_pb2.PutCheckpointResponse = await stub.PutCheckpoint(
            itertools.chain([first], chunks), timeout=timeout_s
        )
        return response
