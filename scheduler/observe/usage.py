"""Accounting over a period: who had the GPUs and who waited (`gandiva get usage`, the
``GetUsage`` call).

Worked out from what the database keeps of every job: its submission, its first start
(``started_at``) and its state changes (the ``transitions`` table, one row per change, with
its time). A job's time in each state is cut to the period; its GPU time there is its time
training (RUNNING, and moved while running: ``trains``) times the GPUs it asked for, as `gandiva get users` and the job's ``gpu_seconds``
count it (a grown job's extra GPUs are not counted; two packed jobs each count their GPU).

Only the state changes from the period's start on are read: the state a job was in when the
period began is the from-state of its first change after that (or its state now, with none),
so a week's accounting reads that week's changes, not a year's. It is worked out in one read
transaction on a reader thread (``read_sync``), off the scheduler's event loop.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from scheduler.errors import InvalidArgument
from scheduler.lifecycle import trains
from scheduler.state.models import GpuHold, Job, ServerSpan, Transition

CHUNK = 500  # jobs whose state changes are read in one query
JOBS_LISTED, JOBS_LISTED_MAX = 1000, 10000
_TIMED = ("RUNNING", "QUEUED", "SUSPENDED", "MIGRATING")  # the states whose time is counted
_TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")


@dataclass(frozen=True)
class JobFacts:
    """What the accounting needs of one job (a row of ``jobs``)."""

    id: str
    name: str
    user: str
    gpus: int
    state: str  # now
    submitted_at: float
    started_at: float  # its first start (0: never)
    finished_at: float  # 0: not ended


@dataclass
class Usage:
    """One user's, one job's or everyone's share of a period; times in seconds within it."""

    user: str = ""
    job_id: str = ""
    name: str = ""
    gpus: int = 0
    state: str = ""
    jobs: int = 0
    gpu_seconds: float = 0.0
    queued_seconds: float = 0.0
    suspended_seconds: float = 0.0
    migrating_seconds: float = 0.0
    started: int = 0
    wait_seconds: float = 0.0
    wait_max_seconds: float = 0.0
    waiting: int = 0
    waiting_max_seconds: float = 0.0
    ended: int = 0
    submitted_at: float = 0.0
    started_at: float = 0.0
    # Time running on each GPU it held (the GPUs' history, gpu_holds): a grown job's extra GPUs
    # counted, a GPU shared by jobs running at once (packed) split between them.
    held_gpu_seconds: float = 0.0

    def add(self, other: Usage) -> None:
        """Sum ``other`` (a job's or a user's) into this one."""
        for name in ("jobs", "gpu_seconds", "queued_seconds", "suspended_seconds", "migrating_seconds",
                     "started", "wait_seconds", "waiting", "ended", "held_gpu_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wait_max_seconds = max(self.wait_max_seconds, other.wait_max_seconds)
        self.waiting_max_seconds = max(self.waiting_max_seconds, other.waiting_max_seconds)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    since: float
    until: float
    users: list[Usage]
    total: Usage
    jobs: list[Usage] = field(default_factory=list)
    jobs_not_listed: int = 0
    oldest_kept: float = 0.0
    # The cluster over the period (every job's report only, not one user's): GPUs of the
    # servers up x time (server_spans), and GPU time with at least one job running.
    capacity_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    capacity_kept_since: float = 0.0  # when the servers' history begins (0: none kept)


def running_stretches(job: JobFacts, changes: Sequence[tuple[str, str, float]], since: float,
                      until: float) -> list[tuple[float, float]]:
    """The stretches of [since, until] in which ``job`` trained (``trains``: RUNNING, or moved
    while running; ``changes`` as job_usage's)."""
    out: list[tuple[float, float]] = []
    at, state, came = max(since, job.submitted_at), (changes[0][0] if changes else job.state), ""
    for before, to_state, when in changes:
        if when >= until:
            break
        if trains(state, came, to_state) and when > at:
            out.append((at, when))
        at, state, came = max(at, when), to_state, before
    if trains(state, came, "") and until > at:
        out.append((at, until))
    return out


def shared_out(on_gpus: dict[tuple[str, int], list[tuple[float, float, str]]]) -> tuple[dict[str, float], float]:
    """Per job, its running time on the GPUs it held, a stretch shared by n jobs running on one
    GPU at once counting 1/n to each; and the GPU time with at least one job running."""
    held: dict[str, float] = {}
    busy = 0.0
    for stretches in on_gpus.values():
        stretches.sort()
        if all(b[0] >= a[1] for a, b in itertools.pairwise(stretches)):  # one at a time: most GPUs
            for a, b, job in stretches:
                held[job] = held.get(job, 0.0) + (b - a)
                busy += b - a
            continue
        # A sweep over the stretches' ends and starts (an end before a start at one time):
        # a week of a GPU time-sliced every minute is 20,000 stretches.
        marks = sorted([(a, 1, job) for a, _, job in stretches] + [(b, -1, job) for _, b, job in stretches])
        running: dict[str, int] = {}
        for (t0, step, job), (t1, _, _) in itertools.pairwise(marks):
            running[job] = running.get(job, 0) + step
            if not running[job]:
                del running[job]
            if running and t1 > t0:
                busy += t1 - t0
                for each in running:
                    held[each] = held.get(each, 0.0) + (t1 - t0) / len(running)
    return held, busy


def job_usage(job: JobFacts, changes: Sequence[tuple[str, str, float]], since: float, until: float,
              moves_train: bool = True) -> Usage:
    """``job``'s share of [since, until]. ``changes``: its state changes (from, to, at) in the
    order they happened, every one at or after ``since`` (earlier ones are not needed: the
    first one's from-state is the state the job was in at ``since``). ``moves_train``: its GPU
    time counts its moves while running (``trains``); else its time RUNNING only."""
    usage = Usage(user=job.user, job_id=job.id, name=job.name, gpus=job.gpus,
                  submitted_at=job.submitted_at, started_at=job.started_at)
    start = max(since, job.submitted_at)
    if start >= until or (job.finished_at and job.finished_at < since):
        return usage
    usage.jobs = 1
    spent = dict.fromkeys(_TIMED, 0.0)  # seconds per state (a long history: no attribute lookups)
    trained = 0.0  # of which it trained (``trains``)
    at, state, came = start, (changes[0][0] if changes else job.state), ""
    for before, to_state, when in changes:
        if when >= until:  # it stayed in ``state`` through the period's end
            break
        if when > at:
            spent[state] = spent.get(state, 0.0) + (when - at)
            trained += (when - at) if trains(state, came if moves_train else "", to_state) else 0.0
            at = when
        state, came = to_state, before
        if to_state in _TERMINAL:
            usage.ended += 1
    if until > at:
        spent[state] = spent.get(state, 0.0) + (until - at)  # an ended job's is not counted below
        trained += (until - at) if trains(state, came if moves_train else "", "") else 0.0
    usage.gpu_seconds = trained * job.gpus
    usage.queued_seconds, usage.suspended_seconds = spent["QUEUED"], spent["SUSPENDED"]
    usage.migrating_seconds = spent["MIGRATING"]
    usage.state = state
    if job.started_at and since <= job.started_at < until:
        usage.started = 1
        usage.wait_seconds = usage.wait_max_seconds = max(0.0, job.started_at - job.submitted_at)
    elif state == "QUEUED" and not (job.started_at and job.started_at < until):
        usage.waiting = 1
        usage.waiting_max_seconds = until - job.submitted_at
    return usage


def summarise(rows: Iterable[Usage], since: float, until: float, by_job: bool, limit: int) -> Report:
    """Per user (most GPU time first, then the name), everyone's total, and with ``by_job``
    the ``limit`` jobs of most GPU time (then most time queued)."""
    users: dict[str, Usage] = {}
    total = Usage()
    counted = [row for row in rows if row.jobs]
    for row in counted:
        users.setdefault(row.user, Usage(user=row.user)).add(row)
        total.add(row)
    report = Report(since, until, sorted(users.values(), key=lambda u: (-u.gpu_seconds, -u.queued_seconds, u.user)),
                    total)
    if by_job:
        ordered = sorted(counted, key=lambda u: (-u.gpu_seconds, -u.queued_seconds, u.submitted_at, u.job_id))
        report.jobs = [replace(row) for row in ordered[:limit]]
        report.jobs_not_listed = max(0, len(ordered) - limit)
    return report


def check_period(since: float, until: float, now: float) -> tuple[float, float]:
    """(since, until) as the accounting takes them: until 0 or later than now is now."""
    if not (math.isfinite(since) and since > 0):
        raise InvalidArgument("since", f"the period's start must be a time (unix seconds more than 0), got {since}")
    if not (math.isfinite(until) and until >= 0):
        raise InvalidArgument("until", f"must be a time (unix seconds, 0: now), got {until}")
    until = now if not until or until > now else until
    if since >= until:
        raise InvalidArgument("since", f"the period starts at {utc_text(since)}, not before its end ({utc_text(until)}"
                                       f"{', now' if until == now else ''}): give a start before the end")
    return since, until


def utc_text(at: float) -> str:
    """A unix time as a person reads it, in UTC (a number far past year 5000 as given)."""
    if at < 1e11:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    return f"{at:.0f}" if at < 1e15 else f"{at:.3g}"  # 1e308 in 309 digits was no help


async def gather(core: Any, since: float, until: float, user: str | None, by_job: bool, limit: int,
                 now: float) -> Report:
    """The usage report of [since, until] (checked by check_period), worked out in one read
    transaction off the event loop (``core.read_sync``: a reader thread on SQLite)."""
    since, until = check_period(since, until, now)
    if limit < 0:
        raise InvalidArgument("limit", f"must be 0 (the default, {JOBS_LISTED}) or more, got {limit}")
    limit = min(limit or JOBS_LISTED, JOBS_LISTED_MAX)
    return cast(Report, await core.read_sync(lambda s: report(s, since, until, user, by_job, limit)))


def report(session: Session, since: float, until: float, user: str | None, by_job: bool, limit: int) -> Report:
    """The report, read through ``session``: the jobs alive in the period, then their state
    changes from ``since`` on, a chunk of jobs at a time."""
    alive = (Job.submitted_at < until) & or_(Job.finished_at == 0, Job.finished_at >= since)
    if user is not None:
        alive = alive & (Job.user == user)
    conn = session.connection()  # Core rows: the ORM's row loading was a fifth of the time
    jobs = [JobFacts(*row) for row in conn.execute(
        select(Job.id, Job.name, Job.user, Job.gpus, Job.state, Job.submitted_at, Job.started_at,
               Job.finished_at).where(alive))]
    oldest = conn.execute(select(func.min(Job.submitted_at))).scalar() or 0.0
    rows: list[Usage] = []
    on_gpus: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for first in range(0, len(jobs), CHUNK):
        chunk = jobs[first:first + CHUNK]
        changes = _running_on_gpus(conn, chunk, since, until, on_gpus)
        rows.extend(job_usage(j, changes.get(j.id, ()), since, until) for j in chunk)
    if user is not None and on_gpus:
        # Another user's jobs running on the same GPUs at once share them too: left out with
        # their rows, one user's report gave a GPU packed with another user's job wholly to
        # hers (twice what everyone's report gave it).
        mine, keys = {j.id for j in jobs}, set(on_gpus)
        others = sorted({job_id for job_id, server, gpu in conn.execute(
            select(GpuHold.job_id, GpuHold.server_name, GpuHold.gpu_index)
            .where(GpuHold.server_name.in_({server for server, _ in keys}), GpuHold.start_at < until,
                   or_(GpuHold.end_at.is_(None), GpuHold.end_at > since))).all()
            if (server, gpu) in keys and job_id not in mine})
        for first in range(0, len(others), CHUNK):
            _running_on_gpus(conn, [JobFacts(*row) for row in conn.execute(
                select(Job.id, Job.name, Job.user, Job.gpus, Job.state, Job.submitted_at, Job.started_at,
                       Job.finished_at).where(Job.id.in_(others[first:first + CHUNK])))], since, until, on_gpus)
    shares, busy = shared_out(on_gpus)
    for row in rows:
        row.held_gpu_seconds = shares.get(row.job_id, 0.0)
    got = summarise(rows, since, until, by_job, limit)
    got.oldest_kept = float(oldest)
    if user is None:  # the cluster's figures: every job's report only
        got.busy_gpu_seconds = busy
        got.capacity_gpu_seconds, got.capacity_kept_since = capacity(conn, since, until)
    return got


def _running_on_gpus(conn: Any, chunk: Sequence[JobFacts], since: float, until: float,
                     on_gpus: dict[tuple[str, int], list[tuple[float, float, str]]],
                     ) -> dict[str, list[tuple[str, str, float]]]:
    """The ``chunk``'s state changes from ``since`` on (returned), and the stretches of [since,
    until] each of its jobs ran on each GPU it held, added to ``on_gpus``."""
    ids = [j.id for j in chunk]
    changes: dict[str, list[tuple[str, str, float]]] = {}
    for job_id, from_state, to_state, at in conn.execute(
            select(Transition.job_id, Transition.from_state, Transition.to_state, Transition.at)
            .where(Transition.job_id.in_(ids), Transition.at >= since)
            .order_by(Transition.job_id, Transition.id)).all():  # fetched at once, not row by row
        changes.setdefault(job_id, []).append((from_state, to_state, at))
    held: dict[str, list[tuple[str, int, float, float]]] = {}
    for job_id, server, gpu, start, end in conn.execute(
            select(GpuHold.job_id, GpuHold.server_name, GpuHold.gpu_index, GpuHold.start_at, GpuHold.end_at)
            .where(GpuHold.job_id.in_(ids), GpuHold.start_at < until,
                   or_(GpuHold.end_at.is_(None), GpuHold.end_at > since))).all():
        held.setdefault(job_id, []).append((server, gpu, start, until if end is None else end))
    for j in chunk:
        if j.id not in held:
            continue
        for a, b in running_stretches(j, changes.get(j.id, ()), since, until):
            for server, gpu, start, end in held[j.id]:
                if max(a, start) < min(b, end):
                    on_gpus.setdefault((server, gpu), []).append((max(a, start), min(b, end), j.id))
    return changes


def capacity(conn: Any, since: float, until: float) -> tuple[float, float]:
    """GPUs of the servers up x time over [since, until] (server_spans), and when that history
    begins (0: none kept)."""
    total = 0.0
    for gpus, start, end in conn.execute(
            select(ServerSpan.gpus, ServerSpan.start_at, ServerSpan.end_at)
            .where(ServerSpan.start_at < until, or_(ServerSpan.end_at.is_(None), ServerSpan.end_at > since))).all():
        total += gpus * max(0.0, (until if end is None else min(until, end)) - max(since, start))
    first = conn.execute(select(ServerSpan.start_at).order_by(ServerSpan.id).limit(1)).scalar()
    return total, float(first or 0.0)
