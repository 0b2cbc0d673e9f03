"""Retention: delete what finished jobs leave behind once it is old enough.

Events of jobs that finished before the cutoff (and server events older than it)
are deleted; with ``jobs=True`` the finished jobs themselves go too (their
transitions, placements and profiles cascade). Unfinished jobs and their events
are never touched. One transaction per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from scheduler.errors import InvalidArgument
from scheduler.lifecycle import JobState
from scheduler.state.models import Event, Job

_TERMINAL = [s.value for s in JobState if s.terminal]


@dataclass(frozen=True)
class Pruned:
    events: int = 0
    jobs: int = 0


async def prune_session(session: AsyncSession, cutoff: float, jobs: bool = False) -> Pruned:
    old_jobs = select(Job.id).where(Job.state.in_(_TERMINAL), Job.finished_at > 0,
                                    Job.finished_at < cutoff)
    events = await session.execute(
        delete(Event)
        .where(or_(Event.job_id.in_(old_jobs), and_(Event.job_id == "", Event.at < cutoff)))
        .execution_options(synchronize_session=False)
    )
    removed_jobs = 0
    if jobs:
        result = await session.execute(
            delete(Job).where(Job.id.in_(old_jobs)).execution_options(synchronize_session=False)
        )
        removed_jobs = int(getattr(result, "rowcount", 0) or 0)
    return Pruned(events=int(getattr(events, "rowcount", 0) or 0), jobs=removed_jobs)


async def prune(core: Any, older_than_s: float, jobs: bool = False, now: float | None = None) -> Pruned:
    """Prune through a SchedulerCore's write transaction (it holds SQLite's writer lock)."""
    if older_than_s < 0:
        raise InvalidArgument("older_than", "must not be negative")
    cutoff = (now if now is not None else time.time()) - older_than_s
    async with core.tx() as s:
        return await prune_session(s, cutoff, jobs)
