"""How far along a job is and when it should end: its mini-batches done of its total, and
its remaining mini-batches at the rate measured by its current launch, with what that
assumes when it shares its GPU. Never a made-up ETA: without a total, without a rate
measured on the GPUs it holds now, or while it waits, the ETA is unknown and says why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.lifecycle import JobState

if TYPE_CHECKING:  # the CLI formats with this module and needs no SQLAlchemy
    from scheduler.state.models import Job

UNKNOWN = -1.0
# An ETA past this is no ETA (its rate's reports are held to at least one mini-batch a day,
# and its total to 2^53: at most 7.8e20 s): a rate of 5e-324 once made it infinite, and
# every view of the job failed formatting it.
MAX_ETA_S = 1e22


@dataclass(frozen=True)
class Sharer:
    """Another job placed on the job's (first) GPU."""

    id: str
    state: str
    priority: int
    held: bool = False


def _rough(seconds: float, minutes: str) -> str:
    """40s, 12{minutes}, 2h05, 3d04h: an ETA deserves no more digits."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{round(s / 60)}{minutes}"
    return f"{s // 3600}h{s % 3600 // 60:02d}" if s < 86400 else f"{s // 86400}d{s % 86400 // 3600:02d}h"


def about(seconds: float) -> str:
    """A rough length of time for people: ~40s, ~12 min, ~2h05, ~3d04h."""
    return "~" + _rough(seconds, " min")


def progress_text(steps: int, total: int) -> str:
    """'step 340 / 1,000 (34%)'; '' without a total."""
    if total <= 0:
        return ""
    return f"step {steps:,} / {total:,} ({int(100 * steps / total)}%)"  # past 100%: the total was a guess


def _weight(priority: int) -> int:
    return max(1, priority)


def estimate(job: Job, gpu: str, sharers: Sequence[Sharer], placed: int = 0) -> tuple[float, str]:
    """(seconds of wall time until its last mini-batch, or UNKNOWN; what that assumes or
    why it is unknown). ("-1", "") for a job without a total or one that has ended.
    `placed`: the GPUs it holds now (a grown job holds more than it asked for)."""
    total, state = job.total_steps or 0, JobState(job.state)
    if total <= 0 or state.terminal:
        return UNKNOWN, ""
    left = total - (job.steps or 0)
    if left < 0 and job.total_steps_from != "program":
        return UNKNOWN, f"unknown: it ran past the {total:,} mini-batches given at submission (--steps)"
    if left <= 0:
        return 0.0, "at its last mini-batch"
    if state is JobState.QUEUED:
        return UNKNOWN, "unknown while it waits in the queue"
    if state is JobState.MIGRATING:
        return UNKNOWN, "unknown while it moves: its rate on the new GPUs is not measured yet"
    if state is JobState.SUSPENDED and job.held:
        return UNKNOWN, "unknown while an operator holds it suspended"
    # rate_at is reset by each launch (a start, a restart, a migration, a grow or shrink):
    # a rate before it was measured on other GPUs, or another number of them.
    if not (job.rate or 0) > 0 or not job.rate_at:
        if (job.rate or 0) > 0:
            return UNKNOWN, (f"unknown until its rate on its current {placed or job.gpus} GPU(s) is measured (it ran "
                             f"{job.rate:.1f} mini-batches/s before it was started again or moved)")
        return UNKNOWN, "unknown until its rate is measured (no mini-batch timed yet)"
    running = left / job.rate
    if running > MAX_ETA_S:  # a rate stored before reports were held to a mini-batch a day
        return UNKNOWN, f"unknown: its reported rate ({job.rate:.3g} mini-batches/s) is too low to tell"
    at_rate = f"{left:,} mini-batches left at {job.rate:.1f}/s"
    others = [s for s in sharers if s.id != job.id and not s.held and
              s.state in (JobState.RUNNING.value, JobState.SUSPENDED.value)]
    waiting = [s for s in others if s.state == JobState.SUSPENDED.value]
    if state is JobState.SUSPENDED and not others:
        return UNKNOWN, f"unknown while it is suspended ({about(running)} of running once it runs again)"
    if not waiting and state is JobState.RUNNING:
        if others:
            return running, f"{at_rate}, its rate packed beside {len(others)} other job(s) on GPU {gpu}"
        return running, at_rate
    # Time-slicing: it runs about its priority's share of the time.
    share = _weight(job.priority) / (_weight(job.priority) + sum(_weight(s.priority) for s in others))
    wall = min(running / share, MAX_ETA_S)
    return wall, (f"{about(running)} of running, {at_rate}; it runs about 1/{round(1 / share)} of the "
                  f"time while it time-slices GPU {gpu} with {len(others)} other job(s)")


def eta_text(eta_s: float, note: str) -> str:
    """'~12 min (990 mini-batches left at 4.5/s)', or why it is unknown; '' without a total."""
    if eta_s < 0:
        return note
    return f"{about(eta_s)} ({note})" if note else about(eta_s)


def short(eta_s: float, steps: int, total: int, ended: bool = False) -> str:
    """For a table column, one token (awk reads the columns): '34%/12m', '34%/?' (ETA
    unknown), '34%' (ended: no ETA to give; it read '34%/?', as if one might come), '-'
    (no total)."""
    if total <= 0:
        return "-"
    pct = f"{int(100 * steps / total)}%"
    if ended:
        return pct
    if eta_s < 0:
        return f"{pct}/?"
    return f"{pct}/{_rough(eta_s, 'm')}"
