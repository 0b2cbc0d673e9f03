"""Scheduler commands as the shim sees them, independent of the wire format.

Commands arrive on the control stream at any time but take effect only at the next
training-step boundary (Horovod-elastic style), so they are plain values queued
by the stream thread and consumed by the training thread.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class Kind(enum.Enum):
    """What the scheduler asks for (mirrors gandiva.v1.CommandKind)."""

    SUSPEND = 1
    RESUME = 2
    CHECKPOINT = 3
    STOP_FOR_MIGRATION = 4
    KILL = 5


@dataclass(frozen=True)
class Command:
    """One queued command; `received_at` is monotonic seconds, for wait_boundary."""

    id: str
    kind: Kind
    checkpoint_dir: str = ""
    reason: str = ""
    received_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.kind in (Kind.CHECKPOINT, Kind.STOP_FOR_MIGRATION) and not self.checkpoint_dir:
            raise ValueError(f"command {self.id!r}: {self.kind.name} needs a checkpoint_dir")


@dataclass(frozen=True)
class Ack:
    """The answer to one command (mirrors gandiva.v1.CommandAck)."""

    command_id: str
    ok: bool
    message: str = ""
    checkpoint_path: str = ""
    step: int = 0
    durations_s: dict[str, float] = field(default_factory=dict)
    # Unix seconds of `step` (CommandAck.step_at): a suspend's, when mini-batch `step`
    # ended; a resume's, when the job went on training from it; 0: unknown.
    step_at: float = 0.0
