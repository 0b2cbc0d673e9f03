"""The Helper service: what each server's Migration Helper calls."""

from __future__ import annotations

import logging

from protos.gandiva.v1 import common_pb2, helper_pb2, helper_pb2_grpc
from scheduler.api.status import grpc_errors, grpc_stream_errors
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.errors import InvalidArgument

log = logging.getLogger(__name__)


class HelperServicer(helper_pb2_grpc.HelperServicer):
    def __init__(self, core: SchedulerCore, engine: LiveEngine) -> None:
        self.core = core
        self.engine = engine

    @grpc_errors
    async def Register(self, request, context):  # type: ignore[no-untyped-def]
        await self.core.register_server(request)
        st = self.core.settings
        return helper_pb2.RegisterServerResponse(
            heartbeat_interval_s=st.heartbeat_interval_s, down_after_s=st.down_after_s, lease_s=st.lease
        )

    @grpc_errors
    async def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]
        running = [(r.job_id, r.incarnation) for r in request.running]
        known, stop = await self.core.heartbeat(request.name, running)
        if known:
            await self.engine.reconcile_server(request.name, running, request.running_jobs)
        return helper_pb2.HeartbeatResponse(known=known, stop=stop)

    @grpc_errors
    async def ReportGpuSamples(self, request, context):  # type: ignore[no-untyped-def]
        await self.core.gpu_samples(request)
        return common_pb2.Empty()

    @grpc_errors
    async def ReportProcessExit(self, request, context):  # type: ignore[no-untyped-def]
        if not request.job_id:
            raise InvalidArgument("job_id", "required")
        await self.core.process_exit(request)
        return common_pb2.Empty()

    @grpc_stream_errors
    async def ReceiveCommands(self, request, context):  # type: ignore[no-untyped-def, override]
        if not request.server:
            raise InvalidArgument("server", "required")
        # Only a registered server gets a command box: one per name ever seen would grow forever.
        await self.core.known_server(request.server)
        hub = self.core.helpers
        box = hub.box(request.server)
        log.info("helper %s connected its command stream", request.server)
        try:
            while True:
                cmd = await box.queue.get()
                try:
                    yield cmd
                except BaseException:
                    # Not delivered: keep it for the helper's next stream.
                    box.queue.put_nowait(cmd)
                    raise
        finally:
            log.info("helper %s closed its command stream", request.server)

    @grpc_errors
    async def ReportCommandResult(self, request, context):  # type: ignore[no-untyped-def]
        self.core.helpers.resolve(request.server, request)
        return common_pb2.Empty()
