"""The Scheduler service: thin servicers over SchedulerCore and the live engine."""

from __future__ import annotations

import asyncio
import functools
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler import auth
from scheduler.api import paging
from scheduler.api.convert import event_to_pb, job_to_pb, server_to_pb, state_from_pb
from scheduler.api.status import grpc_errors, grpc_stream_errors
from scheduler.core import JobDetail, SchedulerCore
from scheduler.engine.drain import set_cordon
from scheduler.engine.live import LiveEngine
from scheduler.errors import InvalidArgument, ResourceExhausted
from scheduler.observe import holds, problems, usage
from scheduler.state import repo
from scheduler.state.models import Event
from scheduler.state.repo import ServerLoad
from scheduler.validation import MAX_REASON, check_id, check_text

JOBS_PAGE, JOBS_PAGE_MAX = 500, 1000
EVENTS_PAGE, EVENTS_PAGE_MAX = 1000, 5000
LOG_READ_MAX = 1 << 20  # bytes of a job's output per ReadJobLog
# ReadJobLog calls sent on to helpers at once: 1,000 at once (one user, their own job's log)
# took a helper from 89 to 772 MB, memory its server's jobs need, and delayed everyone's reads.
LOG_READS_AT_ONCE = 8
WATCH_BATCH = 500  # events a watch reads at a time
# A job id in a text (job ids are new_id("j")), and how one of another user's is shown.
JOB_ID = re.compile(r"\bj-[0-9a-f]{10}\b")
NAMED_JOB = re.compile(r"(?:\bjob )?\b(j-[0-9a-f]{10})\b")
OTHER_JOB = "another user's job"
MAX_KINDS = 32  # kinds one events request may filter on
MAX_STATES = 64  # states one ListJobs may filter on (repeats included)
# Listings served at once (the SQLite read pool holds 15 connections; PostgreSQL's 30).
LISTINGS_AT_ONCE = 4
F = TypeVar("F", bound=Callable[..., Any])
# Event watches one caller (a user's token; without --auth token, everyone) may hold open.
# Each costs about 30 KB and a wake-up a second: one client opened 3,000 in 6 s, which
# held 100 MB and kept more than half a core busy.
MAX_WATCHES = 256


def placements_pb(held: Sequence[holds.Hold], mine: set[str] | None, budget: int
                  ) -> tuple[list[scheduler_pb2.PlacementSpan], bool]:
    """``held`` as messages, while they fit ``budget`` bytes (10,000 of the longest job names,
    users and server names were 5.0 MB, more than a client takes), and whether some were left out.
    ``mine``: the caller's own jobs (None: an operator's, all shown); another user's job is
    hidden-N, numbered within the answer, as ListServers shows it."""
    aliases: dict[str, str] = {}
    out: list[scheduler_pb2.PlacementSpan] = []
    used = 0
    for h in held:
        seen = mine is None or h.job_id in mine
        message = scheduler_pb2.PlacementSpan(
            job_id=h.job_id if seen else aliases.setdefault(h.job_id, f"{auth.HIDDEN_JOB}{len(aliases) + 1}"),
            name=h.name if seen else "", user=h.user if seen else "", server=h.server, gpu=h.gpu,
            start_at=h.start_at, end_at=h.end_at or 0.0, state_at=h.state_at)
        used += message.ByteSize()
        if used > budget:
            return out, True
        out.append(message)
    return out, False


def cluster_height(loads: list[ServerLoad]) -> int:
    return max((ld.height for ld in loads if ld.server.up), default=0)


def _bounded(details: list, now: float) -> list[common_pb2.Job]:
    """All members, in full while they fit a page; past that without their command,
    env and workdir (GetJob has them), so the answer fits a client's receive limit."""
    out, used = [], 0
    for d in details:
        job = job_to_pb(d, now)
        used += job.ByteSize()
        if used > paging.PAGE_BYTES:
            job.spec.ClearField("command")
            job.spec.ClearField("env")
            job.spec.ClearField("workdir")
        out.append(job)
    return out


def _within_bytes(rows: Sequence[Any], budget: int) -> tuple[list[scheduler_pb2.Usage], int]:
    """The first of ``rows`` (usage.Usage) as messages while they fit ``budget`` bytes, and
    the bytes they take."""
    out, used = [], 0
    for row in rows:
        message = scheduler_pb2.Usage(**row.as_dict())
        if used + message.ByteSize() > budget:
            break
        used += message.ByteSize()
        out.append(message)
    return out, used


def _few_at_once(fn: F) -> F:
    """A listing (up to a thousand jobs or five thousand events read and encoded) runs with at
    most LISTINGS_AT_ONCE others; the rest wait their turn holding nothing. 800 at once from
    one client held every connection of the database's pool: everyone's reads, the scheduling
    rounds' included, waited, and failed after 30 s (INTERNAL "database error (TimeoutError)")."""

    @functools.wraps(fn)
    async def wrapper(self: SchedulerServicer, request: Any, context: Any) -> Any:
        async with self._listings:
            return await fn(self, request, context)

    return wrapper  # type: ignore[return-value]


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore, engine: LiveEngine) -> None:
        self.core = core
        self.engine = engine
        self._watches: Counter[str] = Counter()  # open WatchEvents by caller
        self._listings = asyncio.Semaphore(LISTINGS_AT_ONCE)
        self._log_reads = asyncio.Semaphore(LOG_READS_AT_ONCE)

    async def _own_job(self, job_id: str) -> None:
        """The caller may see and act on this job (its owner, or an operator)."""
        check_id("id", job_id)
        ident = auth.current()
        if not ident.sees_all:
            detail = await self.core.get_job(job_id)
            auth.require_job_access(ident, detail.job.user, job_id)

    async def _hide_others(self, jobs: Sequence[common_pb2.Job] = (),
                           events: Sequence[common_pb2.Event] = ()) -> None:
        """For a user, another user's job id named in these jobs' and events' texts (a packing
        verdict, "make room for job ...", "packed beside ...") becomes "another user's job",
        as ListJobs hides that job; an operator sees the ids."""
        ident = auth.current()
        if ident.sees_all:
            return
        texts: list[tuple[Any, str]] = [(e, "message") for e in events]
        for j in jobs:
            texts += [(j, "message"), (j, "control_note"), (j, "grow_shrink_note"), (j, "eta_note"), (j, "wait")]
            texts += [(t, "reason") for t in j.history]
        named = {found for msg, field in texts for found in JOB_ID.findall(getattr(msg, field))}
        if not named:
            return
        async with self.core.tx(read=True) as s:
            hidden = named - await repo.own_jobs(s, ident.name, named)
        for msg, field in texts:
            text = getattr(msg, field)
            if hidden and JOB_ID.search(text):
                setattr(msg, field, NAMED_JOB.sub(lambda m: OTHER_JOB if m[1] in hidden else m[0], text))

    async def _job(self, detail: JobDetail) -> common_pb2.Job:
        job = job_to_pb(detail, self.core.clock())
        await self._hide_others([job])
        return job

    @staticmethod
    def _as_caller(spec: common_pb2.JobSpec) -> common_pb2.JobSpec:
        """The spec with its user taken from the credential, never from the client."""
        ident = auth.current()
        if ident.role == "anonymous":
            return spec
        auth.require_priority(ident, spec.priority, "spec.priority")
        own = common_pb2.JobSpec()
        own.CopyFrom(spec)
        own.user = ident.name
        return own

    @staticmethod
    def _limited() -> bool:
        """The caller is held to --max-jobs-per-user: everyone but an operator (without
        --auth token, each spec.user name a client gives is counted on its own)."""
        return auth.current().role != "operator"

    @grpc_errors
    async def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
        detail = await self.core.submit(self._as_caller(request.spec), dry_run=request.dry_run,
                                        request_id=request.request_id, limited=self._limited())
        return scheduler_pb2.SubmitJobResponse(job=job_to_pb(detail, self.core.clock()))

    @grpc_errors
    async def SubmitMultiJob(self, request, context):  # type: ignore[no-untyped-def]
        specs = [self._as_caller(s) for s in request.jobs]
        mj_id, details = await self.core.submit_multi(request.name, specs, request.dry_run, request.request_id,
                                                      limited=self._limited())
        return scheduler_pb2.SubmitMultiJobResponse(multi_job_id=mj_id, jobs=_bounded(details, self.core.clock()))

    @grpc_errors
    async def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        check_id("id", request.id)
        detail = await self.core.get_job(request.id)
        auth.require_job_access(auth.current(), detail.job.user, request.id)
        return await self._job(detail)

    @grpc_errors
    async def ReadJobLog(self, request, context):  # type: ignore[no-untyped-def]
        check_id("id", request.id)
        if request.offset < 0:
            raise InvalidArgument("offset", f"{request.offset} is negative")
        if not 0 <= request.max_bytes <= LOG_READ_MAX:
            raise InvalidArgument("max_bytes", f"{request.max_bytes}: use 1 to {LOG_READ_MAX} (0: the most)")
        detail = await self.core.get_job(request.id)
        # A job's output is its owner's (and operators'), like its environment.
        auth.require_job_access(auth.current(), detail.job.user, request.id)
        async with self._log_reads:  # each holds up to 1 MiB in the helper and here
            server, got = await self.core.read_log(request.id, request.offset, request.max_bytes or LOG_READ_MAX)
        return scheduler_pb2.ReadJobLogResponse(
            data=got.data, next_offset=min(request.offset, got.log_size) + len(got.data), size=got.log_size,
            server=server)

    @grpc_errors
    @_few_at_once
    async def ListJobs(self, request, context):  # type: ignore[no-untyped-def]
        size = paging.page_size(request.page_size, request.limit, JOBS_PAGE, JOBS_PAGE_MAX)
        if len(request.states) > MAX_STATES:  # 2,000,000 of them made SQLite fail, read as an outage
            raise InvalidArgument("states", f"{len(request.states)} states; at most {MAX_STATES} "
                                  f"(there are {len(common_pb2.JobState.values()) - 1} job states)")
        states = []
        for value in sorted(set(request.states)):
            if value == common_pb2.JOB_STATE_UNSPECIFIED or value not in common_pb2.JobState.values():
                raise InvalidArgument("states", f"unknown job state {value}")
            states.append(state_from_pb(value))
        check_text("multi_job_id", request.multi_job_id, 64)
        check_text("user", request.user, 128)
        ident = auth.current()
        user: str | None = request.user or None
        if not ident.sees_all:
            if user not in (None, ident.name):
                raise auth.PermissionDenied(f"user: you may list only your own jobs ({ident.name})")
            user = ident.name
        details = await self.core.list_jobs(
            states, request.multi_job_id, size, user, paging.job_cursor(request.page_token)
        )
        jobs, last = paging.fill(details, functools.partial(job_to_pb, now=self.core.clock()), full=len(details) == size)
        await self._hide_others(jobs)
        token = paging.encode([last.job.submitted_at, last.job.array_index, last.job.id]) if last is not None else ""
        return scheduler_pb2.ListJobsResponse(jobs=jobs, next_page_token=token)

    @grpc_errors
    async def KillJob(self, request, context):  # type: ignore[no-untyped-def]
        check_text("reason", request.reason, MAX_REASON)
        await self._own_job(request.id)
        return await self._job(await self.core.kill(request.id, request.reason))

    @grpc_errors
    async def SetPriority(self, request, context):  # type: ignore[no-untyped-def]
        await self._own_job(request.id)
        auth.require_priority(auth.current(), request.priority, "priority")
        return await self._job(await self.core.set_priority(request.id, request.priority))

    @grpc_errors
    async def SuspendJob(self, request, context):  # type: ignore[no-untyped-def]
        check_text("reason", request.reason, MAX_REASON)
        await self._own_job(request.id)
        return await self._job(await self.engine.operator_suspend(request.id, request.reason))

    @grpc_errors
    async def ResumeJob(self, request, context):  # type: ignore[no-untyped-def]
        check_text("reason", request.reason, MAX_REASON)
        await self._own_job(request.id)
        return await self._job(await self.engine.operator_resume(request.id, request.reason))

    @grpc_errors
    async def MigrateJob(self, request, context):  # type: ignore[no-untyped-def]
        check_id("to_server", request.to_server)
        await self._own_job(request.id)
        return await self._job(await self.engine.operator_migrate(request.id, request.to_server))

    @grpc_errors
    @_few_at_once
    async def ListServers(self, request, context):  # type: ignore[no-untyped-def]
        loads = await self.core.list_servers()
        held = await self._checkpoints_held(loads)
        shown = await self._job_ids_shown(loads, held)
        return scheduler_pb2.ListServersResponse(
            servers=[server_to_pb(ld, self.core.host_memory_budget, shown, held.get(ld.server.name, ()))
                     for ld in loads],
            cluster_height=cluster_height(loads)
        )

    async def _server(self, name: str) -> common_pb2.Server:
        loads = await self.core.list_servers()
        held = await self._checkpoints_held(loads)
        shown = await self._job_ids_shown(loads, held)
        return next(server_to_pb(ld, self.core.host_memory_budget, shown, held.get(name, ()))
                    for ld in loads if ld.server.name == name)

    async def _checkpoints_held(self, loads: list[ServerLoad]) -> dict[str, list[str]]:
        """Draining server -> the queued jobs whose restore point is still a checkpoint there
        (the drain moves each off; `gandiva drain --wait` waits for them too)."""
        draining = [ld.server.name for ld in loads if ld.server.draining]
        if not draining:
            return {}
        async with self.core.tx(read=True) as s:
            return {name: [j.id for j in self.engine.drainer.held(await repo.checkpoints_held_for(s, name))]
                    for name in draining}

    async def _cordon(self, request: scheduler_pb2.CordonServerRequest, verb: str, cordon: bool,
                      drain: bool = False) -> common_pb2.Server:
        auth.require_operator(auth.current(), f"{verb} a server")
        check_id("server", request.server)
        check_text("reason", request.reason, MAX_REASON)
        await set_cordon(self.engine, request.server, cordon, request.reason, drain)
        return await self._server(request.server)

    @grpc_errors
    async def CordonServer(self, request, context):  # type: ignore[no-untyped-def]
        return await self._cordon(request, "cordon", True)

    @grpc_errors
    async def UncordonServer(self, request, context):  # type: ignore[no-untyped-def]
        return await self._cordon(request, "uncordon", False)

    @grpc_errors
    async def DrainServer(self, request, context):  # type: ignore[no-untyped-def]
        await self._cordon(request, "drain", True, drain=True)
        moves = await self.engine.drainer.next_pass(request.server)
        return scheduler_pb2.DrainServerResponse(
            server=await self._server(request.server),
            jobs=[scheduler_pb2.DrainedJob(job_id=m.job_id, action=m.action, note=m.note) for m in moves])

    @grpc_errors
    async def ListProblems(self, request, context):  # type: ignore[no-untyped-def]
        # Every user's jobs and the servers' state: an operator's view, as /api/state is.
        auth.require_operator(auth.current(), "listing the cluster's problems (gandiva get problems)")
        facts = await problems.gather(self.core, self.engine)
        return scheduler_pb2.ListProblemsResponse(
            problems=[scheduler_pb2.Problem(**p.as_dict()) for p in problems.find(facts)], at=facts.now)

    @grpc_errors
    @_few_at_once
    async def GetUsage(self, request, context):  # type: ignore[no-untyped-def]
        check_text("user", request.user, 128)
        ident = auth.current()
        user: str | None = request.user or None
        if not ident.sees_all:  # as ListJobs: a user's token accounts for its own jobs
            if user not in (None, ident.name):
                raise auth.PermissionDenied(f"user: you may see only your own usage ({ident.name})")
            user = ident.name
        got = await usage.gather(self.core, request.since, request.until, user, request.by_job, request.limit,
                                 self.core.clock())
        # 10,000 job rows of 256-byte names, or 20,000 users of 128-byte names, were more than a
        # client takes (4 MiB): the lists share PAGE_BYTES, the rest counted.
        jobs, used = _within_bytes(got.jobs, paging.PAGE_BYTES)  # asked for by_job: they come first
        users, _ = _within_bytes(got.users, paging.PAGE_BYTES - used)
        return scheduler_pb2.GetUsageResponse(
            since=got.since, until=got.until, users=users, total=scheduler_pb2.Usage(**got.total.as_dict()),
            jobs=jobs, jobs_not_listed=got.jobs_not_listed + len(got.jobs) - len(jobs),
            users_not_listed=len(got.users) - len(users), oldest_kept=got.oldest_kept,
            capacity_gpu_seconds=got.capacity_gpu_seconds, busy_gpu_seconds=got.busy_gpu_seconds,
            capacity_kept_since=got.capacity_kept_since)

    @grpc_errors
    @_few_at_once
    async def ListPlacements(self, request, context):  # type: ignore[no-untyped-def]
        check_text("server", request.server, 128)
        check_text("job_id", request.job_id, 64)
        ident = auth.current()
        if request.job_id:  # NOT_FOUND for an id no job has (a typo read as "it held no GPU")
            await (self.core.get_job(request.job_id) if ident.sees_all else self._own_job(request.job_id))
        gpu = request.gpu if request.HasField("gpu") else -1  # unset: every GPU (0 is GPU 0)
        if gpu < -1:
            raise InvalidArgument("gpu", f"{request.gpu}: a GPU index, 0 or more (unset: every GPU)")
        if not 0 <= request.limit <= holds.LISTED_MAX:
            raise InvalidArgument("limit", f"{request.limit}: 0 to {holds.LISTED_MAX} (0: {holds.LISTED})")
        since, until = holds.check_period(request.since, request.until, self.core.clock())
        got, kept = await self.core.read_sync(lambda s: (
            holds.read(s, since, until, request.server, gpu, request.job_id, request.limit or holds.LISTED),
            holds.kept_since(s)))
        mine: set[str] | None = None  # (an operator's: all shown)
        if not ident.sees_all:  # as ListServers: another user's job is hidden-N, its GPU still shown held
            async with self.core.tx(read=True) as s:
                mine = await repo.own_jobs(s, ident.name, {h.job_id for h in got.holds})
        out, cut = placements_pb(got.holds, mine, paging.PAGE_BYTES)
        return scheduler_pb2.ListPlacementsResponse(since=since, until=until, placements=out,
                                                    more=got.more or cut, kept_since=kept)

    async def _job_ids_shown(self, loads: list[ServerLoad],
                             held: dict[str, list[str]] | None = None) -> Callable[[str], str]:
        """What the caller sees of each placed job's id. Another user's ids are as hidden
        here as in ListJobs: each is listed as "hidden-N" (numbered within one answer, so a
        job on several GPUs still counts once), which keeps the GPUs' occupancy visible."""
        ident = auth.current()
        if ident.sees_all:
            return str
        placed = {job for ld in loads for ids in ld.jobs_by_gpu.values() for job in ids}
        placed |= {job for ids in (held or {}).values() for job in ids}
        async with self.core.tx(read=True) as s:
            mine = await repo.own_jobs(s, ident.name, placed)
        aliases: dict[str, str] = {}
        return lambda job: job if job in mine else aliases.setdefault(job, f"{auth.HIDDEN_JOB}{len(aliases) + 1}")

    @staticmethod
    def _event_filter(kinds: Sequence[str], server: str) -> tuple[list[str], str]:
        """``kinds`` and ``server`` of an events request, checked."""
        if len(kinds) > MAX_KINDS:
            raise InvalidArgument("kinds", f"{len(kinds)} kinds; at most {MAX_KINDS}")
        for kind in kinds:
            check_id("kinds", kind)
        check_text("server", server, 64)
        return list(kinds), server

    async def _events(self, after: int, job_id: str, limit: int, user: str | None,
                      kinds: list[str], server: str) -> Sequence[Event]:
        async with self.core.tx(read=True) as s:
            return await repo.list_events(s, after, job_id, limit, user, kinds, server)

    async def _event_scope(self, job_id: str) -> str | None:
        """The user whose jobs' events the caller may see (None: all)."""
        check_text("job_id", job_id, 64)
        ident = auth.current()
        if job_id:  # NOT_FOUND for an id no job has (a typo was an empty list, or a silent watch)
            await self._own_job(job_id) if not ident.sees_all else await self.core.get_job(job_id)
        return None if ident.sees_all else ident.name

    @grpc_errors
    @_few_at_once
    async def ListEvents(self, request, context):  # type: ignore[no-untyped-def]
        size = paging.page_size(request.page_size, request.limit, EVENTS_PAGE, EVENTS_PAGE_MAX)
        after = paging.event_cursor(request.page_token, request.after_id)
        kinds, server = self._event_filter(request.kinds, request.server)
        user = await self._event_scope(request.job_id)
        if request.since:
            if not 0 <= request.since < float("inf"):  # NaN included
                raise InvalidArgument("since", f"{request.since}: a unix time, 0 or more (0: from the first event)")
            async with self.core.tx(read=True) as s:
                after = max(after, await repo.events_before(s, request.since))
        upto: int | None = None  # the last event id before `until`
        if request.until:
            if not 0 < request.until < float("inf"):  # NaN included
                raise InvalidArgument("until", f"{request.until}: a unix time, more than 0 (0: no end)")
            async with self.core.tx(read=True) as s:
                upto = await repo.events_before(s, request.until)
        events = await self._events(after, request.job_id, size, user, kinds, server)
        full = len(events) == size
        if upto is not None and events and events[-1].id >= upto:  # the period ends in this page
            events, full = [e for e in events if e.id <= upto], False
        out, last = paging.fill(events, event_to_pb, full=full)
        await self._hide_others(events=out)
        return scheduler_pb2.ListEventsResponse(
            events=out, next_page_token=paging.encode(last.id) if last is not None else ""
        )

    @grpc_stream_errors
    async def WatchEvents(  # type: ignore[no-untyped-def, override]
        self, request, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        kinds, server = self._event_filter(request.kinds, request.server)
        user = await self._event_scope(request.job_id)
        ident = auth.current()
        caller = f"{ident.role} {ident.name}" if ident.name else "every caller together (no --auth token)"
        if self._watches[caller] >= MAX_WATCHES:
            raise ResourceExhausted(
                f"{MAX_WATCHES} event watches are open already for {caller} (`gandiva get events -w`, "
                "`gandiva wait`); close one before opening another")
        self._watches[caller] += 1
        try:
            async for event in self._watch(request, user, kinds, server):
                yield event
        finally:
            self._watches[caller] -= 1
            if not self._watches[caller]:
                del self._watches[caller]

    async def _watch(self, request: scheduler_pb2.WatchEventsRequest, user: str | None, kinds: list[str],
                     server: str) -> AsyncIterator[common_pb2.Event]:
        bus = self.core.events
        seen_version = bus.version
        last = request.after_id if request.after_id >= 0 else await self.core.last_event_id()
        while True:
            # The newest id known before the read: one past it afterwards is news.
            known = await bus.newest_id(self.core.last_event_id)
            # Only the messages are kept, and each let go once sent: a client that reads
            # nothing leaves this generator at a `yield` for as long as it stays, and it held
            # the batch's database rows too (about 1 MB a watch; now 0.24-0.38 MB).
            shown = [event_to_pb(ev) for ev in
                     await self._events(last, request.job_id, WATCH_BATCH, user, kinds, server)]
            read = len(shown)
            await self._hide_others(events=shown)
            shown.reverse()
            while shown:
                msg = shown.pop()
                last = msg.id
                yield msg
            while read < WATCH_BATCH:  # (a full one: more are waiting)
                # Woken by this scheduler's commits; each second also asks (through one read
                # shared by every watcher) whether another process wrote events.
                version = await bus.wait(seen_version, 1.0)
                if version != seen_version:
                    seen_version = version
                    break
                if await bus.newest_id(self.core.last_event_id) > known:
                    break
