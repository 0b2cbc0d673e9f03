"""The scheduler's own health: whether its database answers, and how its scheduling
rounds fare. Kept in memory (it must answer while the database does not): /metrics,
/api/state, the dashboard and every call refused for the database read it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

ROUND_OUTCOMES = ("ok", "skipped", "failed")


def clock_text(at: float) -> str:
    """HH:MM:SS UTC of a unix time (a person compares it with their watch)."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


@dataclass
class DatabaseHealth:
    """Connectivity of the scheduler's database, as its transactions found it: down from
    the first one that could not reach it, up again with the first one that completed.
    Scheduling rounds are counted by outcome: ok, skipped (the database could not be
    read or written: the round decided nothing), failed (a bug, logged with its trace)."""

    clock: Callable[[], float] = time.time
    up: bool = True
    down_since: float = 0.0
    reason: str = ""
    rounds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUND_OUTCOMES, 0))
    last_round_ok_at: float = 0.0
    started_at: float = 0.0  # (set at creation) what the round age counts from before a first round
    # The last write the database refused for a full disk or a read-only file, and when: it
    # is reachable meanwhile (reads work), so only this says so (`gandiva get problems`).
    write_failed: str = ""
    write_failed_at: float = 0.0

    def __post_init__(self) -> None:
        self.started_at = self.started_at or self.clock()

    def round_age(self) -> float:
        """Seconds since the last scheduling round that completed, or since this scheduler
        started when none has yet (a first round stuck behind a lock is a stall too)."""
        return max(0.0, self.clock() - (self.last_round_ok_at or self.started_at))

    def unreachable(self, reason: str) -> str:
        """A transaction could not reach the database for `reason`: the text a refused
        call carries (the outage's start stays that of its first failure)."""
        if self.up:
            self.up, self.down_since = False, self.clock()
        self.reason = reason
        return self.text()

    def reached(self) -> None:
        if not self.up:
            self.up, self.down_since, self.reason = True, 0.0, ""

    def cannot_write(self, what: str) -> None:
        self.write_failed, self.write_failed_at = what, self.clock()

    def round_ended(self, outcome: str) -> None:
        self.rounds[outcome] += 1
        if outcome == "ok":
            self.last_round_ok_at = self.clock()

    def text(self) -> str:
        """One line for people: "" while the database answers."""
        if self.up:
            return ""
        return (f"the scheduler is up; its database is unreachable since {clock_text(self.down_since)} "
                f"({self.reason})")

    def as_dict(self) -> dict[str, object]:
        return {"up": self.up, "since": self.down_since or None, "reason": self.reason, "text": self.text(),
                "rounds": dict(self.rounds), "last_round_ok_at": self.last_round_ok_at or None,
                "write_failed": self.write_failed, "write_failed_at": self.write_failed_at or None}
