"""The Policy interface every scheduling policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

from scheduler.policy.types import ClusterSnapshot, Decision, PolicyConfig


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

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()

    @abstractmethod
    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        """What to change now; an empty list means: leave everything as it is."""

    def next_wakeup(self) -> float | None:
        """The earliest time decide() would act with no new event (None: only on events)."""
        return None
