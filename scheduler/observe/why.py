""""Why was my job suspended or moved, and what came of it?": each such decision of a job, from
its state changes as its ``job.state`` events say them (``"RUNNING -> MIGRATING: make room for
job j-7e: empty node-1: node-1 -> node-2 (it ran 31.6 mini-batches/s)"``), with what followed:
how long it waited before its resume, whether a move moved it and what it paused, and the rate
it ran at before and after. `gandiva describe job` prints it (scheduler/cli/ops.py); the events
are the database's, so it holds across scheduler restarts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_CHANGE = re.compile(r"([A-Z]+) -> ([A-Z]+): ?(.*)", re.DOTALL)
_RAN = re.compile(r" ?\(it ran ([0-9.e+-]+) mini-batches/s\)")
PAUSED = re.compile(r"\(training paused ([0-9.]+)s\)")  # (a move's arrival: its pause)
# How a move that moved its job states its arrival (scheduler/engine/live_migration.py); any
# other way back to RUNNING or SUSPENDED rolled it back: "stayed_at_source: ...", a suspended
# job's stay (its reason alone, then "still suspended"), one rolled back after a restart.
_MOVED = "migrated to "
_TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")
_DECISION = {"SUSPENDED": "suspend", "MIGRATING": "move", "QUEUED": "requeue"}
# A move rolled back, by its end's first word ("<outcome>: <why>", live_migration; any other:
# it stayed): (the decision log's outcome, as the live log said it: unmoved.ENDED_UNMOVED's
# phase; the "Why" table's words). The one table of both (scheduler/observe/history.py reads
# the decision log back after a restart).
ROLLED_BACK = {"stayed_at_source": ("aborted", "not moved: it stayed at its source"),
               "restarted_at_source": ("restarted_at_source", "not moved: restarted at its source")}


def rolled_back(reason: str) -> tuple[str, str] | None:
    """How a move whose job went back to RUNNING or SUSPENDED with ``reason`` ended without
    moving it (ROLLED_BACK's pair), or None: it moved."""
    if reason.startswith(_MOVED):
        return None
    return ROLLED_BACK.get(reason.partition(":")[0], ROLLED_BACK["stayed_at_source"])


def stay_of_suspended(changes: Sequence[tuple[Any, ...]], i: int) -> bool:
    """Whether ``changes[i]`` ((at, from, to, ...) of one job, in time order) is the second
    half of a suspended job's move rolled back (live_migration's MIGRATING -> RUNNING ->
    SUSPENDED "still suspended", one time): no decision of the scheduler's."""
    if not 0 < i < len(changes):
        return False
    at, before, into = changes[i][:3]
    return (before == "RUNNING" and into == "SUSPENDED"
            and tuple(changes[i - 1][1:3]) == ("MIGRATING", "RUNNING") and changes[i - 1][0] == at)


def _changes(records: Sequence[tuple[float, str]]) -> list[tuple[float, str, str, str, float | None]]:
    """(at, from, to, reason without its rate, the rate it states or None), in time order."""
    out = []
    for at, text in sorted(records, key=lambda r: r[0]):
        found = _CHANGE.match(text)
        if found:
            ran = _RAN.search(found[3])
            out.append((at, found[1], found[2], _RAN.sub("", found[3]).strip(), float(ran[1]) if ran else None))
    return out


def _span(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 90 else f"{seconds / 60:.0f}m"


def decisions(records: Sequence[tuple[float, str]], now: float, rate_now: float = 0.0) -> list[dict[str, Any]]:
    """Each suspend, move or return to the queue of the job (``records``: its state changes as
    (at, "FROM -> TO: REASON")), oldest first: ``at``, ``decision`` (suspend, move or requeue: a
    park, a preemption, its server or process lost), ``why`` (the scheduler's
    reason), ``outcome`` (what followed, in words), ``rate_before`` and ``rate_after`` (the rates
    its runtime measured over the stretch running before it and the next one after it; None: not
    measured; after: ``rate_now`` while that stretch goes on). ``now``: for what is under way."""
    changes = _changes(records)
    out = []
    for i, (at, before, into, why, ran) in enumerate(changes):
        if into not in ("SUSPENDED", "MIGRATING", "QUEUED") or before == "MIGRATING" or before == into \
                or stay_of_suspended(changes, i):
            continue  # (a move's end is its own row's outcome)
        nxt = changes[i + 1] if i + 1 < len(changes) else None
        outcome, back = _outcome(into, at, nxt, now)
        after = i + 1  # (the change that began the stretch after it)
        if stay_of_suspended(changes, i + 2):  # its move's end: the job is suspended still
            after = i + 3
            then, back = _outcome("SUSPENDED", changes[i + 2][0], changes[after] if after < len(changes) else None, now)
            outcome = f"{outcome}; {then}" if nxt is None or after >= len(changes) else \
                f"{outcome}; still suspended, {then}"
        elif into == "SUSPENDED" and nxt is not None and nxt[2] == "MIGRATING" and not _moved(changes, i + 2):
            outcome = f"a move began {_span(nxt[0] - at)} later"  # (not "moved": the move's row says what came of it)
        out.append({"at": at, "decision": _DECISION[into], "why": why,
                    "outcome": outcome, "rate_before": ran,
                    "rate_after": _rate_after(changes, after, rate_now) if back else None})
    return out


def _outcome(into: str, at: float, nxt: tuple[float, str, str, str, float | None] | None,
             now: float) -> tuple[str, bool]:
    """What followed a suspend or move (``nxt``: the job's next change), and whether the job
    ran again right after it."""
    if nxt is None:
        return {"SUSPENDED": "suspended now", "QUEUED": "queued now"}.get(into, "under way") + \
            f" for {_span(now - at)}", False
    when, _, to, reason, _ = nxt
    took = _span(when - at)
    if to in _TERMINAL:
        return f"the job ended ({to}) {took} later" + (", before it moved" if into == "MIGRATING" else ""), False
    if to == "QUEUED":
        return f"back to the queue {took} later: {reason}", False
    if into == "QUEUED":
        return f"placed again {took} later: {reason}", to == "RUNNING"
    if into == "SUSPENDED":
        if to == "MIGRATING":
            return f"moved while suspended, {took} later", False
        return f"resumed {took} later: {reason}", True
    if (rolled := rolled_back(reason)) is not None:
        return f"{rolled[1]} {took} later", to == "RUNNING"
    paused = PAUSED.search(reason)
    # ("later", as a resume's: the decision log's "moved in 0.5s" is the pause alone)
    said = f"moved {took} later (its copy pre-warmed meanwhile), training paused {paused[1]}s" if paused else \
        f"moved {took} later"
    return said + (" and waits its turn there" if to == "SUSPENDED" else ""), to == "RUNNING"


def _moved(changes: list[tuple[float, str, str, str, float | None]], end: int) -> bool:
    """Whether ``changes[end]``, a move's end, moved its job."""
    return end < len(changes) and changes[end][1] == "MIGRATING" and changes[end][2] in ("RUNNING", "SUSPENDED") \
        and rolled_back(changes[end][3]) is None


def _rate_after(changes: list[tuple[float, str, str, str, float | None]], start: int, rate_now: float) -> float | None:
    """The rate stated when the job next left RUNNING (its stretch after ``changes[start]``),
    or ``rate_now`` while that stretch goes on."""
    for _, before, _, _, ran in changes[start + 1:]:
        if before == "RUNNING":
            return ran
    return rate_now or None
