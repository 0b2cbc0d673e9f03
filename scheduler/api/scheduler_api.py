"""The Scheduler service: thin servicers over SchedulerCore and the live engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.api.convert import event_to_pb, job_to_pb, server_to_pb, state_from_pb
from scheduler.api.status import grpc_errors, grpc_stream_errors
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.errors import InvalidArgument
from scheduler.state.repo import ServerLoad


def cluster_height(loads: list[ServerLoad]) -> int:
    return max((ld.height for ld in loads if ld.server.up), default=0)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore, engine: LiveEngine) -> None:
        self.core = core
        self.engine = engine

    @grpc_errors
    async def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
        detail = await self.core.submit(request.spec, dry_run=request.dry_run)
        return scheduler_pb2.SubmitJobResponse(job=job_to_pb(detail))

    @grpc_errors
    async def SubmitMultiJob(self, request, context):  # type: ignore[no-untyped-def]
        mj_id, details = await self.core.submit_multi(request.name, request.jobs, request.dry_run)
        return scheduler_pb2.SubmitMultiJobResponse(
            multi_job_id=mj_id, jobs=[job_to_pb(d) for d in details]
        )

    @grpc_errors
    async def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        return job_to_pb(await self.core.get_job(request.id))

    @grpc_errors
    async def ListJobs(self, request, context):  # type: ignore[no-untyped-def]
        if request.limit < 0:
            raise InvalidArgument("limit", "must be 0 (no limit) or positive")
        states = []
        for value in request.states:
            if value == common_pb2.JOB_STATE_UNSPECIFIED or value not in common_pb2.JobState.values():
                raise InvalidArgument("states", f"unknown job state {value}")
            states.append(state_from_pb(value))
        details = await self.core.list_jobs(states, request.multi_job_id, request.limit)
        return scheduler_pb2.ListJobsResponse(jobs=[job_to_pb(d) for d in details])

    @grpc_errors
    async def KillJob(self, request, context):  # type: ignore[no-untyped-def]
        return job_to_pb(await self.core.kill(request.id, request.reason))

    @grpc_errors
    async def SetPriority(self, request, context):  # type: ignore[no-untyped-def]
        return job_to_pb(await self.core.set_priority(request.id, request.priority))

    @grpc_errors
    async def SuspendJob(self, request, context):  # type: ignore[no-untyped-def]
        return job_to_pb(await self.engine.operator_suspend(request.id, request.reason))

    @grpc_errors
    async def ResumeJob(self, request, context):  # type: ignore[no-untyped-def]
        return job_to_pb(await self.engine.operator_resume(request.id, request.reason))

    @grpc_errors
    async def MigrateJob(self, request, context):  # type: ignore[no-untyped-def]
        if not request.to_server:
            raise InvalidArgument("to_server", "name the destination server")
        return job_to_pb(await self.engine.operator_migrate(request.id, request.to_server))

    @grpc_errors
    async def ListServers(self, request, context):  # type: ignore[no-untyped-def]
        loads = await self.core.list_servers()
        return scheduler_pb2.ListServersResponse(
            servers=[server_to_pb(ld) for ld in loads], cluster_height=cluster_height(loads)
        )

    @grpc_errors
    async def ListEvents(self, request, context):  # type: ignore[no-untyped-def]
        events = await self.core.list_events(request.after_id, request.job_id, request.limit)
        return scheduler_pb2.ListEventsResponse(events=[event_to_pb(e) for e in events])

    @grpc_stream_errors
    async def WatchEvents(  # type: ignore[no-untyped-def, override]
        self, request, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        seen_version = self.core.events.version
        last = request.after_id if request.after_id >= 0 else await self.core.last_event_id()
        while True:
            for ev in await self.core.list_events(last, request.job_id, 500):
                last = ev.id
                yield event_to_pb(ev)
            # Also wakes every second, so a watcher notices events another
            # scheduler process wrote to the same database.
            seen_version = await self.core.events.wait(seen_version, 1.0)
