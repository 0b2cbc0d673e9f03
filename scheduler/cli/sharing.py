"""`gandiva describe job`'s "Sharing" section: what time-slicing, packing and moves did to
one job, in one place (it was spread over its History, its Migrations and its Events).

Worked out from the job's events, which the scheduler keeps across restarts: every state
change is a ``job.state`` event ("RUNNING -> SUSPENDED: time slice of 8s over (step 261)
(it ran 32.5 mini-batches/s)"), every packing verdict a ``job.pack`` event with the rates it
was judged by, every completed move a state change saying how long training paused. The time
in each state is counted as `gandiva get usage` counts it (scheduler.observe.usage).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from protos.gandiva.v1 import common_pb2
from scheduler.cli import output
from scheduler.observe.sharing import move_record, summary
from scheduler.observe.why import decisions as _decisions


def sharing(job: common_pb2.Job, events: Sequence[common_pb2.Event], now: float | None = None) -> dict[str, Any]:
    """The summary (scheduler.observe.sharing) of ``job`` from its events, as ``-o json``'s
    ``sharing``: from its submission to its end (or now)."""
    records = [("state" if e.kind == "job.state" else "verdict", e.at, e.message)
               for e in events if e.kind in ("job.state", "job.pack")]
    records += [r for e in events if (r := move_record(e.kind, e.at, e.message))]
    end = job.finished_at or (now if now is not None else time.time())
    return summary(job.id, job.spec.gpus, job.submitted_at, end, records)


def lines(got: dict[str, Any], job_id: str = "ID") -> list[tuple[str, str]]:
    """The summary (of job ``job_id``) as describe's fields."""
    spent = (f"running {output.duration(got['running_s'])}, suspended "
             f"{output.duration(got['suspended_s'])} ({got['time_slices']} "
             f"suspension{'' if got['time_slices'] == 1 else 's'}: time slices, holds, packs undone), queued {output.duration(got['queued_s'])}, moving "
             f"{got['migrating_s']:.1f}s")
    if got.get("migrating_training_s", 0.0) >= 0.05:  # (a move's copy pre-warms while it trains on)
        spent += f" (training on for {got['migrating_training_s']:.1f}s of it, while its copy pre-warmed)"
    fields = [("Time", spent)]
    ran = got["rates_before_switch"]
    if ran:
        rates = (f"{min(ran):.1f} to {max(ran):.1f} mini-batches/s (median {sorted(ran)[len(ran) // 2]:.1f}) "
                 f"over the {len(ran)} stretches before a suspend or move, as its runtime measured them")
        fields.append(("Rates", rates))
    trials = got["packing_trials"]
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
    pauses = got["move_pauses_s"]
    moves = f"{len(pauses)}, training paused " + ", ".join(f"{p:.2f}s" for p in pauses) if pauses else "none"
    not_moved = got.get("moves_not_done") or []
    if not_moved:  # moves decided that did not move it: why is in their job.migration events
        moves += (f"; {len(not_moved)} more decided but not carried out ({', '.join(not_moved)}): "
                  f"gandiva get events --job {job_id} --kind job.migration")
    fields.append(("Moves", moves))
    return fields


def decisions(job: common_pb2.Job, events: Sequence[common_pb2.Event], now: float | None = None) -> list[dict[str, Any]]:
    """Each suspend or move of ``job`` with what came of it (scheduler.observe.why), as ``-o
    json``'s ``decisions``."""
    running = job.state == common_pb2.JOB_STATE_RUNNING
    return _decisions([(e.at, e.message) for e in events if e.kind == "job.state"],
                      now if now is not None else time.time(), job.rate if running else 0.0)


def decision_rows(got: list[dict[str, Any]]) -> list[list[str]]:
    """describe's "Why it was suspended or moved" rows: TIME, DECISION, WHY, THEN."""
    rows = []
    for d in got:
        rates = [f"{d[k]:.1f}/s {word}" for k, word in (("rate_before", "before"), ("rate_after", "after"))
                 if d[k] is not None]
        then = d["outcome"] + (f"; ran {', '.join(rates)}" if rates else "")
        rows.append([output.timestamp(d["at"]), d["decision"], output.visible(d["why"]), output.visible(then)])
    return rows
