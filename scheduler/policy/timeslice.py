"""Priority-weighted round-robin time-slicing inside each time-slice group.

A group is the set of jobs bound to exactly the same GPUs. One *unit* of the group
runs at a time: a single job, or a pair that packing decided to keep together (both
run at once). The running unit keeps the GPUs for ``quantum_s x weight`` (weight =
the highest priority in the unit, at least 1), then the unit that has waited longest
gets them. Slices end on a cluster-wide beat of ``quantum_s`` (see ``_slice_end``).
Suspend/resume happen at the jobs' next mini-batch boundary (live side).

Two rules of our own, on by default and each measured on and off (docs/policy.md):
- ``las_slices``: when a slice ends, the unit with the least attained service (GPU-seconds
  per GPU of its least-served job) runs next, the running unit included (it then keeps
  the GPUs, no switch); ties go to the running unit, then to the one waiting longest.
  Short and new jobs finish first, as under Tiresias, but inside a group and at once.
- ``slice_growth`` g > 0: a unit's slice is g x its attained service per GPU (at least
  ``quantum_s``, at most ``MAX_SLICE_QUANTA`` quanta), times its weight: a job that has
  run for days switches every half hour, not every minute, while new jobs keep
  minute-long slices (and a newcomer still starts at once: placement suspends the
  incumbent).
"""

from __future__ import annotations

import math

from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.state import GandivaState
from scheduler.policy.types import Decision, PolicyConfig, Resume, Suspend


def group_units(ledger: Ledger, members: list[str], state: GandivaState) -> list[tuple[str, ...]]:
    """Split a group into units: everything running is one unit; kept pairs stay together."""
    running = tuple(sorted(m for m in members if ledger.state[m] == "RUNNING"))
    units: list[tuple[str, ...]] = [running] if running else []
    seen = set(running)
    for m in sorted(members, key=lambda j: (ledger.jobs[j].last_state_change_at, j)):
        if m in seen or ledger.state[m] != "SUSPENDED":
            continue
        partner = state.kept_pairs.get(m)
        if partner in members and partner not in seen and ledger.state[partner] == "SUSPENDED":
            units.append((m, partner))
            seen.update((m, partner))
        else:
            units.append((m,))
            seen.add(m)
    return units


# The longest slice slice_growth can give, in quanta.
MAX_SLICE_QUANTA = 32


def _served(ledger: Ledger, unit: tuple[str, ...], at: float) -> float:
    """Attained service per GPU, in seconds, of the unit's least-served job at ``at``."""
    return min(ledger.jobs[j].attained_at(at) / max(1, len(ledger.placement.get(j, ())) or ledger.jobs[j].gpus)
               for j in unit)


def _slice_of(ledger: Ledger, unit: tuple[str, ...], config: PolicyConfig, at: float) -> float:
    base = config.quantum_s
    if config.slice_growth > 0:
        grown = config.slice_growth * _served(ledger, unit, at)
        base = min(max(base, grown), MAX_SLICE_QUANTA * config.quantum_s)
    return base * max(ledger.jobs[j].weight for j in unit)


def _next_unit(ledger: Ledger, units: list[tuple[str, ...]], config: PolicyConfig,
               running: tuple[str, ...] = ()) -> tuple[str, ...]:
    def waited(u: tuple[str, ...]) -> tuple[float, int, tuple[str, ...]]:
        # The unit suspended longest goes next; higher priority breaks ties.
        return (min(ledger.jobs[j].last_state_change_at for j in u), -max(ledger.jobs[j].priority for j in u), u)

    if config.las_slices:
        now = ledger.snapshot.now
        return min(units, key=lambda u: (_served(ledger, u, now), u != running, waited(u)))
    return min(units, key=waited)


def rotate(ledger: Ledger, state: GandivaState, config: PolicyConfig) -> list[Decision]:
    """Suspend units whose slice is over and resume the next in each group."""
    now = ledger.snapshot.now
    out: list[Decision] = []
    candidates = set(ledger.shared)
    candidates.update(ledger.placement[j] for j in ledger.by_state.get("SUSPENDED", ()))
    for gpus in sorted(candidates):
        members = ledger.members(gpus)
        if len(members) == 1 and ledger.state[members[0]] != "SUSPENDED":
            continue
        if any(ledger.state[m] == "MIGRATING" for m in members):
            continue
        if any(m in state.trials for m in members):
            continue  # the trial's verdict comes first (judge_trials wakes the policy)
        if any(m in ledger.changed for m in members):
            # Changed in this very call: its slice starts now.
            state.wake_at(_slice_end(now + config.quantum_s, config))
            continue
        running_ids = [m for m in members if ledger.state[m] == "RUNNING"]
        if len(running_ids) == len(members):
            continue  # nobody waits: a kept pack, or a lone job
        if any(not ledger.jobs[m].suspendable for m in running_ids):
            continue  # it cannot be stopped: the others wait for it to end
        if running_ids:
            # Cheap test first: most groups are in the middle of a slice.
            started = max(ledger.jobs[j].last_state_change_at for j in running_ids)
            ends = _slice_end(started + _slice_of(ledger, tuple(running_ids), config, started), config)
            if now < ends:
                state.wake_at(ends)
                continue
        units = group_units(ledger, members, state)
        # The running unit, if any, comes first; the others wait.
        running = units[0] if running_ids else ()
        waiting = units[1:] if running_ids else units
        if not waiting:
            continue
        # Under las_slices the running unit competes too (and keeps the GPUs if it wins).
        nxt = _next_unit(ledger, units if config.las_slices else waiting, config, running)
        if nxt == running:
            # It still has the least attained service: it keeps the GPUs.
            state.wake_at(_slice_end(now + _slice_of(ledger, running, config, now), config))
            continue
        for j in running:
            ledger.set_state(j, "SUSPENDED")
            out.append(Suspend(j, reason=f"time slice of {now - started:.0f}s over"))
        out.extend(_resume_unit(ledger, nxt, gpus, config, state))
    return out


def _resume_unit(ledger: Ledger, unit: tuple[str, ...], gpus: Placement,
                 config: PolicyConfig, state: GandivaState) -> list[Decision]:
    out: list[Decision] = []
    for j in unit:
        ledger.set_state(j, "RUNNING")
        out.append(Resume(j, gpus, reason="its turn in the time-slice group"))
    now = ledger.snapshot.now
    state.wake_at(_slice_end(now + _slice_of(ledger, unit, config, now), config))
    return out


def _slice_end(ends: float, config: PolicyConfig) -> float:
    """The beat (a multiple of quantum_s) at which a slice ending at ``ends`` is switched.

    Slices end on a cluster-wide beat so that all groups switch together: one round of
    commands per beat instead of one per group. Only a job's first slice is stretched
    (by less than a quantum); ``slice_slack_s`` keeps a slice that ends just after a
    beat from waiting for the next one.
    """
    return math.ceil((ends - config.slice_slack_s) / config.quantum_s) * config.quantum_s
