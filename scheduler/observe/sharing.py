"""What time-slicing, packing and moves did to one job, summed up from its records: `gandiva
describe job`'s "Sharing" section (from its events) and the dashboard's one-job view (from its
state changes and verdicts).

A record is ("state", at, "RUNNING -> SUSPENDED: time slice of 8s over (step 261) (it ran 32.5
mini-batches/s)") for a state change, as its ``job.state`` event says it, or ("verdict", at,
MESSAGE) for a packing verdict (its ``job.pack`` event, with the rates it was judged by). The
time in each state is counted as `gandiva get usage` counts it (scheduler.observe.usage).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from scheduler.lifecycle import trains
from scheduler.observe.history import verdict_kind
from scheduler.observe.usage import JobFacts, job_usage
from scheduler.observe.why import PAUSED
from scheduler.unmoved import unmoved_end

_VERDICTS = {"pack-void": "void", "keep-pack": "kept"}  # (verdict_kind's words; any other: undone)
_CHANGE = re.compile(r"([A-Z]+) -> ([A-Z]+): ")
_RAN = re.compile(r"\(it ran ([0-9.]+) mini-batches/s\)")
_GAIN = re.compile(r"packed rate ([0-9.]+)x of time-slicing")


def move_record(kind: str, at: float, message: str) -> tuple[str, float, str] | None:
    """A ("move", at, outcome) record of a job.migration event that ended without moving the job
    (for ``summary``), or None for any other event."""
    found = unmoved_end(message) if kind == "job.migration" else None
    return ("move", at, found) if found else None


def own_rates(job_id: str, message: str) -> tuple[float, float] | None:
    """This job's (packed, alone) rates in a verdict's words: "(j-a 15.8 packed vs 19.5 alone, j-b
    15.7 vs 19.4 mini-batches/s; ...)" (the second job's without the words)."""
    found = re.search(r"\b" + re.escape(job_id) + r" ([0-9.]+)(?: packed)? vs ([0-9.]+)\b", message)
    return (float(found[1]), float(found[2])) if found else None


def summary(job_id: str, gpus: int, since: float, until: float, records: Iterable[tuple[str, float, str]]
            ) -> dict[str, Any]:
    """Seconds in each state over [since, until] (the job's submission to its end or now; the
    first record's time when the records are its latest only), suspensions, the rates it ran at
    before each suspend or move, its packing trials with their verdicts and its own rates
    packed and alone, its moves with the pause each cost, and the outcome of each move that did
    not move it ("move" records: ``move_record``)."""
    changes: list[tuple[str, str, float]] = []
    ran: list[float] = []
    pauses: list[float] = []
    slices = 0
    trials: list[dict[str, Any]] = []
    not_moved: list[str] = []
    paused_at: dict[int, float] = {}  # a completed move's change (its index): training paused then
    for kind, at, text in records:
        if kind == "state":
            found = _CHANGE.match(text)
            if not found:
                continue
            changes.append((found[1], found[2], at))
            slices += (found[1], found[2]) == ("RUNNING", "SUSPENDED")
            ran += [float(r) for r in _RAN.findall(text)]
            if found[1] == "MIGRATING" and found[2] == "RUNNING":
                pauses += [float(p) for p in PAUSED.findall(text)]
                if paused := PAUSED.search(text):
                    paused_at[len(changes) - 1] = float(paused[1])
        elif kind == "move":
            not_moved.append(text)
        elif kind == "verdict":
            gain = _GAIN.search(text)
            verdict = _VERDICTS.get(verdict_kind(text), "undone")
            own = own_rates(job_id, text)
            trials.append({"at": at, "verdict": verdict, "gain": float(gain[1]) if gain else None,
                           "packed_rate": own[0] if own else None, "alone_rate": own[1] if own else None})
    state = changes[-1][1] if changes else "QUEUED"
    started = next((at for _, to_state, at in changes if to_state == "RUNNING"), 0.0)
    facts = JobFacts(job_id, "", "", gpus, state, since, started, 0.0)
    spent = job_usage(facts, [c for c in changes if c[2] >= since], since, max(until, since + 1e-9), moves_train=False)
    return {"state_changes": len(changes), "running_s": spent.gpu_seconds / max(1, gpus),
            "suspended_s": spent.suspended_seconds, "queued_s": spent.queued_seconds,
            "migrating_s": spent.migrating_seconds,
            "migrating_training_s": trained_while_moving(changes, paused_at, since, until),
            "time_slices": slices, "rates_before_switch": ran,
            "packing_trials": trials, "move_pauses_s": pauses, "moves_not_done": not_moved}


def trained_while_moving(changes: list[tuple[str, str, float]], paused_at: dict[int, float], since: float,
                         until: float) -> float:
    """Of the job's time MIGRATING within [since, until], how much it trained on at its source:
    a move of a running job pre-warms its copy at the destination while the job goes on (10-30 s
    a move in `gandiva demo`) and stops it only for the checkpoint and restore (the "training
    paused" its arrival states: ``paused_at``, by the index of that change). Counted: each move
    begun from RUNNING that ended back RUNNING (less its pause) or with the job's end; not a move
    of a suspended job, nor one cut short by the job going back to the queue (its server lost:
    when it stopped is not known)."""
    trained = 0.0
    for i, (before, into, began) in enumerate(changes):
        after, ended = changes[i + 1][1:] if i + 1 < len(changes) else ("", until)  # ("": under way now)
        # (lifecycle.trains: the one rule of its GPU time, not a copy of it here)
        if into == "MIGRATING" and trains(into, before, after):
            trained += max(0.0, min(ended, until) - max(began, since) - paused_at.get(i + 1, 0.0))
    return trained
