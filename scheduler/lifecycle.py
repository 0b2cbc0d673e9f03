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


def trains(state: str, came_from: str, goes_to: str) -> bool:
    """Whether a job's stretch in ``state`` is GPU time it had: RUNNING, or a move of a running
    job (MIGRATING entered from RUNNING), which trains on at its source while its copy
    pre-warms (10-30 s a move in `gandiva demo`) until the stop that pauses it for a fraction
    of a second; not one that ends in the queue (its server lost, the move failed: when it
    stopped is not known). ``came_from``: the state before it ("": not known); ``goes_to``:
    the state after it ("": it goes on). The one rule of a job's attained service
    (scheduler.state.repo.transition), `gandiva get usage`'s GPU time and the GPU-time split
    (scheduler/observe): before session 53 the pre-warm's training counted in none of them."""
    return state == "RUNNING" or (state == "MIGRATING" and came_from == "RUNNING" and goes_to != "QUEUED")
