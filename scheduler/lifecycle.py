"""The job state machine: every allowed transition, in one place.

Repositories call :func:`check_transition` before writing a state change, so a
job can never jump, say, from SUCCEEDED back to RUNNING, whoever asks.
"""

from __future__ import annotations

import enum

from scheduler.errors import FailedPrecondition


class JobState(str, enum.Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    MIGRATING = "MIGRATING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED})
ACTIVE = frozenset({JobState.RUNNING, JobState.SUSPENDED, JobState.MIGRATING})

# to-state -> the states a job may be in to enter it.
ALLOWED_FROM: dict[JobState, frozenset[JobState]] = {
    # Placed (or re-placed after losing its server or being preempted back to the queue).
    JobState.RUNNING: frozenset({JobState.QUEUED, JobState.SUSPENDED, JobState.MIGRATING}),
    JobState.SUSPENDED: frozenset({JobState.RUNNING}),
    JobState.MIGRATING: frozenset({JobState.RUNNING, JobState.SUSPENDED}),
    # Back to the queue: its server went down, or its process was lost.
    JobState.QUEUED: frozenset(ACTIVE),
    # From the queue: a job re-queued when its server was taken for lost, whose launch had
    # finished meanwhile, its exit late (SchedulerCore._settles_lost_launch).
    JobState.SUCCEEDED: frozenset({JobState.RUNNING, JobState.MIGRATING, JobState.QUEUED}),
    # A job that can never be placed fails from the queue.
    JobState.FAILED: frozenset({JobState.QUEUED} | ACTIVE),
    JobState.KILLED: frozenset({JobState.QUEUED} | ACTIVE),
}


def check_transition(job_id: str, current: JobState, target: JobState) -> None:
    """Raise FailedPrecondition unless `current` -> `target` is allowed."""
    if current not in ALLOWED_FROM[target]:
        allowed = ", ".join(sorted(s.value for s in ALLOWED_FROM[target]))
        raise FailedPrecondition(
            f"job {job_id} is {current.value}; it can become {target.value} only from {allowed}"
        )
