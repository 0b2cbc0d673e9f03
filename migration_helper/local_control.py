"""A minimal stand-in for the scheduler's Helper and Runtime services.

It lets helpers and job shims run without the scheduler: `gandiva bench migration`
drives real helpers and real TensorFlow jobs through it, and the helper's tests use
it as the far end of its gRPC session. It keeps everything in memory and decides
nothing: the caller sends commands and reads what came back. It also implements
migration_protocol.fast_path.MigrationPorts, so migrate() runs against it unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from migration_protocol.fast_path import Endpoint
from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
)
from scheduler.transport import MalformedRequestInterceptor, server_options

log = logging.getLogger(__name__)


@dataclass
class _RuntimeConn:
    hello: runtime_pb2.RuntimeHello
    outbox: asyncio.Queue[runtime_pb2.RuntimeCommand] = field(default_factory=asyncio.Queue)
    pending: dict[str, asyncio.Future[runtime_pb2.CommandAck]] = field(default_factory=dict)
    steps: int = 0
    train_signature: str = ""


class LocalControl(helper_pb2_grpc.HelperServicer, runtime_pb2_grpc.RuntimeServicer):
    def __init__(self, heartbeat_interval_s: float = 0.5, known: bool = True) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.known = known  # False: answer heartbeats with known=false (forces a re-register)
        # The servers listed to helpers as peers (None: every registered one).
        self.listed: set[str] | None = None
        self.servers: dict[str, helper_pb2.RegisterServerRequest] = {}
        self.registrations: collections.Counter[str] = collections.Counter()
        self.heartbeats: dict[str, helper_pb2.HeartbeatRequest] = {}
        self.exits: list[helper_pb2.ProcessExitRequest] = []
        self.samples: list[helper_pb2.GpuSamplesRequest] = []
        self.phases: list[tuple[str, str, float, str]] = []
        self._queues: dict[str, asyncio.Queue[helper_pb2.HelperCommand]] = {}
        self._results: dict[str, asyncio.Future[helper_pb2.HelperCommandResult]] = {}
        self._runtimes: dict[tuple[str, str], _RuntimeConn] = {}
        self._changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self, listen: str = "127.0.0.1:0") -> str:
        self._server = grpc.aio.server(interceptors=[MalformedRequestInterceptor()], options=server_options())
        helper_pb2_grpc.add_HelperServicer_to_server(self, self._server)
        runtime_pb2_grpc.add_RuntimeServicer_to_server(self, self._server)
        port = self._server.add_insecure_port(listen)
        await self._server.start()
        self.address = f"{listen.rsplit(':', 1)[0]}:{port}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: object, timeout_s: float, what: str) -> None:
        """Wait until ``predicate()`` is true (checked whenever something arrives)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():  # type: ignore[operator]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass

    # ---- Helper service -------------------------------------------------------------

    async def Register(self, request, context):  # type: ignore[no-untyped-def]
        self.servers[request.name] = request
        self.registrations[request.name] += 1
        self._notify()
        return helper_pb2.RegisterServerResponse(
            heartbeat_interval_s=self.heartbeat_interval_s, down_after_s=self.heartbeat_interval_s * 4)

    async def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]
        self.heartbeats[request.name] = request
        self._notify()
        known = self.known and request.name in self.servers
        # As the scheduler does: the registered helpers, whose agents alone get checkpoints.
        peers = [helper_pb2.Peer(name=r.name, address=r.address) for r in self.servers.values()
                 if self.listed is None or r.name in self.listed]
        version = (len(self.registrations) * 1_000_003 + sum(self.registrations.values())
                   + 7 * zlib.crc32(",".join(sorted(p.name for p in peers)).encode()))
        return helper_pb2.HeartbeatResponse(known=known, peers=peers if known else [], peers_version=version)

    async def ReportGpuSamples(self, request, context):  # type: ignore[no-untyped-def]
        self.samples.append(request)
        self._notify()
        return common_pb2.Empty()

    async def ReportProcessExit(self, request, context):  # type: ignore[no-untyped-def]
        self.exits.append(request)
        self._notify()
        return common_pb2.Empty()

    async def ReceiveCommands(self, request, context) -> AsyncIterator[helper_pb2.HelperCommand]:  # type: ignore[no-untyped-def, override]
        queue = self._queues.setdefault(request.server, asyncio.Queue())
        while True:
            cmd = await queue.get()
            try:
                yield cmd
            except BaseException:
                queue.put_nowait(cmd)  # not delivered: the next stream gets it
                raise

    async def ReportCommandResult(self, request, context):  # type: ignore[no-untyped-def]
        fut = self._results.pop(request.command_id, None)
        if fut is not None and not fut.done():
            fut.set_result(request)
        return common_pb2.Empty()

    # ---- Runtime service ------------------------------------------------------------

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def, override]
        first = await anext(aiter(request_iterator))
        if first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be hello")
        conn = _RuntimeConn(first.hello)
        key = (first.hello.job_id, first.hello.incarnation)
        self._runtimes[key] = conn
        self._notify()

        async def read() -> None:
            async for msg in request_iterator:
                if msg.WhichOneof("body") == "ack":
                    fut = conn.pending.pop(msg.ack.command_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.ack)
                elif msg.WhichOneof("body") == "train_signature":
                    conn.train_signature = msg.train_signature.json
                elif msg.WhichOneof("body") == "progress":
                    conn.steps = msg.progress.steps
                    self._notify()

        reader = asyncio.create_task(read())
        try:
            while not reader.done():
                get = asyncio.create_task(conn.outbox.get())
                await asyncio.wait([get, reader], return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    yield get.result()
                else:
                    get.cancel()
        finally:
            reader.cancel()
            if self._runtimes.get(key) is conn:
                del self._runtimes[key]
            for fut in conn.pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"job {key[0]}/{key[1]} disconnected"))
            self._notify()

    # ---- MigrationPorts -------------------------------------------------------------

    def endpoint(self, server: str) -> Endpoint:
        reg = self.servers[server]
        return Endpoint(reg.name, reg.address, reg.ramdisk, reg.shared_root)

    async def helper_command(
        self, server: str, command: helper_pb2.HelperCommand, timeout_s: float
    ) -> helper_pb2.HelperCommandResult:
        if not command.command_id:
            command.command_id = uuid.uuid4().hex
        fut: asyncio.Future[helper_pb2.HelperCommandResult] = asyncio.get_running_loop().create_future()
        self._results[command.command_id] = fut
        self._queues.setdefault(server, asyncio.Queue()).put_nowait(command)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._results.pop(command.command_id, None)

    async def runtime_command(
        self, job_id: str, incarnation: str, command: runtime_pb2.RuntimeCommand, timeout_s: float
    ) -> runtime_pb2.CommandAck:
        deadline = time.monotonic() + timeout_s
        await self.wait_for(lambda: (job_id, incarnation) in self._runtimes, timeout_s,
                            f"job {job_id}/{incarnation} to connect")
        conn = self._runtimes[(job_id, incarnation)]
        fut: asyncio.Future[runtime_pb2.CommandAck] = asyncio.get_running_loop().create_future()
        conn.pending[command.command_id] = fut
        conn.outbox.put_nowait(command)
        return await asyncio.wait_for(fut, max(0.1, deadline - time.monotonic()))

    async def record_phase(self, job_id: str, phase: str, seconds: float, detail: str) -> None:
        self.phases.append((job_id, phase, seconds, detail))

    # ---- conveniences -----------------------------------------------------------------

    def steps(self, job_id: str, incarnation: str) -> int:
        conn = self._runtimes.get((job_id, incarnation))
        return conn.steps if conn else -1

    def train_signature(self, job_id: str, incarnation: str) -> str:
        conn = self._runtimes.get((job_id, incarnation))
        return conn.train_signature if conn else ""

    def connected(self, job_id: str, incarnation: str) -> bool:
        return (job_id, incarnation) in self._runtimes

    def exit_of(self, job_id: str, incarnation: str) -> helper_pb2.ProcessExitRequest | None:
        return next((e for e in self.exits if (e.job_id, e.incarnation) == (job_id, incarnation)), None)
