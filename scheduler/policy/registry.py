"""Policies by name, as ``--policy`` and the live scheduler's configuration name them."""

from __future__ import annotations

from scheduler.policy.base import Policy
from scheduler.policy.baselines import FifoPolicy, YarnCsLocalPolicy, YarnCsPolicy
from scheduler.policy.gandiva import GandivaPolicy
from scheduler.policy.tiresias import TiresiasPolicy
from scheduler.policy.types import PolicyConfig

POLICIES: dict[str, type[Policy]] = {
    "gandiva": GandivaPolicy,
    "fifo": FifoPolicy,
    "yarn-cs": YarnCsPolicy,
    "tiresias": TiresiasPolicy,
    "yarn-cs-local": YarnCsLocalPolicy,
}


def get_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """A fresh policy (with fresh state) by name; ValueError names the valid ones."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}"
        ) from None
    return cls(config)
