"""What Gandiva remembers between decide() calls (kept in memory, never persisted).

Losing it (a scheduler restart) is safe: running packs are then adopted as kept,
rejected pairs may be tried once more, and timers start again.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PackTrial:
    """A packing trial: ``job_id`` was packed onto ``partner_id``'s GPUs at ``started_at``.

    base_rates are the two jobs' mini-batch rates when each ran alone; the trial is
    kept when the packed rates, normalized by these, sum to more than time-slicing's 1.
    """

    job_id: str
    partner_id: str
    started_at: float
    base_rates: tuple[float, float]


@dataclass
class SliceBook:
    """When each time-slice group next needs a look (scheduler/policy/timeslice.py).

    due: the time a group's slice ends (a group with nothing to decide until it changes
    has none); heap: (time, group) entries, stale once ``due`` says otherwise; kept: the
    unit that kept its group's GPUs under ``las_slices``, and until when.
    """

    due: dict[tuple, float] = field(default_factory=dict)
    heap: list[tuple[float, tuple]] = field(default_factory=list)
    kept: dict[tuple, tuple[tuple[str, ...], float]] = field(default_factory=dict)


@dataclass
class GandivaState:
    """Packing trials and verdicts, defragmentation and grow timers, slice ends."""

    trials: dict[str, PackTrial] = field(default_factory=dict)
    kept_pairs: dict[str, str] = field(default_factory=dict)
    rejected: set[frozenset[str]] = field(default_factory=set)
    last_defrag_at: float | None = None
    idle_since: float | None = None
    # The earliest time at which decide() would act without any new event (slice end,
    # trial end, defrag or grow timer); the simulator wakes the policy then.
    next_wakeup: float | None = None
    slices: SliceBook = field(default_factory=SliceBook)

    def wake_at(self, when: float) -> None:
        if self.next_wakeup is None or when < self.next_wakeup:
            self.next_wakeup = when

    def drop_trials_of(self, job_id: str) -> None:
        """End any trial the job takes part in (it was suspended or moved)."""
        for guest, trial in list(self.trials.items()):
            if job_id in (guest, trial.partner_id):
                del self.trials[guest]

    def forget_missing(self, live_ids: Container[str]) -> None:
        """Drop trials, kept pairs and rejected job pairs of jobs that finished or were killed."""
        for job_id, trial in list(self.trials.items()):
            if job_id not in live_ids or trial.partner_id not in live_ids:
                del self.trials[job_id]
        for a, b in list(self.kept_pairs.items()):
            if a not in live_ids or b not in live_ids:
                del self.kept_pairs[a]
        # A verdict on a pair of jobs outlives neither job, so those stay bounded by the live
        # jobs; verdicts on a pair of models ("model:...") are knowledge kept for later jobs.
        self.rejected = {
            pair for pair in self.rejected
            if all(not k.startswith("job:") or k[len("job:"):] in live_ids for k in pair)
        }
