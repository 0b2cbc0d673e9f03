"""The hooks the live engine calls about what it does; by default they do nothing.

``LiveEngine.observer`` is an ``Observer``; ``gandiva scheduler --http-listen`` swaps in
``scheduler.observe.metrics.SchedulerMetrics``, which counts, times and logs. Kept
free of prometheus and of I/O so that the engine pays nothing when nobody watches.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.policy import types as pt


class Observer:
    def decided(self, snapshot: pt.ClusterSnapshot, decisions: Sequence[pt.Decision], seconds: float) -> None:
        """One scheduling round: the snapshot the policy saw, the decisions the engine
        will apply (jobs with commands in flight left out) and the policy's run time."""

    def not_done(self, at: float, job_id: str, why: str) -> None:
        """A decision of the policy's that was refused before it began (a move of a job
        whose runtime had just gone): nothing of it happened."""

    def started(self, waited_s: float) -> None:
        """A job placed for the first time, ``waited_s`` after its submission."""

    def switched(self, command: str, seconds: float) -> None:
        """A suspend or resume command acknowledged at a mini-batch boundary."""

    def migration_phase(self, phase: str, seconds: float) -> None:
        """One phase of a migration (prewarm, checkpoint, transfer, restore, ..., total)."""

    def move_ended(self, at: float, job_id: str, phase: str, seconds: float) -> None:
        """A move (migration, grow, shrink) of ``job_id`` ended: ``phase`` total (it moved,
        ``seconds`` from its stop to its first step there), one of unmoved.ENDED_UNMOVED, or
        "not done" (refused before it began, as the previous round's, which ``not_done`` said)."""

    def checkpoint_fetched(self, outcome: str, seconds: float) -> None:
        """A queued job's checkpoint streamed from the server that holds it to the one it
        was just placed on, before its launch (outcome: fetched or failed)."""

    def hang(self, outcome: str) -> None:
        """A verdict on a job that made no progress (scheduler/hangs.py): flagged (hung),
        moved_on (a flagged job's mini-batches end again), restarted (stopped and
        re-queued, or failed after its last restart) or not_exited (its program ended but
        its process lingers: said, nothing done)."""
