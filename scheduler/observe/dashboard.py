"""The scheduler's HTTP routes: ``/metrics``, the dashboard page ``/`` and its JSON.

``/api/state``     servers with their GPUs (who runs and who waits on each, the height),
                   the jobs (state, mini-batches, rate, the last decision's reason) and
                   the latest decisions
``/api/decisions`` the decision log, ``?after=ID`` for the ones after ID, ``?since=SECONDS`` (and/or
                   ``&job=ID``) those of the last SECONDS, each with its outcome
``/api/timeline``  per GPU, segments of what ran and what waited, ``?since=SECONDS_AGO``
``/api/usage``     per user over the last 24 hours: GPU time, time queued, waits to start
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Generic, TypeVar

from scheduler import timeline
from scheduler.alone import SLOW_AGAINST_ALONE, against_alone
from scheduler.errors import GandivaError, NotFound, Unauthenticated, Unavailable
from scheduler.eta import Sharer, estimate, eta_text, progress_text
from scheduler.lifecycle import JobState
from scheduler.observe import holds, problems, sharing, usage
from scheduler.observe.http import Guard, Handler, Response, prometheus_route
from scheduler.observe.metrics import DB_WAIT_S, SchedulerMetrics

QUERY_MAX = 2**53  # the largest whole number JSON (and a browser) carries exactly
# /api/state and /metrics are built at most once in this long, however many clients ask (the
# page polls every 2 s, Prometheus every 10-15 s): see Shared.
SHARED_S = 1.0
# /api/usage: the period it covers, how long one answer is served, the users it lists.
USAGE_PERIOD_S, USAGE_KEEP_S, USAGE_USERS = 86400.0, 30.0, 20

T = TypeVar("T")


class Shared(Generic[T]):
    """What ``build`` returns, made at most once every ``every_s`` however many requests ask,
    and never before a request came: each request gets the first build that begins after it
    arrived, which every request waiting then shares (one at a time; up to ``every_s`` later
    than asked, never older). Each request built its own: 16 clients polling /api/state back
    to back (2,000 queued jobs) kept the event loop building views, and a user's GetJob took
    547 ms at the median instead of 11. A request that goes away does not cancel a build
    others wait for."""

    def __init__(self, build: Callable[[], Awaitable[T]], every_s: float = SHARED_S) -> None:
        self._build, self._every_s = build, every_s
        self._task: asyncio.Future[T] | None = None  # the build begun last
        self._began = -math.inf

    async def get(self) -> T:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        while True:
            task = self._task
            if task is not None and self._began >= arrived:
                return await asyncio.shield(task)  # begun since this request came: shared
            if task is not None and not task.done():
                await asyncio.wait({task})  # begun before it: one at a time
                continue
            if (wait := self._began + self._every_s - loop.time()) > 0:
                await asyncio.sleep(wait)  # (the request waits, not a task of its own)
                continue
            self._began = loop.time()
            task = self._task = asyncio.ensure_future(self._build())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, whoever waits
            return await asyncio.shield(task)


_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?(e[0-9]+)?", re.ASCII | re.IGNORECASE)


def _int(query: Mapping[str, str], name: str, default: int) -> int:
    """A query parameter that is a whole number from 0 to QUERY_MAX; ValueError says what was given."""
    raw = query.get(name, "")
    if not raw:
        return default
    # ASCII digits (a decimal point allowed), as documented: float() also takes "1_000",
    # "+5", " 5" and other scripts' digits.
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not 0 <= value <= QUERY_MAX:  # NaN, infinities and negatives included
        raise ValueError(f"?{name}={raw!r} is not a number from 0 to {QUERY_MAX}")
    return int(value)


def gpu_mode(states: Sequence[str]) -> str:
    """How a GPU is shared, from the states of the jobs placed on it: idle, running (one
    job), packed (several at once), time-sliced (jobs take turns), packed+time-sliced; or,
    with nothing running and no one to take turns with, what its one job does: migrating
    (leaving it, or a grow or shrink), suspended (held by an operator, or its partner just
    ended). Before, every job not running counted as one waiting for its turn, so a GPU
    whose only job was migrating or held read "time-sliced"."""
    running = sum(s == JobState.RUNNING.value for s in states)
    turns = sum(s == JobState.SUSPENDED.value for s in states)
    if not states:
        return "idle"
    if turns and running + turns > 1:
        return "time-sliced" if running <= 1 else "packed+time-sliced"
    if running:
        return "packed" if running > 1 else "running"
    if JobState.MIGRATING.value in states:
        return "migrating"
    return "suspended" if turns else "waiting"


# Finished jobs the dashboard lists (the most recent); unfinished ones are all listed but
# the queue, of which the first QUEUED_LISTED (in submission order) and the count of the rest:
# with 20,000 queued, each /api/state (8 MB, every 2 s per open page and `gandiva top`) held
# the event loop for 2.7-8 s, and a user's GetJob waited up to 3 s behind it.
RECENT_FINISHED = 100
QUEUED_LISTED = 1000


async def cluster_state(core: Any, metrics: SchedulerMetrics) -> dict[str, Any]:
    """The whole view: what /api/state returns and `gandiva top` shows."""
    from sqlalchemy import func, select

    from scheduler.core import JobDetail
    from scheduler.state import repo
    from scheduler.state.models import Job

    # One read transaction for the servers, the unfinished jobs (with their GPUs) and
    # the most recently finished ones.
    async with core.tx(read=True) as s:
        loads = await repo.server_loads(s)
        live = list(await repo.list_jobs(s, [st for st in JobState if not st.terminal and st is not JobState.QUEUED]))
        queued = await repo.list_jobs(s, [JobState.QUEUED], limit=QUEUED_LISTED)
        not_listed = 0
        if len(queued) == QUEUED_LISTED:
            not_listed = (await s.scalar(select(func.count()).select_from(Job).where(
                Job.state == JobState.QUEUED.value)) or 0) - QUEUED_LISTED
        live = sorted(live + list(queued), key=lambda j: (j.submitted_at, j.array_index, j.id))
        placements = await repo.placements_of(s, [j.id for j in live])
        finished = (await s.scalars(
            select(Job).where(Job.state.in_([st.value for st in JobState if st.terminal]))
            .order_by(Job.finished_at.desc()).limit(RECENT_FINISHED))).all()
    jobs = [JobDetail(j, [(p.server_name, p.gpu_index) for p in placements.get(j.id, [])]) for j in live]
    jobs += [JobDetail(j, []) for j in reversed(finished)]
    now = core.clock()
    alone_rates = core.alone_rates.latest  # (one look's, whole)
    by_id = {d.job.id: d for d in jobs}
    last = metrics.log.last_for()
    servers: list[dict[str, Any]] = []
    for ld in loads:
        gpus = []
        for g in sorted(ld.gpus, key=lambda g: g.index):
            placed = ld.jobs_by_gpu.get(g.index, [])
            entries = []
            for jid in placed:
                d = by_id.get(jid)
                entries.append({"id": jid, "name": d.job.name if d else "", "state": d.job.state if d else ""})
            gpus.append({
                "index": g.index, "model": g.model, "utilization": g.utilization,
                "memory_used": g.memory_used, "memory_total": g.memory_total,
                "jobs": entries, "mode": gpu_mode([e["state"] for e in entries]),
            })
        servers.append({"name": ld.server.name, "up": ld.server.up, "gpus": gpus,
                        # gandiva cordon / drain: no new job goes there (draining: its jobs leave).
                        "cordoned": ld.server.cordoned, "draining": ld.server.draining,
                        "cordon_reason": ld.server.cordon_reason,
                        "height": ld.height, "allocated": ld.allocated, "affinity": ld.affinity,
                        "host_memory": ld.server.host_memory_bytes,
                        "host_memory_used": ld.host_used(core.host_memory_budget[1])})
    # Who shares each GPU, for the ETAs (scheduler/eta.py).
    on_gpu = {(ld.server.name, index): [Sharer(i, by_id[i].job.state, by_id[i].job.priority, by_id[i].job.held)
                                        for i in ids if i in by_id]
              for ld in loads for index, ids in ld.jobs_by_gpu.items()}
    out_jobs = []
    for d in jobs:
        j = d.job
        # A queued job's word is its message (why it waits: the policy's reason, or a start
        # deferred until its GPUs are left): the page showed "place: ..." for a job whose
        # start had been put off, or a decision about an earlier launch of a re-queued job.
        # So is an ended one's (finished, killed and by whom, why it failed): it showed the
        # last decision while it ran ("suspend: time slice of 10s over" for a job SUCCEEDED,
        # "migrate: unpack onto idle GPUs" for one that finished before the move).
        dec = None if j.state == JobState.QUEUED.value or JobState(j.state).terminal else last.get(j.id)
        first = d.placement[0] if d.placement else None
        alone = None if JobState(j.state).terminal else alone_rates.get(j.id)
        ratio = against_alone(j.state == JobState.RUNNING.value, j.rate, alone)
        eta_s, eta_note = estimate(j, f"{first[0]}/{first[1]}" if first else "", on_gpu.get(first, []) if first else [],
                                   len(d.placement))
        out_jobs.append({
            "id": j.id, "name": j.name, "state": j.state, "gpus": j.gpus, "priority": j.priority,
            "placement": [f"{server}/{index}" for server, index in d.placement],
            "steps": j.steps, "rate": j.rate, "metrics": dict(j.metrics or {}),
            "alone_rate": alone, "against_alone": ratio,
            "slow": ratio is not None and ratio < SLOW_AGAINST_ALONE,
            "total_steps": j.total_steps or 0, "total_steps_from": j.total_steps_from or "",
            "progress": progress_text(j.steps, j.total_steps or 0),
            "eta_s": None if eta_s < 0 else eta_s, "eta_note": eta_note, "eta": eta_text(eta_s, eta_note),
            "user": j.user, "gpu_seconds": j.gpu_seconds(now),
            "message": j.message, "wait": core.wait_of(j),
            "submitted_at": j.submitted_at, "finished_at": j.finished_at,
            "multi_job": j.multi_job_id or "", "grow_shrink": j.grow_shrink,
            "last_decision": ({"kind": dec.kind, "reason": dec.reason, "at": dec.at} if dec else None),
        })
    height = max((s["height"] for s in servers), default=0)
    return {"now": now, "height": height, "overloaded": height > 1, "servers": servers,
            "jobs": out_jobs, "queued_not_listed": max(0, not_listed),
            "gpu_time": metrics.timeline.split(now - GPU_TIME_S, now),
            "decisions": metrics.log.after(max(0, metrics.log.last_id - 30))}


_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
GPU_TIME_S = 3600.0  # /api/state's gpu_time: how the GPUs' time was spent over the last hour


async def job_timeline(core: Any, job_id: str) -> dict[str, Any]:
    """One job's decisions in time order, as `gandiva describe job` shows its History: each
    state change with its reason (a suspend or move with the rate it ran at) and each packing
    trial's verdict (the rates it was judged by). NotFound for an unknown job."""
    from scheduler.state import repo

    async with core.tx(read=True) as s:
        job = await repo.get_job(s, job_id)
        changes = list(reversed((await s.scalars(repo.history_q(job_id))).all()))  # as GetJob's
        # Its packing verdicts, and its moves' events (a move that did not move it: ``move_record``).
        events = await repo.list_events(s, job_id=job_id, kinds=[timeline.PACK_VERDICT, "job.migration"])
        # Where it ran: each GPU it held and when (the GPUs' history, since session 49).
        held = (await s.run_sync(lambda sync: holds.jobs_gpus(sync, [job_id]))).get(job_id, [])
    rows = [{"at": x.at, "kind": kind, "from": x.from_state, "to": x.to_state, "reason": x.reason}
            if kind == "state" else {"at": x.at, "kind": kind, "from": "", "to": "", "reason": x.message}
            for kind, x in timeline.merged(changes, events)]
    # What sharing did to it, over the changes shown (all of them, or its latest MAX_HISTORY).
    since = changes[0].at if len(changes) >= repo.MAX_HISTORY else job.submitted_at
    summed = sharing.summary(job.id, job.gpus, since, job.finished_at or core.clock(), [
        ("state", r["at"], f"{r['from']} -> {r['to']}: {r['reason']}") if r["kind"] == "state"
        else ("verdict", r["at"], r["reason"]) for r in rows] + [
        r for e in events if e.at >= since and (r := sharing.move_record(e.kind, e.at, e.message))])
    placements = [{"server": h.server, "gpu": h.gpu, "start_at": h.start_at, "end_at": h.end_at}
                  for h in held[-repo.MAX_HISTORY:]]
    return {"id": job.id, "name": job.name, "state": job.state, "timeline": rows, "sharing": summed,
            "placements": placements}


async def _names(core: Any, ids: list[str]) -> dict[str, str]:
    from scheduler.state import repo

    async with core.tx(read=True) as s:
        return {j.id: j.name for j in await repo.jobs_by_id(s, ids)}


# The page itself holds no data (it asks for an operator's token when the JSON does).
PUBLIC_PAGES = frozenset({"/", "/index.html"})


def operator_guard(authenticator: Any) -> Guard:
    """With --auth token, the JSON and /metrics (every user's job names, users, GPU time,
    messages) only for an operator's token, as `gandiva get jobs` shows them only to
    operators: without it anyone who reached the port read what each user's token hides."""

    async def guard(path: str, token: str) -> Response | None:
        if not token:
            return Response(401, b"this scheduler requires a token (--auth token): send an operator's as "
                                 b"'Authorization: Bearer TOKEN' (gandiva top: --token or GANDIVA_TOKEN)\n")
        try:
            ident = await authenticator.identify(token)
        except Unauthenticated as err:
            return Response(401, f"{err}\n".encode())
        except GandivaError as err:  # the database is down: say so, not "unauthenticated"
            return Response(503, f"cannot check the token now: {err}\n".encode())
        if ident.role != "operator":
            return Response(403, f"{path} shows every user's jobs: only an operator's token may read it "
                                 f"(this one is {ident.role} {ident.name}'s; use gandiva get jobs / "
                                 "describe for your own)\n".encode())
        return None

    return guard


def routes(core: Any, metrics: SchedulerMetrics, engine: Any | None = None) -> dict[str, Handler]:
    page = resources.files("scheduler.observe").joinpath("static/index.html").read_bytes()
    # What needs a person (`gandiva get problems`): in every answer, also a 503's (the
    # database's own problem, and the hung jobs and quarantines kept in memory).
    trouble = Shared(lambda: problems.gather(core, engine))

    async def problem_list() -> list[dict[str, Any]]:
        return [p.as_dict() for p in problems.find(await trouble.get())]

    async def index(_: Mapping[str, str]) -> Response:
        return Response(200, page, "text/html; charset=utf-8")

    views = Shared(lambda: asyncio.wait_for(cluster_state(core, metrics), DB_WAIT_S))

    async def state(_: Mapping[str, str]) -> Response:
        try:
            view = dict(await views.get())  # (shared: not changed in place)
        except (Unavailable, TimeoutError) as err:
            # The scheduler answers; what it cannot give is the database's view.
            health = core.db_health.as_dict()
            said = health["text"] or (str(err) if isinstance(err, Unavailable) else
                                      f"the scheduler is up; its database did not answer within {DB_WAIT_S:.0f}s")
            # (from memory: this answer has waited for the database once already)
            return Response.json({"now": core.clock(), "error": said, "database": health,
                                  "problems": [p.as_dict() for p in problems.find(problems.in_memory(core, engine))]},
                                 status=503)
        view["database"] = core.db_health.as_dict()
        view["problems"] = await problem_list()
        return Response.json(view)

    async def decisions(q: Mapping[str, str]) -> Response:
        try:
            after = _int(q, "after", 0)
            ago = _int(q, "since", 0)
        except ValueError as err:
            return Response(400, f"{err}\n".encode())
        job_id = q.get("job", "")
        if job_id and not _JOB_ID.fullmatch(job_id):
            return Response(400, b"?job= must name a job (its id, e.g. j-8d0de09391)\n")
        if ago or job_id:  # the last SECONDS (of one job): `gandiva top --decisions`
            now = core.clock()
            since = now - ago if ago else 0.0
            got = metrics.log.since(since, job_id)
            log = metrics.log
            # Records of the period dropped already (the log keeps its latest DECISION_LOG_SIZE).
            incomplete = log.last_id > len(log.records) and bool(log.records) and log.records[0].at > since
            return Response.json({"now": now, "since": since, "last": log.last_id, "kept": len(log.records),
                                  "incomplete": incomplete, "decisions": got})
        return Response.json({"last": metrics.log.last_id, "decisions": metrics.log.after(after)})

    async def timeline(q: Mapping[str, str]) -> Response:
        try:
            ago = _int(q, "since", 3600)
        except ValueError as err:
            return Response(400, f"{err}\n".encode())
        now = core.clock()
        gpus = metrics.timeline.export(now - ago)
        used = {j for segs in gpus.values() for s in segs for k in ("running", "waiting", "migrating") for j in s[k]}
        try:
            names = await asyncio.wait_for(_names(core, sorted(used)), DB_WAIT_S)
        except (Unavailable, TimeoutError):
            names = {}  # the timeline is in memory: served without the jobs' names
        return Response.json({"now": now, "since": now - ago, "gpus": gpus,
                              "gpu_time": metrics.timeline.split(now - ago, now),
                              "jobs": {j: names.get(j, "") for j in sorted(used)}})

    async def job(q: Mapping[str, str]) -> Response:
        job_id = q.get("id", "")
        if not _JOB_ID.fullmatch(job_id):
            return Response(400, b"?id= must name a job (its id, e.g. j-8d0de09391)\n")
        try:
            got = await asyncio.wait_for(job_timeline(core, job_id), DB_WAIT_S)
            # Its rate over the last hour against its rate alone (in memory: RateHistory).
            got["rates"] = metrics.rates.export(job_id)
            return Response.json(got)
        except NotFound:
            return Response(404, f"no job {job_id}\n".encode())
        except (Unavailable, TimeoutError) as err:
            said = core.db_health.as_dict()["text"] or str(err) or "its database did not answer"
            return Response.json({"error": said}, status=503)

    # The page's "GPU time by user" (the last 24 hours, as `gandiva get usage --since 24h`): a
    # whole period's state changes are read (seconds on a long history), so one answer serves
    # every page for USAGE_KEEP_S.
    kept: dict[str, Any] = {"at": -math.inf, "view": None}
    usage_lock = asyncio.Lock()

    async def usage_view(_: Mapping[str, str]) -> Response:
        async with usage_lock:
            loop = asyncio.get_running_loop()
            if kept["view"] is None or loop.time() - kept["at"] > USAGE_KEEP_S:
                now = core.clock()
                try:
                    got = await usage.gather(core, now - USAGE_PERIOD_S, 0, None, False, 0, now)
                except Unavailable as err:
                    return Response.json({"error": core.db_health.as_dict()["text"] or str(err)}, status=503)
                kept["view"] = {"since": got.since, "until": got.until, "total": got.total.as_dict(),
                                "users": [u.as_dict() for u in got.users[:USAGE_USERS]],
                                "users_not_listed": max(0, len(got.users) - USAGE_USERS)}
                kept["at"] = loop.time()
        return Response.json(kept["view"])

    refreshed = Shared(lambda: metrics.refresh(core))

    async def refresh() -> None:
        await refreshed.get()

    metrics.watch_health(core.db_health)

    return {"/": index, "/index.html": index, "/api/state": state, "/api/decisions": decisions,
            "/api/timeline": timeline, "/api/job": job, "/api/usage": usage_view,
            "/metrics": prometheus_route(metrics.registry, refresh)}
