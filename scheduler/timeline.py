"""One job's timeline: its state changes and its packing trials' verdicts in time order.

`gandiva describe job` (its History, on the protobuf GetJob returns) and the dashboard's
one-job view (`/api/job`, on the database's rows) show the same merge; both call this.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# The event of a packing trial's verdict (kept, undone, void, with the rates judged by).
PACK_VERDICT = "job.pack"


def merged(changes: Sequence[Any], events: Iterable[Any]) -> list[tuple[str, Any]]:
    """("state", change) for each of ``changes`` (oldest first, each with ``at``) and
    ("verdict", event) for each packing verdict among ``events`` (each with ``at`` and
    ``kind``) since the first change shown, in time order (a change before a verdict of
    the same instant). The verdicts used to be read only among the job's last 20 events,
    which a job time-sliced for a while pushed out."""
    first = changes[0].at if changes else 0.0
    rows = [("state", t) for t in changes]
    rows += [("verdict", e) for e in events if e.kind == PACK_VERDICT and e.at >= first]
    return sorted(rows, key=lambda row: row[1].at)
