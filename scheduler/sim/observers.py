"""Observers for ``Simulator(observer=...)``, called after every event with the time and the
unfinished jobs: what tests and benchmarks watch a replay for."""

from __future__ import annotations

from typing import Any


class GroupWatch:
    """Pass as ``observer=``; ``most`` is then the most jobs one GPU set held at any event."""

    def __init__(self) -> None:
        self.most = 0

    def __call__(self, now: float, active: dict[str, Any]) -> None:
        groups: dict[tuple, int] = {}
        for job in active.values():
            if job.placement:
                groups[job.placement] = groups.get(job.placement, 0) + 1
        self.most = max([self.most, *groups.values()])
