"""Repository functions: every read and write of cluster state.

Each takes an explicit AsyncSession; the caller owns the transaction, so a state
change and the events that record it commit together or not at all.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Executable,
    Select,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from migration_protocol.fast_path import Endpoint, checkpoint_home
from scheduler.errors import NotFound
from scheduler.eta import Sharer
from scheduler.lifecycle import ACTIVE, TERMINAL, JobState, check_transition, trains
from scheduler.policy.cluster import affinity_of
from scheduler.state.db import bytewise
from scheduler.state.models import (
    Event,
    Gpu,
    GpuHold,
    Job,
    JobProfile,
    Migration,
    MultiJob,
    Placement,
    Server,
    ServerSpan,
    Transition,
    state_change,
)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _chunks(ids: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """`ids` in slices: very long IN lists are slow on SQLite and capped on some drivers."""
    for i in range(0, len(ids), size):
        yield ids[i : i + size]


# ---- events -----------------------------------------------------------------


def add_event(
    session: AsyncSession,
    at: float,
    kind: str,
    message: str = "",
    job_id: str = "",
    server: str = "",
) -> Event:
    ev = Event(at=at, kind=kind, job_id=job_id, server=server, message=message)
    session.add(ev)
    session.info["events"] = True  # watchers are woken once this transaction commits
    return ev


async def list_events(
    session: AsyncSession, after_id: int = 0, job_id: str = "", limit: int = 0,
    user: str | None = None, kinds: Sequence[str] = (), server: str = "",
) -> Sequence[Event]:
    """Events after ``after_id`` in id order; ``user``: only events of that user's jobs;
    ``kinds``: only those of these kinds or families (``job``: job.state, job.pack, ...);
    ``server``: only those about that server."""
    q = select(Event).where(Event.id > after_id).order_by(Event.id)
    if job_id:
        q = q.where(Event.job_id == job_id)
    if kinds:
        q = q.where(or_(*(or_(Event.kind == k, _starts(Event.kind, k + ".")) for k in kinds)))
    if server:
        q = q.where(Event.server == server)
    if user is not None:
        q = q.where(Event.job_id.in_(select(Job.id).where(Job.user == user)))
    if limit > 0:
        q = q.limit(limit)
    return (await session.scalars(q)).all()


async def own_jobs(session: AsyncSession, user: str, ids: Iterable[str]) -> set[str]:
    """Those of ``ids`` that are ``user``'s jobs (read 10,000 at a time: asyncpg takes at
    most 32,767 parameters in one statement)."""
    wanted, mine = list(ids), set[str]()
    for start in range(0, len(wanted), 10_000):
        part = wanted[start:start + 10_000]
        mine.update((await session.scalars(select(Job.id).where(Job.user == user, Job.id.in_(part)))).all())
    return mine


async def events_before(session: AsyncSession, since: float) -> int:
    """The id just before the first event at or after ``since`` (a unix time): listing
    after it gives the events since then (and the last id when there is none)."""
    first = await session.scalar(select(func.min(Event.id)).where(Event.at >= since))
    return int(first) - 1 if first is not None else await last_event_id(session)


async def last_event_id(session: AsyncSession) -> int:
    return int((await session.scalar(select(func.max(Event.id)))) or 0)


# ---- jobs -------------------------------------------------------------------


async def get_job(session: AsyncSession, job_id: str, for_update: bool = False) -> Job:
    q = select(Job).where(Job.id == job_id)
    if for_update:
        q = q.with_for_update()
    return _found(await session.scalar(q), job_id)


def _found(job: Job | None, job_id: str) -> Job:
    if job is None:
        raise NotFound("job", job_id)
    return job


def job_by_request(session: Session, key: str) -> Job | None:
    """The job a submission with this request key created, if any."""
    return session.scalar(select(Job).where(Job.request_key == key))


def multi_job_by_request(session: Session, key: str) -> tuple[MultiJob, list[Job]] | None:
    """The multi-job a submission with this request key created, with its members by index."""
    mj = session.scalar(select(MultiJob).where(MultiJob.request_key == key))
    if mj is None:
        return None
    members = session.scalars(select(Job).where(Job.multi_job_id == mj.id).order_by(Job.array_index)).all()
    return mj, list(members)


def job_detail(session: Session, job_id: str) -> tuple[Job, list[tuple[str, int]], list[Transition], int, list[Sharer]]:
    """A job, its GPUs (server, index), its last transitions, its measured host memory
    (0: not measured) and the other jobs on its first GPU (for its ETA), read in one go on
    a sync session (SchedulerCore.read_sync: on SQLite one hop to a reader thread instead
    of about ten through aiosqlite, each waiting for a turn of the busy event loop)."""
    job = _found(session.scalar(select(Job).where(Job.id == job_id)), job_id)
    gpus = session.execute(select(Placement.server_name, Placement.gpu_index).where(Placement.job_id == job_id)
                           .order_by(bytewise(Placement.server_name), Placement.gpu_index)).all()
    host = session.scalar(select(JobProfile.host_memory_bytes).where(JobProfile.job_id == job_id)) or 0
    sharers = session.execute(_sharers_q([(str(gpus[0][0]), int(gpus[0][1]))])).all() if gpus else []
    return (job, [(str(g[0]), int(g[1])) for g in gpus], list(reversed(session.scalars(history_q(job_id)).all())),
            int(host), [Sharer(str(r.id), r.state, r.priority, bool(r.held)) for r in sharers])


def _sharers_q(gpus: Sequence[tuple[str, int]]) -> Any:
    """The jobs placed on any of `gpus`: (server_name, gpu_index, id, state, priority, held)."""
    return (select(Placement.server_name, Placement.gpu_index, Job.id, Job.state, Job.priority, Job.held)
            .join(Job, Job.id == Placement.job_id)
            .where(tuple_(Placement.server_name, Placement.gpu_index).in_(list(gpus))))


async def sharers_of(session: AsyncSession, placements: dict[str, list[Placement]]) -> dict[str, list[Sharer]]:
    """job id -> the jobs placed on its first GPU (itself included), for the jobs of
    `placements` that hold one."""
    first = {job_id: (ps[0].server_name, ps[0].gpu_index) for job_id, ps in placements.items() if ps}
    by_gpu: dict[tuple[str, int], list[Sharer]] = {}
    gpus = sorted(set(first.values()))
    for i in range(0, len(gpus), 400):
        for r in (await session.execute(_sharers_q(gpus[i:i + 400]))).all():
            by_gpu.setdefault((r.server_name, r.gpu_index), []).append(Sharer(str(r.id), r.state, r.priority, bool(r.held)))
    return {job_id: by_gpu.get(gpu, []) for job_id, gpu in first.items()}


async def host_memory_of(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, int]:
    """job id -> its measured host memory, for those of ``job_ids`` measured."""
    out: dict[str, int] = {}
    for chunk in _chunks(job_ids):
        rows = await session.execute(select(JobProfile.job_id, JobProfile.host_memory_bytes)
                                     .where(JobProfile.job_id.in_(chunk), JobProfile.host_memory_bytes > 0))
        out.update((job_id, int(host)) for job_id, host in rows.all())
    return out


async def list_jobs(
    session: AsyncSession,
    states: Iterable[JobState] = (),
    multi_job_id: str = "",
    limit: int = 0,
    user: str | None = None,
    after: tuple[float, int, str] | None = None,
) -> Sequence[Job]:
    """Jobs in submission order, a multi-job's members (submitted at one time) by their
    index; ``after`` (submitted_at, array_index, id) resumes after a page's last job
    (keyset paging: stable while new jobs arrive)."""
    q = select(Job).order_by(Job.submitted_at, Job.array_index, Job.id)
    wanted = [s.value for s in states]
    if wanted:
        q = q.where(Job.state.in_(wanted))
    if multi_job_id:
        q = q.where(Job.multi_job_id == multi_job_id)
    if user is not None:
        q = q.where(Job.user == user)
    if after is not None:
        at, index, job_id = after
        q = q.where(or_(Job.submitted_at > at,
                        and_(Job.submitted_at == at, or_(Job.array_index > index,
                                                         and_(Job.array_index == index, Job.id > job_id)))))
    if limit > 0:
        q = q.limit(limit)
    return (await session.scalars(q)).all()


async def jobs_by_id(session: AsyncSession, ids: Sequence[str]) -> list[Job]:
    out: list[Job] = []
    for chunk in _chunks(ids):
        out.extend((await session.scalars(select(Job).where(Job.id.in_(chunk)))).all())
    return out


async def launches_of(session: AsyncSession, ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Those of `ids` that are jobs of this scheduler: id -> (current incarnation, state)."""
    out: dict[str, tuple[str, str]] = {}
    for chunk in _chunks(sorted(set(ids))):
        out.update((r.id, (r.incarnation, r.state)) for r in await session.execute(
            select(Job.id, Job.incarnation, Job.state).where(Job.id.in_(chunk))))
    return out


async def existing_job_ids(session: AsyncSession, ids: Iterable[str]) -> set[str]:
    """Those of `ids` that are jobs of this scheduler (any state)."""
    out: set[str] = set()
    for chunk in _chunks(sorted(set(ids))):
        out.update((await session.scalars(select(Job.id).where(Job.id.in_(chunk)))).all())
    return out


async def job_ids_on_server(session: AsyncSession, server: str, ids: Iterable[str]) -> set[str]:
    """Those of `ids` that are jobs holding a GPU of `server` (their ids only)."""
    out: set[str] = set()
    for chunk in _chunks(sorted(set(ids))):
        out.update((await session.scalars(select(Placement.job_id).distinct().where(
            Placement.server_name == server, Placement.job_id.in_(chunk)))).all())
    return out


SNAPSHOT_COLUMNS = (
    Job.id, Job.gpus, Job.priority, Job.state, Job.submitted_at, Job.steps, Job.rate,
    Job.grow_shrink, Job.migratable, Job.suspendable, Job.state_changed_at, Job.attained_service_s,
    Job.multi_job_id, Job.held, Job.fenced_until, Job.grow_shrink_note, Job.array_index, Job.incarnation,
)
_UNFINISHED = [s.value for s in JobState if not s.terminal]


def running_job_rows(session: Session) -> Sequence:
    """(id, incarnation, state_changed_at, migratable) of every running job, as plain
    rows: the periodic checkpoints read them once a second (SchedulerCore.read_sync:
    a thousand rows off the event loop)."""
    q = (
        select(Job.id, Job.incarnation, Job.state_changed_at, Job.migratable)
        .where(Job.state == JobState.RUNNING.value)
        .order_by(Job.submitted_at, Job.id)
    )
    return session.execute(q).all()


@dataclass
class SnapshotRows:
    """What a scheduling round reads, as plain rows where it can."""

    # (name, num_gpus, up, smallest GPU memory or None, host memory, cordoned) of every server, by name.
    servers: Sequence
    # SNAPSHOT_COLUMNS of every unfinished job, in submission order (no ORM objects,
    # no JSON decoding).
    jobs: Sequence
    # (job_id, server_name, gpu_index) of every placement.
    placements: Sequence
    migrations: Sequence[Migration]
    # server -> the indices of its registered GPUs, sorted.
    gpu_indices: dict[str, tuple[int, ...]]
    # Profiles of unfinished jobs only (finished jobs' rows stay for history).
    profiles: dict[str, JobProfile]


def snapshot_rows(session: Session) -> SnapshotRows:
    """Everything a scheduling round reads, in one read transaction on a sync session
    (SchedulerCore.read_sync): on SQLite its queries and rows are made on a reader
    thread, not in stretches on the event loop."""
    memory = (select(Gpu.server_name, func.min(Gpu.memory_total).label("memory"))
              .group_by(Gpu.server_name).subquery())
    servers = (select(Server.name, Server.num_gpus, Server.up, memory.c.memory, Server.host_memory_bytes,
                      Server.cordoned)
               .outerjoin(memory, memory.c.server_name == Server.name).order_by(bytewise(Server.name)))
    jobs = select(*SNAPSHOT_COLUMNS).where(Job.state.in_(_UNFINISHED)).order_by(Job.submitted_at, Job.id)
    profiles = select(JobProfile).join(Job, Job.id == JobProfile.job_id).where(Job.state.in_(_UNFINISHED))
    return SnapshotRows(
        servers=session.execute(servers).all(),
        jobs=session.execute(jobs).all(),
        placements=session.execute(select(Placement.job_id, Placement.server_name, Placement.gpu_index)).all(),
        gpu_indices=_gpu_indices(session.execute(select(Gpu.server_name, Gpu.index).order_by(bytewise(Gpu.server_name), Gpu.index))),
        migrations=session.scalars(_MIGRATIONS_Q).all(),
        profiles={p.job_id: p for p in session.scalars(profiles).all()},
    )


def _gpu_indices(rows: Iterable) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for server, index in rows:
        out.setdefault(server, []).append(index)
    return {server: tuple(indices) for server, indices in out.items()}


_JOB_COLUMNS = [c.key for c in Job.__table__.columns]
# The tables themselves, for Core statements on the hot path.
JOBS = cast(Table, Job.__table__)
TRANSITIONS = cast(Table, Transition.__table__)
EVENTS = cast(Table, Event.__table__)
SERVERS = cast(Table, Server.__table__)
MULTI_JOBS = cast(Table, MultiJob.__table__)


def job_inserts(jobs: Sequence[Job], now: float, multi_job: MultiJob | None = None) -> list[tuple]:
    """The statements that submit `jobs`: the jobs, their first transition and event.

    Plain table INSERTs rather than the ORM's unit of work: submission is the hot
    path, and this is several times cheaper per job. The Job objects stay detached.
    Each item is (statement, parameter list), for an async session or a sync connection.
    """
    out: list[tuple] = []
    if multi_job is not None:
        out.append((insert(MULTI_JOBS), [{"id": multi_job.id, "name": multi_job.name, "created_at": multi_job.created_at,
                                          "request_key": multi_job.request_key}]))
    out.append((insert(JOBS), [{k: getattr(j, k) for k in _JOB_COLUMNS} for j in jobs]))
    out.append((
        insert(TRANSITIONS),
        [
            {"job_id": j.id, "from_state": "", "to_state": j.state, "at": now, "reason": "submitted"}
            for j in jobs
        ],
    ))
    out.append((
        insert(EVENTS),
        [
            {"at": now, "kind": "job.submitted", "job_id": j.id, "server": "", "message": f"{j.name}: {j.gpus} GPU(s)"}
            for j in jobs
        ],
    ))
    return out


# The most bind parameters one statement may have (asyncpg's limit is 32,767).
MAX_STATEMENT_PARAMS = 30_000


def job_insert_statement(jobs: Sequence[Job], now: float, multi_job: MultiJob | None = None) -> Executable | None:
    """job_inserts as one PostgreSQL statement (the first INSERTs as data-modifying
    CTEs of the last): atomic on its own, so a submission is one round trip to the
    database instead of five or six (begin, an INSERT per table, commit). None when it
    would have too many parameters (a large multi-job): use job_inserts."""
    items = job_inserts(jobs, now, multi_job)
    if sum(len(params) * len(params[0]) for _, params in items) > MAX_STATEMENT_PARAMS:
        return None
    ctes = [stmt.values(params).cte(f"w{i}") for i, (stmt, params) in enumerate(items[:-1])]
    stmt, params = items[-1]
    return stmt.values(params).add_cte(*ctes)


async def add_jobs(
    session: AsyncSession, jobs: Sequence[Job], now: float, multi_job: MultiJob | None = None
) -> None:
    """Insert new jobs (and their multi-job) with their first transition and event."""
    for stmt, params in job_inserts(jobs, now, multi_job):
        await session.execute(stmt, params)
    session.info["events"] = True


async def transition(
    session: AsyncSession, job: Job, target: JobState, now: float, reason: str = "", server: str = ""
) -> None:
    """Move `job` to `target` if the state machine allows it, recording why and on which
    server (``server`` for a launch, else where it is placed: where its output is; see
    last_server).

    The one place a job's state changes (Job refuses any other assignment): checked
    against scheduler.lifecycle.ALLOWED_FROM, with its Transition row and its event added
    to the caller's transaction, so all three commit together or not at all. finish,
    requeue, place and start_migration below add what goes with each kind of change."""
    current = JobState(job.state)
    check_transition(job.id, current, target)
    reason = reason + _rate_said(job, current, target)
    if job.state_changed_at and (current is JobState.RUNNING or (
            current is JobState.MIGRATING and trains(current.value, await _moved_from(session, job.id), target.value))):
        # GPU-seconds received, for least-attained-service policies (a move of a running
        # job's too: it trained on at its source while its copy pre-warmed).
        job.attained_service_s += max(0.0, now - job.state_changed_at) * job.gpus
    with state_change():
        job.state = target.value
    job.updated_at = now
    job.state_changed_at = now
    if reason:
        job.message = reason
    if target.terminal:
        job.finished_at = now
    if target is JobState.RUNNING and not job.started_at:
        job.started_at = now
    session.add(
        Transition(job_id=job.id, from_state=current.value, to_state=target.value, at=now, reason=reason)
    )
    if not server:  # every change names where the job is (was): `get events` by server
        server = str(await session.scalar(
            select(Placement.server_name).where(Placement.job_id == job.id).limit(1)) or "")
    add_event(session, now, "job.state", f"{current.value} -> {target.value}: {reason}", job_id=job.id,
              server=server)


def _rate_said(job: Job, current: JobState, target: JobState) -> str:
    """For a running job suspended or moved (a time slice's end, a migration, a grow or
    shrink): the rate it ran at since it last started, so that its history says what each
    decision changed (` (it ran 31.8 mini-batches/s)`); nothing when no report came in
    since (it would be a rate from before: another placement, alone instead of packed)."""
    if current is not JobState.RUNNING or target not in (JobState.SUSPENDED, JobState.MIGRATING):
        return ""
    if not (job.rate or 0) > 0 or not job.state_changed_at or (job.rate_at or 0) < job.state_changed_at:
        return ""
    return f" (it ran {job.rate:.1f} mini-batches/s)" if job.rate >= 1 else f" (it ran {job.rate:.2g} mini-batches/s)"


async def last_server(session: AsyncSession, job_id: str) -> str:
    """The server the job runs on, or ran on last ("" if it never ran): where its output is."""
    placed = await session.scalar(select(Placement.server_name).where(Placement.job_id == job_id).limit(1))
    if placed:
        return str(placed)
    q = (select(Event.server).where(Event.job_id == job_id, Event.kind == "job.state", Event.server != "")
         .order_by(Event.id.desc()).limit(1))
    return str(await session.scalar(q) or "")


async def finish(session: AsyncSession, job: Job, state: JobState, now: float, reason: str) -> None:
    """To a terminal `state`: no GPUs, no migration in progress."""
    await transition(session, job, state, now, reason)
    await clear_placement(session, job.id, now)
    await end_migration(session, job.id)


def endpoint(server: Server) -> Endpoint:
    """A registered server as a migration's endpoint."""
    return Endpoint(server.name, server.address, server.ramdisk, server.shared_root)


async def resume_from_migration(session: AsyncSession, job: Job, migration: Migration) -> str:
    """Make the checkpoint the migration's source confirmed the job's restore point, recorded
    on the server whose ramdisk holds it (``checkpoint_home``: the destination's, through a
    shared mount), for a migration known by its durable row (after a scheduler restart, or
    when its source went down); returns "will resume from step N (its checkpoint is on S)"."""
    holder, path = migration.source_server, migration.checkpoint_path
    try:
        src = await get_server(session, migration.source_server)
        dst = await get_server(session, migration.dest_server)
    except NotFound:  # a server deregistered meanwhile: the path says no more than it did
        pass
    else:
        holder, path = checkpoint_home(endpoint(src), endpoint(dst), migration.checkpoint_path)
    job.restore_checkpoint, job.restore_server, job.restore_step = path, holder, max(0, migration.step)
    return f"will resume from step {migration.step} (its checkpoint is on {holder})"


async def _moved_from(session: AsyncSession, job_id: str) -> str:
    """The state a MIGRATING job's move began in (its latest change into MIGRATING)."""
    return str(await session.scalar(
        select(Transition.from_state).where(Transition.job_id == job_id, Transition.to_state == JobState.MIGRATING.value)
        .order_by(Transition.id.desc()).limit(1)) or "")


async def transitions_with_reason(session: AsyncSession, job_id: str, prefix: str) -> int:
    """How many of the job's state changes had a reason starting with ``prefix``."""
    query = select(func.count()).select_from(Transition).where(
        Transition.job_id == job_id, _starts(Transition.reason, prefix))
    return int((await session.execute(query)).scalar_one())


def _starts(column: Any, prefix: str) -> Any:
    """``column`` begins with ``prefix``, exactly, on both databases. Not LIKE
    (``startswith``): SQLite's ignores case, so `gandiva get events --kind JOB` listed
    job.* events there and nothing on PostgreSQL (nor in the CLI's own --watch filter)."""
    return func.substr(column, 1, len(prefix)) == prefix


async def requeue(
    session: AsyncSession, job: Job, now: float, reason: str, fenced_until: float = 0.0
) -> None:
    """Back to the queue: no GPUs, no migration in progress. ``fenced_until``: not to be
    placed before then (an older copy may still run where the scheduler cannot reach).

    An operator's hold (``gandiva suspend``) ends here, saying so: it holds a suspended
    process, which the job no longer has, and a held job is out of the policy's reach
    while ``gandiva resume`` takes only a suspended one: a held job requeued when its
    server went down used to wait in the queue for good, "its server node-a went down"."""
    if job.held:
        job.held = False
        reason = f"{reason}; the operator's hold ends with its process: it is placed again"
    await transition(session, job, JobState.QUEUED, now, reason)
    await clear_placement(session, job.id, now)
    await end_migration(session, job.id)
    job.fenced_until = max(job.fenced_until or 0.0, fenced_until)


async def place(
    session: AsyncSession, job: Job, gpus: Iterable[tuple[str, int]], incarnation: str, now: float,
    reason: str,
) -> None:
    """To RUNNING on `gpus` as the launch `incarnation`: from the queue, or a migration
    arriving at its destination. Its state, GPUs and fencing token change together; the
    event names the (first) server, where the job's output goes (see last_server)."""
    gpus = list(gpus)
    await transition(session, job, JobState.RUNNING, now, reason, server=gpus[0][0] if gpus else "")
    await set_placement(session, job.id, gpus, now)
    if job.incarnation != incarnation:
        job.rate_at = 0.0  # its rate is not measured on these GPUs yet (scheduler/eta.py)
    job.incarnation = incarnation


async def start_migration(session: AsyncSession, job: Job, row: Migration, now: float, reason: str) -> None:
    """To MIGRATING, with the migration's durable row (its phase, and the destination GPUs
    held from now on) in the same transaction."""
    await transition(session, job, JobState.MIGRATING, now, reason)
    session.add(row)


def set_queued_messages(conn: Connection, by_reason: dict[str, list[str]]) -> None:
    """Why queued jobs wait: one plain UPDATE per reason (and chunk of ids), for the
    writer (SchedulerCore.write_sync): every round names the newly queued jobs."""
    for message, job_ids in by_reason.items():
        for chunk in _chunks(job_ids):
            conn.execute(
                update(Job).where(Job.id.in_(chunk), Job.state == JobState.QUEUED.value).values(message=message)
            )


# A job time-sliced for weeks gathers thousands of transitions; a GetJob shows the latest.
MAX_HISTORY = 200


def history_q(job_id: str, limit: int = MAX_HISTORY) -> Select:
    """The job's last ``limit`` transitions, newest first (job_detail shows them oldest first)."""
    return select(Transition).where(Transition.job_id == job_id).order_by(Transition.id.desc()).limit(limit)


# ---- placements ---------------------------------------------------------------


async def placements_of(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, list[Placement]]:
    out: dict[str, list[Placement]] = defaultdict(list)
    for chunk in _chunks(job_ids):
        q = select(Placement).where(Placement.job_id.in_(chunk))
        for p in (await session.scalars(q)).all():
            out[p.job_id].append(p)
    for ps in out.values():
        ps.sort(key=lambda p: (p.server_name, p.gpu_index))
    return out


async def jobs_on_server(session: AsyncSession, server: str) -> Sequence[Job]:
    """The jobs holding at least one GPU of `server`."""
    placed = select(Placement.job_id).where(Placement.server_name == server)
    return (await session.scalars(select(Job).where(Job.id.in_(placed)).order_by(Job.id))).all()


def _placed_rows_query(server: str) -> Select:
    placed = select(Placement.job_id).where(Placement.server_name == server)
    return select(Job.id, Job.incarnation, Job.state, Job.state_changed_at).where(Job.id.in_(placed)).order_by(Job.id)


async def placed_job_rows(session: AsyncSession, server: str) -> Sequence:
    """(id, incarnation, state, state_changed_at) of the jobs holding a GPU of `server`,
    as plain rows: every heartbeat of that server reconciles them."""
    return (await session.execute(_placed_rows_query(server))).all()


async def set_placement(
    session: AsyncSession, job_id: str, gpus: Iterable[tuple[str, int]], now: float
) -> None:
    """The job holds ``gpus`` from ``now`` on; each GPU's hold (gpu_holds) is closed when it
    leaves it and opened where it arrives, one it keeps (a grow's first GPUs) goes on."""
    wanted = list(dict.fromkeys(gpus))
    await session.execute(delete(Placement).where(Placement.job_id == job_id))
    await _close_holds(session, job_id, now, keep=set(wanted))
    held = {(str(r[0]), int(r[1])) for r in (await session.execute(
        select(GpuHold.server_name, GpuHold.gpu_index).where(GpuHold.job_id == job_id, GpuHold.end_at.is_(None))
    )).all()}
    for server, index in wanted:
        session.add(Placement(job_id=job_id, server_name=server, gpu_index=index))
        if (server, index) not in held:
            session.add(GpuHold(job_id=job_id, server_name=server, gpu_index=index, start_at=now, end_at=None))


async def clear_placement(session: AsyncSession, job_id: str, now: float) -> None:
    await session.execute(delete(Placement).where(Placement.job_id == job_id))
    await _close_holds(session, job_id, now)


async def _close_holds(session: AsyncSession, job_id: str, now: float, keep: Iterable[tuple[str, int]] = ()) -> None:
    """End the job's open holds at ``now``, but those of ``keep``."""
    q = update(GpuHold).where(GpuHold.job_id == job_id, GpuHold.end_at.is_(None))
    for server, index in keep:
        q = q.where(~((GpuHold.server_name == server) & (GpuHold.gpu_index == index)))
    await session.execute(q.values(end_at=now).execution_options(synchronize_session=False))


# ---- servers ------------------------------------------------------------------


@dataclass
class ServerLoad:
    """A server with what is placed on it: the inputs of height and affinity."""

    server: Server
    gpus: list[Gpu]
    jobs_by_gpu: dict[int, list[str]] = field(default_factory=dict)
    job_gpus: dict[str, int] = field(default_factory=dict)  # job id -> its GPU count
    # job id -> its measured host memory (0: not measured yet).
    job_host: dict[str, int] = field(default_factory=dict)

    def host_used(self, assumed: int) -> int:
        """Host memory the jobs placed here hold, as the policy counts it (a job holds its
        whole host memory on every server it spans; one not measured yet ``assumed``)."""
        return sum(held or assumed for held in self.job_host.values())

    @property
    def allocated(self) -> int:
        return sum(len(v) for v in self.jobs_by_gpu.values())

    @property
    def height(self) -> int:
        n = self.server.num_gpus
        return math.ceil(self.allocated / n) if n else 0

    @property
    def affinity(self) -> int:
        """The GPU count of the jobs placed here, as the policy defines it; 0 when empty."""
        return affinity_of(Counter(self.job_gpus.values())) or 0


async def get_server(session: AsyncSession, name: str) -> Server:
    server = await session.get(Server, name)
    if server is None:
        raise NotFound("server", name)
    return server


async def upsert_server(
    session: AsyncSession,
    name: str,
    address: str,
    gpus: Sequence[Gpu],
    ramdisk: str,
    shared_root: str,
    now: float,
    host_memory_bytes: int = 0,
) -> bool:
    """Create or refresh a server and its GPUs. Returns True if it is new."""
    server = await session.get(Server, name)
    created = server is None
    if server is None:
        server = Server(name=name, registered_at=now)
        session.add(server)
    server.address = address
    server.num_gpus = len(gpus)
    server.ramdisk = ramdisk
    server.shared_root = shared_root
    server.host_memory_bytes = host_memory_bytes
    server.up = True
    server.last_heartbeat = now
    await server_up(session, name, len(gpus), now)
    await session.flush()
    await session.execute(delete(Gpu).where(Gpu.server_name == name))
    for g in gpus:
        g.server_name = name
        session.add(g)
    return created


async def server_up(session: AsyncSession, name: str, gpus: int, now: float) -> None:
    """The server is up with ``gpus`` GPUs from ``now`` (its server_spans row; one open
    with another GPU count is closed first, one open with the same goes on)."""
    open_q = (ServerSpan.server_name == name) & ServerSpan.end_at.is_(None)
    current = (await session.execute(select(ServerSpan.gpus).where(open_q))).scalars().all()
    if list(current) == [gpus]:
        return
    if current:
        await server_down(session, name, now)
    session.add(ServerSpan(server_name=name, gpus=gpus, start_at=now, end_at=None))


async def server_down(session: AsyncSession, name: str, now: float) -> None:
    """The server's time up ends at ``now``."""
    await session.execute(update(ServerSpan).where(ServerSpan.server_name == name, ServerSpan.end_at.is_(None))
                          .values(end_at=now).execution_options(synchronize_session=False))


async def heartbeat(session: AsyncSession, name: str, now: float) -> Server | None:
    server = await session.get(Server, name)
    if server is None:
        return None
    server.last_heartbeat = now
    return server


async def helper_agents(session: AsyncSession) -> list[tuple[str, str]]:
    """(name, agent address) of every registered server, by name."""
    rows = await session.execute(select(Server.name, Server.address).order_by(bytewise(Server.name)))
    return [(name, address) for name, address in rows.all()]


def unfinished_jobs(session: Session, user: str) -> int:
    """How many of ``user``'s jobs have not ended (queued, running, suspended, ...)."""
    live = [s.value for s in JobState if s not in TERMINAL]
    return session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(live), Job.user == user)) or 0


async def kept_checkpoints(session: AsyncSession, server: str) -> list[str]:
    """The checkpoints on ``server`` that the scheduler still needs: every unfinished job's
    restore point there (a parked or re-queued job resumes from it, possibly hours later)
    and every migration's confirmed checkpoint there. Its helper's housekeeping keeps them."""
    live = [s.value for s in JobState if s not in TERMINAL]
    restore = await session.execute(select(Job.restore_checkpoint).where(
        Job.restore_server == server, Job.restore_checkpoint != "", Job.state.in_(live)))
    moving = await session.execute(select(Migration.checkpoint_path).where(
        Migration.source_server == server, Migration.checkpoint_path != ""))
    return sorted({p for (p,) in restore.all()} | {p for (p,) in moving.all()})


async def checkpoints_held_for(session: AsyncSession, server: str) -> Sequence[Job]:
    """The queued jobs, and the jobs running on another server, whose restore point is a
    checkpoint on ``server`` (a drain moves a queued one's off, and waits for a running
    one's fetch from there to end, before it calls the server drained)."""
    placed = select(Placement.job_id).where(Placement.server_name == server)
    return (await session.scalars(select(Job).where(
        Job.restore_server == server, Job.restore_checkpoint != "",
        Job.state.in_([JobState.QUEUED.value, JobState.RUNNING.value]), Job.id.not_in(placed)).order_by(Job.id))).all()


async def server_at(session: AsyncSession, address: str) -> Server | None:
    """The registered server whose helper's agent listens on ``address``: the one up, if
    another (down) had the address before it."""
    return (await session.scalars(select(Server).where(Server.address == address)
                                  .order_by(Server.up.desc(), bytewise(Server.name)).limit(1))).first()


async def largest_server(session: AsyncSession) -> tuple[int, str]:
    """(GPUs, name) of the server with the most GPUs; (0, "") when none is registered."""
    row = (await session.execute(select(Server.num_gpus, Server.name).order_by(Server.num_gpus.desc(), bytewise(Server.name)).limit(1))).first()
    return (row[0], row[1]) if row else (0, "")


async def up_servers(session: AsyncSession) -> Sequence[Server]:
    return (await session.scalars(select(Server).where(Server.up.is_(True)))).all()


async def server_loads(session: AsyncSession) -> list[ServerLoad]:
    servers = (await session.scalars(select(Server).order_by(bytewise(Server.name)))).all()
    gpus = (await session.scalars(select(Gpu).order_by(bytewise(Gpu.server_name), Gpu.index))).all()
    rows = (
        await session.execute(
            select(Placement.server_name, Placement.gpu_index, Placement.job_id, Job.gpus,
                   func.coalesce(JobProfile.host_memory_bytes, 0))
            .join(Job, Job.id == Placement.job_id)
            .outerjoin(JobProfile, JobProfile.job_id == Placement.job_id)
        )
    ).all()
    by_name = {s.name: ServerLoad(s, []) for s in servers}
    for g in gpus:
        if g.server_name in by_name:
            by_name[g.server_name].gpus.append(g)
    for server_name, gpu_index, job_id, job_gpus, host in rows:
        load = by_name.get(server_name)
        if load is not None:
            load.jobs_by_gpu.setdefault(gpu_index, []).append(job_id)
            load.job_gpus[job_id] = job_gpus
            load.job_host[job_id] = host
    return list(by_name.values())


# ---- fencing and migrations --------------------------------------------------------


def _involved_query(server: str) -> Select:
    return select(
        Migration.job_id, Migration.source_server, Migration.dest_server, Migration.source_incarnation,
        Migration.dest_incarnation, Migration.fallback_incarnation,
    ).where(or_(Migration.dest_server == server, Migration.source_server == server))


def _expected_pairs(server: str, placed: Iterable, involved: Iterable) -> set[tuple[str, str]]:
    """From the rows of _placed_rows_query and _involved_query."""
    active = {s.value for s in ACTIVE}
    pairs = {(job_id, inc) for job_id, inc, state, _ in placed if state in active}
    for job_id, source, dest, source_inc, dest_inc, fallback_inc in involved:
        if dest == server:
            pairs.add((job_id, dest_inc))
        if source == server:
            pairs.update({(job_id, source_inc), (job_id, fallback_inc)})
    return pairs


async def expected_incarnations(session: AsyncSession, server: str) -> set[tuple[str, str]]:
    """The (job, incarnation) pairs that may run on `server` now: the current launch of
    each active job placed there, and the destination (or fallback) launch of each
    migration in progress that involves it. Anything else found there is stale."""
    placed = (await session.execute(_placed_rows_query(server))).all()
    return _expected_pairs(server, placed, (await session.execute(_involved_query(server))).all())


@dataclass
class Beat:
    """What one heartbeat's fast path read: the jobs placed on the server (for the
    engine's reconciliation) and the launches it runs that must stop."""

    placed: Sequence
    stale: list[tuple[str, str]]


def heartbeat_fast(conn: Connection, name: str, now: float, running: Sequence[tuple[str, str]]) -> Beat | None:
    """A heartbeat of a registered server that is up, in one round trip to the writer:
    its time is recorded and what reconciliation needs is read, all with plain
    statements (no ORM objects). None when the server is unknown or down: the caller
    takes the full path, which records the server coming back."""
    done = conn.execute(update(SERVERS).where(SERVERS.c.name == name, SERVERS.c.up.is_(True)).values(last_heartbeat=now))
    if done.rowcount != 1:
        return None
    placed = conn.execute(_placed_rows_query(name)).all()
    stale: list[tuple[str, str]] = []
    if running:
        expected = _expected_pairs(name, placed, conn.execute(_involved_query(name)).all())
        stale = sorted(set(running) - expected)
    return Beat(placed, stale)


def write_progress(conn: Connection, batch: dict[str, tuple[str, int, float, float, dict[str, float]]], now: float) -> None:
    """Reported progress of many jobs, in one transaction of two batched UPDATEs: each
    row only for its job's current launch (a report of an older launch, or of a
    pre-warmed destination not yet current, changes nothing), steps never going back.
    Metrics are merged into the stored ones, so only jobs that sent some are read."""
    with_metrics = {j: v for j, v in batch.items() if v[4]}
    stored: dict[str, dict] = {}
    for chunk in _chunks(sorted(with_metrics)):
        rows = conn.execute(select(JOBS.c.id, JOBS.c.incarnation, JOBS.c.metrics).where(JOBS.c.id.in_(chunk)))
        stored.update({job_id: metrics or {} for job_id, inc, metrics in rows if inc == with_metrics[job_id][0]})
    steps = bindparam("b_steps", type_=JOBS.c.steps.type)
    base = update(JOBS).where(JOBS.c.id == bindparam("b_id"), JOBS.c.incarnation == bindparam("b_inc"))
    values = {"steps": case((JOBS.c.steps > steps, JOBS.c.steps), else_=steps), "rate": bindparam("b_rate"),
              "last_step_s": bindparam("b_last"), "updated_at": bindparam("b_now"), "rate_at": bindparam("b_now")}
    plain = [_progress_params(j, v, now) for j, v in batch.items() if j not in stored]
    merged = [{**_progress_params(j, v, now), "b_metrics": {**stored[j], **v[4]}} for j, v in batch.items() if j in stored]
    if plain:
        conn.execute(base.values(**values), plain)
    if merged:
        conn.execute(base.values(**values, metrics=bindparam("b_metrics", type_=JOBS.c.metrics.type)), merged)


def _progress_params(job_id: str, v: tuple[str, int, float, float, dict[str, float]], now: float) -> dict:
    return {"b_id": job_id, "b_inc": v[0], "b_steps": v[1], "b_rate": v[2], "b_last": v[3], "b_now": now}


_MIGRATIONS_Q = select(Migration).order_by(Migration.started_at)


async def migrations(session: AsyncSession) -> Sequence[Migration]:
    return (await session.scalars(_MIGRATIONS_Q)).all()


async def get_migration(session: AsyncSession, job_id: str) -> Migration | None:
    return await session.get(Migration, job_id)


async def end_migration(session: AsyncSession, job_id: str) -> None:
    await session.execute(delete(Migration).where(Migration.job_id == job_id))


async def reset_heartbeats(session: AsyncSession, now: float) -> None:
    """A scheduler (re)starting gives every up server a full `down_after_s` to reach it
    again, instead of judging it by the time the previous scheduler last heard it."""
    await session.execute(update(Server).where(Server.up.is_(True)).values(last_heartbeat=now))


async def update_gpu_samples(
    session: AsyncSession, server: str, samples: Iterable[tuple[int, float, int, float]]
) -> None:
    """samples: (gpu index, at, memory used bytes, utilization); those of a GPU the server
    did not register are left out (a helper's report may name any index)."""
    registered = set((await session.scalars(select(Gpu.index).where(Gpu.server_name == server))).all())
    for index, at, mem, util in samples:
        if index not in registered:
            continue
        await session.execute(
            update(Gpu)
            .where(Gpu.server_name == server, Gpu.index == index)
            .values(memory_used=mem, utilization=util, sampled_at=at)
        )


async def upsert_profile(
    session: AsyncSession, job_id: str, now: float, **values: float
) -> JobProfile:
    prof = await session.get(JobProfile, job_id)
    if prof is None:
        prof = JobProfile(job_id=job_id, updated_at=now)
        session.add(prof)
    for k, v in values.items():
        setattr(prof, k, v)
    prof.updated_at = now
    return prof


# A job's host memory is rewritten only when it moved by more than this (bytes, or this
# fraction of the stored value): a resident set drifts by pages from one report to the next,
# and every change is a write and a new view of the job for the policy.
HOST_MEMORY_STEP = 16 << 20
HOST_MEMORY_STEP_FRACTION = 0.02


async def record_host_memory(session: AsyncSession, measured: Sequence[tuple[str, str, int]], now: float) -> int:
    """Store each job's measured host memory: ``measured`` holds (job id, incarnation,
    resident bytes) as a helper reported them. Only a job's current launch counts (a
    stale copy, or a migration's pre-warmed destination, is another process); finished
    jobs and jobs this scheduler never had are skipped, and so is a value within
    HOST_MEMORY_STEP (or HOST_MEMORY_STEP_FRACTION) of the stored one. How many were stored."""
    by_job = {job_id: (incarnation, rss) for job_id, incarnation, rss in measured if rss > 0 and incarnation}
    stored = 0
    for chunk in _chunks(sorted(by_job)):
        rows = await session.execute(
            select(Job.id, Job.incarnation, JobProfile.host_memory_bytes)
            .outerjoin(JobProfile, JobProfile.job_id == Job.id)
            .where(Job.id.in_(chunk), Job.state.in_(_UNFINISHED)))
        for job_id, incarnation, old in rows.all():
            want, rss = by_job[job_id]
            if want != incarnation or (old and abs(rss - old) <= max(HOST_MEMORY_STEP, old * HOST_MEMORY_STEP_FRACTION)):
                continue
            await upsert_profile(session, job_id, now, host_memory_bytes=rss, host_memory_at=now)
            stored += 1
    return stored

