"""Who held which GPU when: the per-GPU history kept in ``gpu_holds`` (since session 49).

The placements table says only who holds each GPU now. Every placement also opens a row of
``gpu_holds`` (its job, server, GPU and start) that its end closes (scheduler.state.repo
set_placement / clear_placement, in the transaction that changes the job's state), so that:

- `gandiva get placements --at 03:12 --server node-b` (the ``ListPlacements`` call) answers
  "which job was on GPU 3 of node-b at 03:12?", with what it was doing then (running, or
  suspended waiting for its time slice, or being moved): the job's state at that time is the
  to-state of its last change before it;
- the dashboard's per-GPU timeline, in the scheduler's memory, is drawn again from the
  database when the scheduler starts (it started empty), and the decisions read back have
  their GPUs (they had none).

A period's holds are read through the index on their end (``end_at``, NULL while held), so
the cost grows with the holds that ended since the period began, not with the history before
it; one GPU's (``--server``, ``--gpu``) through the index on (server, GPU, end).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from scheduler.errors import InvalidArgument
from scheduler.lifecycle import trains
from scheduler.observe.usage import CHUNK, utc_text
from scheduler.state.models import GpuHold, Job, Transition

LISTED, LISTED_MAX = 1000, 10000
# The timeline's slot of each state of a job holding a GPU (as Timeline.record's snapshot).
SLOTS = {"RUNNING": 0, "SUSPENDED": 1, "MIGRATING": 2}


@dataclass(frozen=True)
class Hold:
    """One GPU held by one job, from ``start_at`` to ``end_at`` (None: held now)."""

    job_id: str
    server: str
    gpu: int
    start_at: float
    end_at: float | None
    name: str = ""
    user: str = ""
    state_at: str = ""  # with an instant asked: the job's state then ("" otherwise)

    @property
    def gpu_name(self) -> str:
        return f"{self.server}/{self.gpu}"


@dataclass(frozen=True)
class Change:
    """One state change of a job (a row of ``transitions``)."""

    job_id: str
    at: float
    from_state: str
    to_state: str


@dataclass(frozen=True)
class Listing:
    since: float
    until: float
    holds: list[Hold]
    more: bool  # past ``limit``


def check_period(since: float, until: float, now: float) -> tuple[float, float]:
    """The period asked, checked: ``until`` 0 (or later than now) is now; ``since`` equal
    to ``until`` asks for one instant."""
    if not 0 < since < math.inf:  # NaN included
        raise InvalidArgument("since", f"{since}: a unix time, more than 0")
    if not 0 <= until < math.inf:
        raise InvalidArgument("until", f"{until}: a unix time, 0 or more (0: now)")
    until = min(until or now, now)
    if since > until:
        raise InvalidArgument("since", f"{utc_text(since)} is after the period's end ({utc_text(until)}"
                                       f"{', now: the history holds nothing later' if until == now else ''})")
    return since, until


def _overlapping(since: float, until: float) -> Any:
    """Holds that overlap [since, until] (an instant when they are equal): begun by its end,
    not ended before its start."""
    return (GpuHold.start_at <= until) & or_(GpuHold.end_at.is_(None), GpuHold.end_at > since)


def read(s: Session, since: float, until: float, server: str = "", gpu: int = -1, job_id: str = "",
         limit: int = LISTED) -> Listing:
    """The holds overlapping the period (an instant when ``since == until``, each with its
    job's state then), in order of their start, at most ``limit``."""
    q = (select(GpuHold.job_id, GpuHold.server_name, GpuHold.gpu_index, GpuHold.start_at, GpuHold.end_at,
                Job.name, Job.user)
         .join(Job, Job.id == GpuHold.job_id).where(_overlapping(since, until)))
    if server:
        q = q.where(GpuHold.server_name == server)
    if gpu >= 0:
        q = q.where(GpuHold.gpu_index == gpu)
    if job_id:
        q = q.where(GpuHold.job_id == job_id)
    rows = s.execute(q.order_by(GpuHold.start_at, GpuHold.server_name, GpuHold.gpu_index, GpuHold.id)
                     .limit(limit + 1)).all()
    holds = [Hold(*row) for row in rows[:limit]]
    if since == until:
        states = states_at(s, sorted({h.job_id for h in holds}), since)
        holds = [replace(h, state_at=states[h.job_id].lower()) for h in holds]  # RUNNING: running
    return Listing(since, until, holds, len(rows) > limit)


def kept_since(s: Session) -> float:
    """When the first hold kept began (0: none; by the primary key, not a scan): the
    history starts then (the upgrade to 0010_gpu_holds, or what `db prune --jobs` left)."""
    return float(s.scalar(select(GpuHold.start_at).order_by(GpuHold.id).limit(1)) or 0.0)


def states_at(s: Session, job_ids: Sequence[str], at: float) -> dict[str, str]:
    """Each job's state at ``at``: the to-state of its last change at or before it."""
    out: dict[str, str] = {}
    for job_id in job_ids:  # one indexed look-up each: the jobs on the GPUs of one instant
        state = s.scalar(select(Transition.to_state).where(Transition.job_id == job_id, Transition.at <= at)
                         .order_by(Transition.at.desc(), Transition.id.desc()).limit(1))
        out[job_id] = state or ""
    return out


def changes_since(s: Session, job_ids: Sequence[str], since: float) -> tuple[list[Change], dict[str, str]]:
    """The jobs' state changes from ``since`` on (oldest first) and each job's state now."""
    changes: list[Change] = []
    now_state: dict[str, str] = {}
    ids = list(job_ids)
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i:i + CHUNK]
        changes += [Change(*row) for row in s.execute(
            select(Transition.job_id, Transition.at, Transition.from_state, Transition.to_state)
            .where(Transition.job_id.in_(chunk), Transition.at >= since).order_by(Transition.id)).all()]
        now_state.update((str(r[0]), str(r[1])) for r in s.execute(select(Job.id, Job.state).where(Job.id.in_(chunk))))
    return changes, now_state


def segments(holds: Iterable[Hold], changes: Iterable[Change], now_state: dict[str, str],
             since: float, until: float) -> dict[str, list[list[Any]]]:
    """Per GPU ("server/index"), the timeline's segments over [since, until]: ``[t0, t1,
    running, waiting, migrating]`` (sorted job ids), one per stretch in which nothing changed
    on that GPU, as scheduler.observe.metrics.Timeline keeps them live. A job's state at
    ``since`` is the from-state of its first change after it (its state now without one)."""
    by_job: dict[str, list[Change]] = defaultdict(list)
    for c in changes:
        if since <= c.at <= until:
            by_job[c.job_id].append(c)
    # A move's destination GPUs are the policy's from the move's start (the live timeline
    # shows the job migrating there too), though held only from its arrival: a hold that
    # begins as a MIGRATING stretch of its job ends is drawn from that stretch's start.
    arrived: dict[tuple[str, float], float] = {}
    for job_id, seq in by_job.items():
        moving_since = since  # a stretch begun before the window: from its start
        for c in seq:
            if c.to_state == "MIGRATING":
                moving_since = c.at
            elif c.from_state == "MIGRATING":
                arrived[(job_id, c.at)] = moving_since

    def start(h: Hold) -> float:
        return arrived.get((h.job_id, h.start_at), h.start_at)

    by_gpu: dict[str, list[Hold]] = defaultdict(list)
    for h in holds:
        if start(h) <= until and (h.end_at is None or h.end_at > since):
            by_gpu[h.gpu_name].append(h)

    def state(job_id: str, t: float) -> str:
        current = ""
        for c in by_job.get(job_id, ()):
            if c.at > t:
                return current or c.from_state
            current = c.to_state
        return current or now_state.get(job_id, "")

    def trains_at_source(h: Hold, t: float) -> bool:
        """A hold of a MIGRATING job begun before its move (its source), the move one of a job
        that was RUNNING (lifecycle.trains): it trains on there until its stop, as the live
        timeline draws it."""
        into, out = None, None
        for c in by_job.get(h.job_id, ()):
            if c.at > t:
                out = c
                break
            into = c
        return (into is not None and (h.job_id, h.start_at) not in arrived
                and trains(into.to_state, into.from_state, out.to_state if out else ""))

    out: dict[str, list[list[Any]]] = {}
    for name, held in sorted(by_gpu.items()):
        cuts = {since, until}
        for h in held:
            cuts.update(t for t in (start(h), h.end_at) if t is not None and since < t < until)
            cuts.update(c.at for c in by_job.get(h.job_id, ()) if since < c.at < until)
        times = sorted(cuts)
        segs: list[list[Any]] = []
        for t0, t1 in itertools.pairwise(times):
            slots: tuple[list[str], list[str], list[str]] = ([], [], [])
            for h in held:
                if start(h) <= t0 and (h.end_at is None or h.end_at > t0):
                    k = SLOTS.get(state(h.job_id, t0))
                    if k == SLOTS["MIGRATING"] and trains_at_source(h, t0):
                        k = SLOTS["RUNNING"]
                    if k is not None:
                        slots[k].append(h.job_id)
            row = [sorted(x) for x in slots]
            if segs and segs[-1][2:] == row:
                segs[-1][1] = t1
            else:
                segs.append([t0, t1, *row])
        out[name] = segs  # empty stretches kept, as live: a round after them must not extend the last bar
    return out


def timeline_rows(s: Session, since: float, until: float) -> dict[str, list[list[Any]]]:
    """The per-GPU timeline over [since, until] from the database (a scheduler starting)."""
    listing = read(s, since, until, limit=LISTED_MAX * 10)
    jobs = sorted({h.job_id for h in listing.holds})
    changes, now_state = changes_since(s, jobs, since)
    return segments(listing.holds, changes, now_state, since, until)


def jobs_gpus(s: Session, job_ids: Sequence[str]) -> dict[str, list[Hold]]:
    """Every hold of each job, in order of start (the decisions read back at a start)."""
    out: dict[str, list[Hold]] = defaultdict(list)
    ids = list(job_ids)
    for i in range(0, len(ids), CHUNK):
        for row in s.execute(
                select(GpuHold.job_id, GpuHold.server_name, GpuHold.gpu_index, GpuHold.start_at, GpuHold.end_at)
                .where(GpuHold.job_id.in_(ids[i:i + CHUNK])).order_by(GpuHold.start_at, GpuHold.id)).all():
            out[row[0]].append(Hold(*row))
    return out


def gpus_of_decision(held: Sequence[Hold], kind: str, at: float, arrived: float | None = None) -> tuple[str, ...]:
    """The GPUs a decision read back concerns: for a move, those it arrived at (those the job
    held right after ``arrived``, its move's end, when known; else as of the job's first holds
    begun after it; none yet: those it left from), else those the job held at its time (a
    placement's begin then, a requeue's end then). A grow keeps the GPUs it had and a shrink
    begins none: read as the first holds begun after them, `gandiva demo`'s grow onto
    node-2/1,node-2/0 read node-2/0, and its shrink to node-2/0 read node-2/1,node-2/0."""
    if kind == "migrate":
        if arrived is None:
            arrived = min((h.start_at for h in held if h.start_at > at), default=None)
        after = [h.gpu_name for h in held if arrived is not None and h.start_at <= arrived
                 and (h.end_at is None or h.end_at > arrived)]
        if after:
            return tuple(after)
    return tuple(h.gpu_name for h in held
                 if h.start_at <= at and (h.end_at is None or h.end_at >= at))
