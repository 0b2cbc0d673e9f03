"""The Policy interface every scheduling policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from scheduler.policy.cluster import Ledger, QueueKey, queue_key
from scheduler.policy.types import ClusterSnapshot, Decision, JobView, PolicyConfig


class Policy(ABC):
    """Snapshot in, decisions out. Subclasses keep cross-call memory in ``self.state``.

    name: the registry name (``--policy``).
    preemption: how the policy's suspend/resume is realised: ``"hook"`` (the job-side
        shim suspends at a mini-batch boundary, Gandiva) or ``"restart"``
        (checkpoint, kill and restart, as a scheduler without a job-side hook must).
        The simulator charges the mechanism costs accordingly.
    """

    name: str = ""
    preemption: str = "hook"
    # The queue order of the ledger's queue index (Ledger.queued_in_order).
    queue_by: Callable[[JobView], QueueKey] = staticmethod(queue_key)

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._ledger: Ledger | None = None

    def ledger_for(self, snapshot: ClusterSnapshot,
                   holds: Callable[[JobView], bool] | None = None) -> Ledger:
        """The occupancy ledger for this call, kept between calls and synced to the snapshot
        (a fresh policy builds it from scratch, so nothing depends on the kept copy)."""
        if self._ledger is None:
            self._ledger = Ledger.of(snapshot, holds, self.queue_by)
        else:
            self._ledger = self._ledger.sync(snapshot, holds)
        return self._ledger

    def ledger_of(self, snapshot: ClusterSnapshot) -> Ledger:
        """The ledger the last ``decide`` synced to this very ``snapshot`` (with the changes
        its decisions made, on the groups they touched), else a fresh one of it, not kept:
        for views of the cluster read right after a round (scheduler/observe/waits.py),
        which built a second ledger of every job each round."""
        if self._ledger is not None and self._ledger.snapshot is snapshot:
            return self._ledger
        return Ledger.of(snapshot, None, self.queue_by)

    @abstractmethod
    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        """What to change now; an empty list means: leave everything as it is."""

    def next_wakeup(self) -> float | None:
        """The earliest time decide() would act with no new event (None: only on events)."""
        return None
