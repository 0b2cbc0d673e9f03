"""Rows and domain values -> gandiva.v1 messages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from protos.gandiva.v1 import common_pb2
from scheduler.core import JobDetail, spec_of
from scheduler.eta import estimate
from scheduler.lifecycle import JobState
from scheduler.state.models import Event
from scheduler.state.repo import ServerLoad


def state_to_pb(state: str) -> common_pb2.JobState.ValueType:
    return common_pb2.JobState.Value(f"JOB_STATE_{state}") if state else common_pb2.JOB_STATE_UNSPECIFIED


def state_from_pb(value: int) -> JobState:
    name = common_pb2.JobState.Name(value)  # type: ignore[arg-type]
    return JobState(name.removeprefix("JOB_STATE_"))


def job_to_pb(d: JobDetail, now: float) -> common_pb2.Job:
    """``now``: the scheduler's clock (SchedulerCore.clock), on which a running job's
    stretch began: on the system's wall clock, a running job's GPU time fell back by an
    hour when NTP stepped the clock back (scheduler.wallclock)."""
    j = d.job
    spec = spec_of(j)
    eta_s, eta_note = estimate(j, "/".join(map(str, d.placement[0])) if d.placement else "", d.sharers,
                               len(d.placement))
    return common_pb2.Job(
        id=j.id,
        spec=spec,
        state=state_to_pb(j.state),
        placement=[common_pb2.GpuRef(server=s, index=i) for s, i in d.placement],
        steps=j.steps,
        total_steps=j.total_steps or 0,
        total_steps_from=j.total_steps_from or "",
        eta_s=eta_s,
        eta_note=eta_note,
        rate=j.rate,
        submitted_at=j.submitted_at,
        updated_at=j.updated_at,
        finished_at=j.finished_at,
        history=[
            common_pb2.Transition(
                from_state=state_to_pb(t.from_state),
                to_state=state_to_pb(t.to_state),
                at=t.at,
                reason=t.reason,
            )
            for t in d.history
        ],
        migratable=j.migratable,
        suspendable=j.suspendable,
        control_note=j.control_note,
        grow_shrink_note=j.grow_shrink_note,
        host_memory_bytes=d.host_memory_bytes,
        gpu_seconds=j.gpu_seconds(now),
        held=j.held and j.state == "SUSPENDED",
        message=j.message,
        wait=d.wait,
        alone_rate=d.alone_rate,
        exit_code=j.exit_code,
        metrics={k: float(v) for k, v in (j.metrics or {}).items() if isinstance(v, (int, float))},
    )


def server_to_pb(load: ServerLoad, host_memory_budget: tuple[float, int],
                 shown: Callable[[str], str] = str, checkpoints_for: Sequence[str] = ()) -> common_pb2.Server:
    """``host_memory_budget``: the policy's (host_memory_use, job_host_memory_bytes);
    ``shown``: what each placed job's id is listed as (another user's is hidden);
    ``checkpoints_for``: the queued jobs whose restore point is on this draining server."""
    s = load.server
    use, assumed = host_memory_budget
    return common_pb2.Server(
        name=s.name,
        address=s.address,
        gpus=s.num_gpus,
        gpu_list=[
            common_pb2.Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_total_bytes=g.memory_total,
                memory_used_bytes=g.memory_used,
                utilization=g.utilization,
                jobs=[shown(job) for job in load.jobs_by_gpu.get(g.index, [])],
            )
            for g in load.gpus
        ],
        height=load.height,
        affinity=load.affinity,
        up=s.up,
        last_heartbeat=s.last_heartbeat,
        allocated=load.allocated,
        ramdisk=s.ramdisk,
        host_memory_bytes=s.host_memory_bytes,
        host_memory_used_bytes=load.host_used(assumed),
        host_memory_use=use,
        cordoned=s.cordoned,
        cordoned_at=s.cordoned_at,
        cordon_reason=s.cordon_reason,
        draining=s.draining,
        checkpoints_for=[shown(job) for job in checkpoints_for],
    )


def event_to_pb(e: Event) -> common_pb2.Event:
    return common_pb2.Event(
        id=e.id, at=e.at, kind=e.kind, job_id=e.job_id, server=e.server, message=e.message
    )
