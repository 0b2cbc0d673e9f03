"""Where a waiting job stands: a queued job's place in the queue, a suspended job's next turn.

The two questions users ask most about a job that does not run. Both answers are computed
each scheduling round from the state the policy has just decided from, with the policy's own
code, never a second guess of it:
- a queued job's place is its rank under the policy's queue order (``Policy.queue_by``, the
  key of the ledger's queue index that the placement walk follows: priority, then
  submission); the jobs ahead of it are named. The walk may still start a later job first
  when it fits and this one does not (its reason, the job's message, says what it waits
  for: GPUs of which size, a reservation, a block);
- a suspended job's next turn comes from its time-slice group as Gandiva's rotation sees it
  (``timeslice.group_units``, the ``las_slices`` order ``_rank``/``_next_unit``, the slice
  lengths ``_slice_of`` and beats ``_slice_end``) and the time the policy will next look at
  the group (``SliceBook.due``). It assumes nothing else changes meanwhile (no job arrives,
  ends or moves).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence

from scheduler.policy.base import Policy
from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.state import GandivaState
from scheduler.policy.types import ClusterSnapshot, JobView, PolicyConfig

# How many of the jobs ahead (or taking turns before) a job are named.
NAMED = 3


@dataclasses.dataclass(frozen=True)
class Wait:
    """``text`` for people; ``place``: 1 for the next in line; ``state``: the job's state it
    was computed for (shown only while the job is still in it); ``at``: when the next turn
    is expected (scheduler clock), shown as a time and "in ~Ns" from the moment it is read."""

    text: str
    place: int
    state: str
    at: float | None = None

    def render(self, now: float) -> str:
        if self.at is None:
            return self.text
        clock = time.strftime("%H:%M:%S", time.gmtime(self.at))
        left = self.at - now
        when = f"in ~{left:.0f}s" if left >= 1 else "due now"
        return f"{self.text}; expected at about {clock} UTC ({when})"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _named(ids: Sequence[str], describe: dict[str, str]) -> str:
    shown = ", ".join(f"{j} ({describe[j]})" if describe.get(j) else j for j in ids[:NAMED])
    return shown + (f" and {len(ids) - NAMED} more" if len(ids) > NAMED else "")


def queue_places(policy: Policy, jobs: Sequence[JobView]) -> dict[str, Wait]:
    """Each queued job's place under the policy's queue order, and who is ahead of it."""
    queued = sorted((j for j in jobs if j.state == "QUEUED"), key=policy.queue_by)
    about = {j.id: f"{j.gpus} GPU{'s' if j.gpus > 1 else ''}" + (f", priority {j.priority}" if j.priority else "")
             for j in queued}
    out: dict[str, Wait] = {}
    total = len(queued)
    for i, job in enumerate(queued):
        if i == 0:
            text = f"1st of {total} in the queue" if total > 1 else "the only job in the queue"
        else:
            ahead = [j.id for j in queued[:i]]
            text = (f"{_ordinal(i + 1)} of {total} in the queue (priority, then submission); "
                    f"ahead of it: {_named(ahead, about)}")
        out[job.id] = Wait(text, i + 1, "QUEUED")
    return out


def next_turns(policy: Policy, snap: ClusterSnapshot, held: Collection[str] = (),
               changed: Collection[str] = ()) -> dict[str, Wait]:
    """Each suspended job's next turn in its time-slice group, for Gandiva's rotation
    (``held``: jobs an operator suspended, which take no turn)."""
    from scheduler.policy import timeslice as ts

    state = getattr(policy, "state", None)
    if not isinstance(state, GandivaState) or not any(j.state == "SUSPENDED" for j in snap.jobs):
        return {}  # a policy without time-slice groups, or nobody waits for a turn
    book, cfg = state.slices, policy.config
    ledger = Ledger.of(snap, None, policy.queue_by)
    now = snap.now
    groups: set[Placement] = {ledger.placement[j] for j in ledger.by_state.get("SUSPENDED", ())
                              if j not in held and ledger.placement.get(j)}
    out: dict[str, Wait] = {}
    for gpus in sorted(groups):
        members = [m for m in ledger.members(gpus) if m not in held]
        if any(m in changed for m in members):
            continue  # its turns were just changed: the next round's snapshot shows how
        units = ts.group_units(ledger, members, state)
        running = units[0] if units and ledger.state[units[0][0]] == "RUNNING" else ()
        waiting = [u for u in units if u != running and all(ledger.state[j] == "SUSPENDED" for j in u)]
        if not waiting:
            continue
        where = ",".join(f"{g.server}/{g.index}" for g in gpus)
        blocked = _blocked(ledger, state, members)
        order = _order(ledger, state, cfg, waiting, now)
        starts = _starts(ledger, cfg, book.due.get(gpus), running, order, now)
        now_text = f"{', '.join(running)} runs now" if running else "nothing runs there now"
        for i, unit in enumerate(order):
            before = [j for u in order[:i] for j in u]
            text = (f"{_ordinal(i + 1)} of {len(order)} waiting in its time-slice group on {where} "
                    f"({len(members)} jobs, slices of {cfg.quantum_s:g}s or more); {now_text}")
            if before:
                text += f", then {_named(before, {})}"
            at = None
            if blocked:
                text += f"; {blocked}"
            elif starts is not None:
                at = starts[i]
            for j in unit:
                out[j] = Wait(text, i + 1, "SUSPENDED", at)
    return out


def _blocked(ledger: Ledger, state: GandivaState, members: Sequence[str]) -> str:
    """Why the group does not rotate now ("" when it does), as rotation's ``_look_at`` skips it."""
    if any(ledger.state[m] == "MIGRATING" for m in members):
        return "its group takes no turns while one of its jobs is being moved"
    if any(m in state.trials for m in members):
        return "its group is in a packing trial: turns go on after the trial's verdict"
    stuck = [m for m in members if ledger.state[m] == "RUNNING" and not ledger.jobs[m].suspendable]
    if stuck:
        return f"{stuck[0]} cannot be suspended (not under the runtime): the group waits for it to end"
    return ""


def _order(ledger: Ledger, state: GandivaState, cfg: PolicyConfig, waiting: list[tuple[str, ...]],
           now: float) -> list[tuple[str, ...]]:
    """The waiting units in the order rotation resumes them: ``_next_unit`` asked again and
    again (a suspended unit's service stands still, so its rank does not move meanwhile)."""
    from scheduler.policy import timeslice as ts

    left, order = list(waiting), []
    rank: Callable[[tuple[str, ...]], tuple[int, float]] | None = None
    served: dict[tuple[str, ...], float] | None = None
    if cfg.las_slices:
        served = {u: ts._served(ledger, u, now) for u in left}
        table, fifo_s = ts._order_inputs(state, cfg)
        if fifo_s is not None or cfg.starve_factor > 0 or table is not None or cfg.eldest_runs:
            rank = ts._rank(ledger, cfg, now, served, table, fifo_s)
    while left:
        nxt = ts._next_unit(ledger, left, (), served, rank)
        order.append(nxt)
        left.remove(nxt)
    return order


def _starts(ledger: Ledger, cfg: PolicyConfig, due: float | None, running: tuple[str, ...],
            order: list[tuple[str, ...]], now: float) -> list[float] | None:
    """When each unit of ``order`` is expected to start: the group's next switch (when the
    policy looks at it next, ``SliceBook.due``), then one slice after another on the beat."""
    from scheduler.policy import timeslice as ts

    if due is None:
        return None
    at = max(due, now)
    if running and cfg.las_slices:
        # Under las_slices the running unit keeps the GPUs at a switch while it still has
        # less service than the first waiting unit: then the switch comes at the beat after
        # its service passes that unit's (as rotation's _look_at computes it).
        mine = ts._served(ledger, running, now) + (at - now)
        first = ts._served(ledger, order[0], now)
        if mine < first:
            crossing = now + (first - ts._served(ledger, running, now))
            q = cfg.quantum_s
            at = max(at, (int(crossing // q) + 1) * q)
    starts = []
    for unit in order:
        starts.append(at)
        at = ts._slice_end(at + ts._slice_of(ledger, unit, cfg, at), cfg)
    return starts


def waits(policy: Policy, snap: ClusterSnapshot, held: Collection[str] = (),
          changed: Collection[str] = ()) -> dict[str, Wait]:
    """Both answers for every waiting job of ``snap`` (job id -> its Wait). ``changed``: jobs
    with a decision not carried out in ``snap`` yet (placed, suspended, resumed, moved): left
    out of the queue, and their time-slice groups left out until a snapshot shows them."""
    out = queue_places(policy, [j for j in snap.jobs if j.id not in changed])
    out.update(next_turns(policy, snap, held, changed))
    return out
