"""The scheduling policy: pure code, an immutable ClusterSnapshot in, decisions out.

It imports no grpc, sqlalchemy, asyncio or wall clock (a test enforces that), so the
live scheduler and the simulator drive exactly the same code.
"""

from scheduler.policy.base import Policy
from scheduler.policy.cluster import cluster_height, server_affinity, server_height
from scheduler.policy.registry import POLICIES, get_policy
from scheduler.policy.types import (
    ClusterSnapshot,
    Decision,
    GpuRef,
    Grow,
    JobProfile,
    JobView,
    Migrate,
    Pack,
    Park,
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
    "POLICIES",
    "ClusterSnapshot",
    "Decision",
    "GpuRef",
    "Grow",
    "JobProfile",
    "JobView",
    "Migrate",
    "Pack",
    "Park",
    "Place",
    "Policy",
    "PolicyConfig",
    "Queue",
    "Resume",
    "ServerView",
    "Shrink",
    "Suspend",
    "Unpack",
    "cluster_height",
    "get_policy",
    "server_affinity",
    "server_height",
]
