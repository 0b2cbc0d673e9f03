"""The scheduling policy: pure code, an immutable ClusterSnapshot in, decisions out.

It imports no grpc, sqlalchemy, asyncio or wall clock (a test enforces that), so the
live scheduler and the simulator drive exactly the same code.
"""

from scheduler.policy.types import (
    ClusterSnapshot,
    Decision,
    GpuRef,
    Grow,
    JobProfile,
    JobView,
    Migrate,
    Pack,
    Place,
    PolicyConfig,
    Queue,
    Resume,
    ServerView,
    Shrink,
    Suspend,
    Unpack,
)

__all__ = [
    "ClusterSnapshot", "Decision", "GpuRef", "Grow", "JobProfile", "JobView", "Migrate",
    "Pack", "Place", "PolicyConfig", "Queue", "Resume", "ServerView", "Shrink", "Suspend",
    "Unpack",
]
