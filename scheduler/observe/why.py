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
_PAUSED = re.compile(r"\(training paused ([0-9.]+)s\)")
_ROLLED_BACK = {"stayed_at_source": "not moved: it stayed at its source",
                "restarted_at_source": "not moved: restarted at its source"}
# How a move that moved its job states its arrival (scheduler/engine/live_migration.py); any
# other way back to RUNNING or SUSPENDED rolled it back: "stayed_at_source: ...", a suspended
# job's stay (its reason alone, then "still suspended"), one rolled back after a restart.
_MOVED = "migrated to "
_TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")
_DECISION = {"SUSPENDED": "suspend", "MIGRATING": "move", "QUEUED": "requeue"}


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
        if into not in ("SUSPENDED", "MIGRATING", "QUEUED") or before == "MIGRATING" or before == into:
            continue  # (a move's end is its own row's outcome)
        nxt = changes[i + 1] if i + 1 < len(changes) else None
        outcome, back = _outcome(into, at, nxt, now)
        out.append({"at": at, "decision": _DECISION[into], "why": why,
                    "outcome": outcome, "rate_before": ran,
                    "rate_after": _rate_after(changes, i + 1, rate_now) if back else None})
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
    if not reason.startswith(_MOVED):
        rolled = _ROLLED_BACK.get(reason.partition(":")[0], _ROLLED_BACK["stayed_at_source"])
        return f"{rolled} {took} later", to == "RUNNING"
    paused = _PAUSED.search(reason)
    # ("later", as a resume's: the decision log's "moved in 0.5s" is the pause alone)
    said = f"moved {took} later (its copy pre-warmed meanwhile), training paused {paused[1]}s" if paused else \
        f"moved {took} later"
    return said + (" and waits its turn there" if to == "SUSPENDED" else ""), to == "RUNNING"


def _rate_after(changes: list[tuple[float, str, str, str, float | None]], start: int, rate_now: float) -> float | None:
    """The rate stated when the job next left RUNNING (its stretch after ``changes[start]``),
    or ``rate_now`` while that stretch goes on."""
    for _, before, _, _, ran in changes[start + 1:]:
        if before == "RUNNING":
            return ran
    return rate_now or None
