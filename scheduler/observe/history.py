"""The dashboard's decision log read back from the database when the scheduler starts.

The log (scheduler.observe.metrics.DecisionLog) lives in memory: after a restart the page's
"decision log" was empty, though the database holds what the scheduler did, with its
reasons: every job's state changes (the ``transitions`` table) and every packing trial's
verdict (a ``job.pack`` event on each job of the pair). The latest of them are put back in
the log before the first round, oldest first, each as the decision it records (a job placed,
suspended, resumed, moved, sent back to the queue; a verdict), then one line saying that the
scheduler started and that the lines before it were read back (none for a new database). Their
GPUs come from the GPUs' history (``gpu_holds``, scheduler/observe/holds.py), which also draws
the per-GPU timeline again (``read_back_timeline``). What they lack: the decisions that changed
no state (a pack's start beside a running job that was not suspended; a suspended job's is its
change to RUNNING, read back as the pack it was), whether a move rolled back (or under way) was a
grow or a shrink (read back as `migrate`; one that moved is told by the GPUs held before and
after it), and the GPUs of a decision taken
before that history was kept (session 49).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from scheduler.lifecycle import JobState
from scheduler.observe import holds, why
from scheduler.observe.metrics import DecisionLog, Timeline, moved_in, said_of
from scheduler.state.models import Event, Transition
from scheduler.timeline import PACK_VERDICT
from scheduler.unmoved import FAILED_REQUEUE

# Rows looked at from the end of each table: the events table has no index by kind, so the
# verdicts are sought among its latest rows only (a bounded read at start, whatever its size).
LOOKED_AT = 50_000
RESTART = "restart"
# How a packing trial's start states its reason (scheduler/policy/packing.py): the suspended
# job's change to RUNNING beside the other; before session 53 read back as a `resume`, with
# no outcome, where the live log said `pack ... -> kept`.
PACK_TRIAL = "trial: packed beside "

# (from, to) -> the decision a state change records; state changes not listed (a job's end,
# a migration's completion) are not decisions of the policy and are left out, as live.
_KINDS = {("QUEUED", "RUNNING"): "place", ("SUSPENDED", "RUNNING"): "resume",
          ("RUNNING", "SUSPENDED"): "suspend", ("RUNNING", "MIGRATING"): "migrate",
          ("SUSPENDED", "MIGRATING"): "migrate", ("RUNNING", "QUEUED"): "requeue",
          ("SUSPENDED", "QUEUED"): "requeue", ("MIGRATING", "QUEUED"): "requeue"}


def _move_outcome(to_state: str, reason: str) -> str:
    """A read-back move's outcome from its job's next change out of MIGRATING: one rolled back
    to its source goes back to RUNNING or SUSPENDED too (why.rolled_back: what the live log
    said of it, the "Why" table's table; before session 53 a move rolled back by a scheduler
    restart, or a suspended job's that stayed, read "moved")."""
    if to_state in ("RUNNING", "SUSPENDED"):
        back = why.rolled_back(reason)
        if back is not None:
            return back[0]
        # (as the live log says it, from the same figure: the pause its arrival states)
        paused = why.PAUSED.search(reason)
        return moved_in(float(paused[1])) if paused else "moved"
    if to_state == "QUEUED" and reason.startswith(FAILED_REQUEUE):
        return "failed"  # (as live: the move's own end, `failed`, then its job re-placed)
    return "not kept: the job ended first" if JobState(to_state).terminal else f"not kept: {to_state.lower()}"


def verdict_kind(message: str) -> str:
    """The log's kind of a packing verdict, from its event's words (live.py writes them)."""
    if "trial void" in message:
        return "pack-void"
    if ": kept" in message:
        return "keep-pack"
    return "unpack" if "no gain" in message else "pack"


async def read_back(core: Any, log: DecisionLog, now: float) -> int:
    """Fill ``log`` (empty: the scheduler is starting) with the latest decisions the database
    records, then the restart line. Returns how many were read back."""
    size = log.records.maxlen or 0
    async with core.tx(read=True) as s:
        changes = (await s.execute(
            select(Transition.at, Transition.job_id, Transition.from_state, Transition.to_state, Transition.reason)
            .order_by(Transition.id.desc()).limit(size * 2))).all()  # some are not decisions
        last_event = await s.scalar(select(func.max(Event.id))) or 0
        verdicts = (await s.execute(
            select(Event.at, Event.job_id, Event.message)
            .where(Event.id > last_event - LOOKED_AT, Event.kind == PACK_VERDICT)
            .order_by(Event.id.desc()).limit(size * 2))).all()
    rows: list[tuple[float, str, str, str]] = []
    by_job: dict[str, list[tuple[float, str, str]]] = {}
    for at, job_id, from_state, to_state, _ in reversed(changes):  # (oldest first)
        by_job.setdefault(job_id, []).append((at, from_state, to_state))
    seen_of: dict[str, int] = {}
    for at, job_id, from_state, to_state, reason in reversed(changes):
        n = seen_of[job_id] = seen_of.get(job_id, -1) + 1
        kind = _KINDS.get((from_state, to_state))
        if kind == "resume" and reason.startswith(PACK_TRIAL):
            kind = "pack"  # (live: a suspended job placed beside a running one; its verdict settles it)
        # (a suspended job's move that stayed goes back through RUNNING: its "still suspended"
        # is no suspend; it was read back as one)
        if kind is not None and not why.stay_of_suspended(by_job[job_id], n):
            rows.append((at, kind, job_id, reason))
    seen: set[tuple[float, frozenset[str]]] = set()
    for at, job_id, message in reversed(verdicts):  # oldest first: the pair's first event
        # One verdict is an event on each job of the pair ("packing trial with OTHER: ..."),
        # at the time of the round that judged it: a pair is known by both jobs, not by the
        # time alone (two pairs judged in one round: the second's verdict was left out).
        pair = (at, frozenset((job_id, message.partition(":")[0].removeprefix("packing trial with "))))
        if pair not in seen:
            seen.add(pair)
            rows.append((at, verdict_kind(message), job_id, message))
    rows.sort(key=lambda row: row[0])
    rows = rows[-(size - 1):] if size > 1 else []
    # Their GPUs, from the GPUs' history (gpu_holds, since session 49; a decision taken
    # before that has none).
    held = await core.read_sync(lambda s: holds.jobs_gpus(s, sorted({row[2] for row in rows})))
    # A move read back: kept or not by its job's next change out of MIGRATING (the decisions'
    # outcomes live in memory; without this, the first round settled every finished job's
    # move "not kept: the job ended first", moves that had moved included); where it arrived:
    # the GPUs held right after that change.
    ends: dict[str, list[tuple[float, str, str]]] = {}
    for at, job_id, from_state, to_state, reason in changes:
        if from_state == "MIGRATING":
            ends.setdefault(job_id, []).append((at, to_state, reason))

    def end_of(job_id: str, at: float) -> tuple[float, str, str] | None:
        return min(((when, to, why) for when, to, why in ends.get(job_id, []) if when >= at), default=None)

    for at, kind, job_id, reason in rows:
        end = end_of(job_id, at) if kind == "migrate" else None
        arrived = end[0] if end is not None and _move_outcome(end[1], end[2]).startswith("moved") else None
        gpus = holds.gpus_of_decision(held.get(job_id, []), kind, at, arrived)
        if arrived is not None:
            # A grow or a shrink is a move too: told apart by the GPUs held before and after it
            # (before session 53 each read `migrate`, where the live log said grow or shrink).
            before = len(holds.gpus_of_decision(held.get(job_id, []), "", at))
            kind = "grow" if len(gpus) > before > 0 else "shrink" if 0 < len(gpus) < before else kind
        log.add(at, kind, job_id, gpus, reason)
    for r in list(log.open.values()):
        end = end_of(r.job, r.at)
        if end is not None:  # (this record's own: settle() would take the job's latest)
            r.settled_at = end[0]
            r.outcome = said_of(r.kind, _move_outcome(end[1], end[2]))
    log.open.clear()  # (the rest: not known, not settled by the jobs' ends either)
    if rows:  # a new database: nothing to say
        log.add(now, RESTART, "", (), f"the scheduler started; the {len(rows)} decisions before this line are read "
                                      "back from the database (its jobs' state changes and packing verdicts); "
                                      "gandiva get events --since WHEN --until WHEN lists all of them")
    return len(rows)


async def read_back_timeline(core: Any, timeline: Timeline, now: float) -> int:
    """Fill ``timeline`` (empty: the scheduler is starting) with its last ``keep_s`` drawn
    from the GPUs' history; returns how many GPUs have a segment."""
    drawn = await core.read_sync(lambda s: holds.timeline_rows(s, now - timeline.keep_s, now))
    timeline.gpus.update(drawn)
    return sum(1 for segs in drawn.values() if any(any(seg[2:]) for seg in segs))
