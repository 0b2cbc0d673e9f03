"""Exclusive, non-preemptive baselines: ``fifo`` and ``yarn-cs``.

- ``fifo`` models a strict first-come-first-served queue: jobs start in arrival order
  on dedicated GPUs, and the head of the queue blocks everyone behind it until it fits.
- ``yarn-cs`` models the Hadoop YARN capacity scheduler as the Gandiva paper used it
  for its baseline: one queue, jobs get dedicated GPUs and run to completion (no
  preemption, no time-sharing, no migration). Jobs are considered in arrival order,
  but a job that does not fit is skipped so smaller ones behind it can start
  (the capacity scheduler allocates whatever fits; no reservations are modelled).
  Placement prefers one server (best fit), and spreads over servers only when no
  single server has room, which is what a locality-unaware container allocator does.
- ``yarn-cs-local`` is ``yarn-cs`` with node locality: a job that fits one server waits
  for one server with room instead of being spread (the placement Gandiva's reactive
  mode uses). It is not the paper's baseline; it shows how much of a gain over
  ``yarn-cs`` comes from locality alone.
None of these policies keeps any state between calls.
"""

from __future__ import annotations

from typing import ClassVar

from scheduler.policy.base import Policy
from scheduler.policy.cluster import Ledger, Placement, arrival_key
from scheduler.policy.placement import (
    Filter,
    Misses,
    any_free_filter,
    best_fit,
    find_placement,
    missed,
    unallocated_filter,
)
from scheduler.policy.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Place,
    PolicyConfig,
    Queue,
    Resume,
)


def exclusive_placement(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Free GPUs only: best fit on one server, else whole idle servers, else spread."""
    gpus = any_free_filter(ledger, job, config)
    if gpus is not None and len({g.server for g in gpus}) > 1:
        gpus = unallocated_filter(ledger, job, config) or gpus
    return gpus


def local_placement(ledger: Ledger, job: JobView, config: PolicyConfig) -> Placement | None:
    """Free GPUs on one server for a job that fits one; else as ``exclusive_placement``."""
    if job.gpus <= ledger.max_server_gpus:
        return best_fit(ledger, job.gpus, job, config)
    return exclusive_placement(ledger, job, config)


EXCLUSIVE: list[tuple[str, Filter]] = [("exclusive", exclusive_placement)]
LOCAL: list[tuple[str, Filter]] = [("local", local_placement)]


class _Exclusive(Policy):
    strict = False
    filters: ClassVar[list[tuple[str, Filter]]] = EXCLUSIVE
    queue_by = staticmethod(arrival_key)

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        ledger = self.ledger_for(snapshot)
        out: list[Decision] = []
        blocked_by: str | None = None
        reasons = self.config.queue_reasons
        # GPU counts that found no room at a ledger version (find_placement keeps them):
        # binds only take GPUs away, so a later job of that count cannot fit either
        # until something changes.
        misses: Misses = {}

        def skip(size: int) -> bool:
            return not reasons and (blocked_by is not None or missed(ledger, misses, self.filters, size))

        self._resume_left_suspended(ledger, out)
        for job in ledger.queued_in_order(skip):
            if blocked_by is not None:
                out.append(Queue(job.id, f"behind job {blocked_by} (first come, first served)"))
                continue
            cand = find_placement(ledger, job, self.config, self.filters, misses)
            if cand is None:
                if reasons:
                    out.append(Queue(job.id, f"needs {job.gpus} free GPUs"))
                if self.strict:
                    blocked_by = job.id
                continue
            ledger.bind(job.id, cand.gpus, "RUNNING")
            out.append(Place(job.id, cand.gpus, reason=f"{self.name}: dedicated GPUs"))
        return out

    def _resume_left_suspended(self, ledger: Ledger, out: list[Decision]) -> None:
        """Jobs another policy left suspended (the scheduler restarted with this one while
        jobs were time-sliced) keep their GPUs; this policy never suspends, so nothing
        else would ever resume them: each is resumed once nothing runs on its GPUs, the
        first submitted first. Before, they stayed SUSPENDED for good, holding their GPUs."""
        for job_id in sorted(ledger.by_state.get("SUSPENDED", ()), key=lambda j: arrival_key(ledger.jobs[j])):
            gpus = ledger.placement[job_id]
            if any(ledger.state[other] in ("RUNNING", "MIGRATING") for g in gpus for other in ledger.bound.get(g, ())):
                continue
            ledger.set_state(job_id, "RUNNING")
            out.append(Resume(job_id, gpus, reason=f"{self.name}: its GPUs are free again (it was suspended "
                                                   "under another policy, which time-sliced them)"))


class FifoPolicy(_Exclusive):
    """Strict first-come-first-served on dedicated GPUs."""

    name = "fifo"
    strict = True


class YarnCsPolicy(_Exclusive):
    """YARN capacity scheduler: dedicated GPUs, no preemption, skip what does not fit."""

    name = "yarn-cs"
    strict = False


class YarnCsLocalPolicy(_Exclusive):
    """yarn-cs with node locality: a job that fits one server is never spread."""

    name = "yarn-cs-local"
    strict = False
    filters = LOCAL
