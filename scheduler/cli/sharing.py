"""`gandiva describe job`'s "Sharing" section: what time-slicing, packing and moves did to
one job, in one place (it was spread over its History, its Migrations and its Events).

Worked out from the job's events, which the scheduler keeps across restarts: every state
change is a ``job.state`` event ("RUNNING -> SUSPENDED: time slice of 8s over (step 261)
(it ran 32.5 mini-batches/s)"), every packing verdict a ``job.pack`` event with the rates it
was judged by, every completed move a state change saying how long training paused. The time
in each state is counted as `gandiva get usage` counts it (scheduler.observe.usage).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from protos.gandiva.v1 import common_pb2
from scheduler.cli import output
from scheduler.observe.usage import JobFacts, job_usage

_CHANGE = re.compile(r"([A-Z]+) -> ([A-Z]+): ")
_RAN = re.compile(r"\(it ran ([0-9.]+) mini-batches/s\)")
_PAUSED = re.compile(r"\(training paused ([0-9.]+)s\)")
_GAIN = re.compile(r"packed rate ([0-9.]+)x of time-slicing")
_TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")


def _own_rates(job_id: str, message: str) -> tuple[float, float] | None:
    """This job's (packed, alone) rates in a verdict's words: "(j-a 15.8 packed vs 19.5 alone, j-b
    15.7 vs 19.4 mini-batches/s; ...)" (the second job's without the words)."""
    found = re.search(r"\b" + re.escape(job_id) + r" ([0-9.]+)(?: packed)? vs ([0-9.]+)\b", message)
    return (float(found[1]), float(found[2])) if found else None


def sharing(job: common_pb2.Job, events: Sequence[common_pb2.Event], now: float | None = None) -> dict[str, Any]:
    """The summary as a dict (``-o json``'s ``sharing``): seconds in each state, time slices
    (suspensions), the rates it ran at before each suspend or move, its packing trials with
    their verdicts and its own rates packed and alone, its moves with the pause each cost."""
    changes: list[tuple[str, str, float]] = []
    ran: list[float] = []
    pauses: list[float] = []
    slices = 0
    trials: list[dict[str, Any]] = []
    for e in events:
        if e.kind == "job.state":
            found = _CHANGE.match(e.message)
            if not found:
                continue
            changes.append((found[1], found[2], e.at))
            slices += (found[1], found[2]) == ("RUNNING", "SUSPENDED")
            ran += [float(r) for r in _RAN.findall(e.message)]
            if found[1] == "MIGRATING" and found[2] == "RUNNING":
                pauses += [float(p) for p in _PAUSED.findall(e.message)]
        elif e.kind == "job.pack":
            gain = _GAIN.search(e.message)
            verdict = "void" if "trial void" in e.message else "kept" if ": kept" in e.message else "undone"
            own = _own_rates(job.id, e.message)
            trials.append({"at": e.at, "verdict": verdict, "gain": float(gain[1]) if gain else None,
                           "packed_rate": own[0] if own else None, "alone_rate": own[1] if own else None})
    state = changes[-1][1] if changes else "QUEUED"
    started = next((at for _, to_state, at in changes if to_state == "RUNNING"), 0.0)
    facts = JobFacts(job.id, job.spec.name, job.spec.user, job.spec.gpus, state, job.submitted_at, started,
                     job.finished_at)
    end = job.finished_at or (now if now is not None else time.time())
    spent = job_usage(facts, changes, job.submitted_at, max(end, job.submitted_at + 1e-9))
    return {"state_changes": len(changes), "running_s": spent.gpu_seconds / max(1, job.spec.gpus),
            "suspended_s": spent.suspended_seconds, "queued_s": spent.queued_seconds,
            "migrating_s": spent.migrating_seconds, "time_slices": slices, "rates_before_switch": ran,
            "packing_trials": trials, "move_pauses_s": pauses}


def lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as describe's fields."""
    spent = (f"running {output.duration(summary['running_s'])}, suspended "
             f"{output.duration(summary['suspended_s'])} ({summary['time_slices']} "
             f"suspension{'' if summary['time_slices'] == 1 else 's'}: time slices, holds, packs undone), queued {output.duration(summary['queued_s'])}, moving "
             f"{summary['migrating_s']:.1f}s")
    fields = [("Time", spent)]
    ran = summary["rates_before_switch"]
    if ran:
        rates = (f"{min(ran):.1f} to {max(ran):.1f} mini-batches/s (median {sorted(ran)[len(ran) // 2]:.1f}) "
                 f"over the {len(ran)} stretches before a suspend or move, as its runtime measured them")
        fields.append(("Rates", rates))
    trials = summary["packing_trials"]
    if trials:
        said = []
        for t in trials:
            own = (f"; it ran {t['packed_rate']:.1f} packed vs {t['alone_rate']:.1f} alone"
                   if t["packed_rate"] is not None else "")
            gain = f" at {t['gain']:.2f}x of time-slicing" if t["gain"] is not None else ""
            said.append(f"{t['verdict']}{gain}{own}")
        fields.append(("Packing", f"{len(trials)} trial(s): " + "\n".join(said)))
    else:
        fields.append(("Packing", "never tried"))
    pauses = summary["move_pauses_s"]
    fields.append(("Moves", f"{len(pauses)}, training paused " + ", ".join(f"{p:.2f}s" for p in pauses)
                   if pauses else "none"))
    return fields
