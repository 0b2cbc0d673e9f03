"""Where a waiting job stands: a queued job's place in the queue, a suspended job's next turn.

The two questions users ask most about a job that does not run. Both answers are computed
each scheduling round from the state the policy has just decided from, with the policy's own
code, never a second guess of it:
- a queued job's place is its rank under the policy's queue order (``Policy.queue_by``, the
  key of the ledger's queue index that the placement walk follows: priority, then
  submission); the jobs ahead of it are named. The walk may still start a later job first
  when it fits and this one does not (its reason, the job's message, says what it waits
  for: GPUs of which size, a reservation, a block);
- a suspended job's next turn is when the policy's own rotation resumes it: a copy of the
  policy, given the job's time-slice group and what the rotation remembers, is asked at each
  time it would act, in virtual time, its decisions carried out at once (``_rotation``).
  Least attained service is not a round-robin (the job just suspended may come back before
  one waiting longer), so no order is derived by hand. It assumes nothing else changes
  meanwhile (no job arrives, ends or moves; a suspend or resume takes no time).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Collection, Sequence

from scheduler.policy.base import Policy
from scheduler.policy.cluster import Ledger, Placement
from scheduler.policy.state import GandivaState
from scheduler.policy.types import ClusterSnapshot, Decision, JobView, Queue, Resume, Suspend

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
    note: str = ""  # what the time assumes, said after it

    def render(self, now: float) -> str:
        if self.at is None:
            return self.text + (f"; {self.note}" if self.note else "")
        clock = time.strftime("%H:%M:%S", time.gmtime(self.at))
        left = self.at - now
        when = f"in ~{left:.0f}s" if left >= 1 else "due now"
        return f"{self.text}; expected at about {clock} UTC ({when})" + (f"; {self.note}" if self.note else "")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _named(ids: Sequence[str], describe: dict[str, str], total: int | None = None) -> str:
    """The first NAMED of ``ids`` and how many more (``total``: how many there are, when
    ``ids`` holds only the first of them)."""
    total = len(ids) if total is None else total
    shown = ", ".join(f"{j} ({describe[j]})" if describe.get(j) else j for j in ids[:NAMED])
    return shown + (f" and {total - NAMED} more" if total > NAMED else "")


# The queued jobs (the first, in the queue's order) told which later jobs passed them.
PASSED_LOOKED = 100


def _about(j: JobView) -> str:
    return f"{j.gpus} GPU{'s' if j.gpus > 1 else ''}" + (f", priority {j.priority}" if j.priority else "")


def queue_places(policy: Policy, jobs: Sequence[JobView]) -> dict[str, Wait]:
    """Each queued job's place under the policy's queue order, who is ahead of it, and the
    later jobs that passed it: a place said only who was ahead, so a 2-GPU job read "the only
    job in the queue" for 319 s (s46, `gandiva demo`) while nine 1-GPU jobs submitted after
    it started at once, and nothing said that they had, or why."""
    queued = sorted((j for j in jobs if j.state == "QUEUED"), key=policy.queue_by)
    about = {j.id: _about(j) for j in queued}
    # Jobs on GPUs now (placed, suspended in a group, moving), by submission.
    placed = sorted((j for j in jobs if j.state in ("RUNNING", "SUSPENDED", "MIGRATING")),
                    key=lambda j: (j.submitted_at, j.arrival, j.id))
    keys = [(j.submitted_at, j.arrival) for j in placed]
    out: dict[str, Wait] = {}
    total = len(queued)
    for i, job in enumerate(queued):
        if i == 0:
            text = f"1st of {total} in the queue" if total > 1 else "the only job in the queue"
        else:
            # Only the named ones: a list of all i ahead was quadratic in the queue's
            # length, every round (8,000 queued jobs: 1.4 s a round).
            ahead = [j.id for j in queued[:min(i, NAMED)]]
            text = (f"{_ordinal(i + 1)} of {total} in the queue (priority, then submission); "
                    f"ahead of it: {_named(ahead, about, i)}")
        if i < PASSED_LOOKED:
            text += _passed(job, placed, keys)
        out[job.id] = Wait(text, i + 1, "QUEUED")
    return out


def _passed(job: JobView, placed: Sequence[JobView], keys: Sequence[tuple[float, int]]) -> str:
    """"; passed by ..." naming the jobs on GPUs now that were submitted after ``job`` with no
    higher priority (they went ahead of it: not by the queue's order), and why they could."""
    at = bisect.bisect_right(keys, (job.submitted_at, job.arrival))
    later = [j for j in placed[at:] if j.priority <= job.priority]
    if not later:
        return ""
    smaller = all(j.gpus < job.gpus for j in later)
    why = ("smaller jobs start on GPUs free for them, or join a time-slice group of their size, while it "
           "waits for its own GPU count" if smaller else
           "a later job that fits starts while this one does not fit")
    return (f"; passed by {_named([j.id for j in later], {j.id: _about(j) for j in later[:NAMED]})}, submitted "
            f"after it and on GPUs now: the policy's placement walk goes on past a job that does not fit "
            f"({why}; its message says what it waits for)")


# What one group's turns were worked out from, and the resumes found: kept between rounds by
# the caller, so that a group is worked out again only when it changed (at its switches).
TurnCache = dict[Placement, tuple[tuple, list[tuple[float, str]]]]
# The time a round may spend working turns out; groups left over are worked out next round.
BUDGET_S = 0.1


def next_turns(policy: Policy, snap: ClusterSnapshot, held: Collection[str] = (),
               changed: Collection[str] = (), cache: TurnCache | None = None,
               lag_s: float = 0.0) -> dict[str, Wait]:
    """Each suspended job's next turn in its time-slice group, for Gandiva's rotation
    (``snap``: where the policy just decided from it, ``changed`` names the jobs its
    decisions acted on, and the jobs on their GPUs, as ``waits`` does: read from the
    policy's own ledger, those groups are left out; ``held``: jobs an operator suspended,
    which take no turn; ``cache``: what earlier calls worked out, kept by the caller;
    ``lag_s``: how long after the time the policy asks to be
    called its round comes, on average: the live engine's rounds come every tick, so its
    decisions, and the attained service they compare, are that much later)."""
    from scheduler.policy import timeslice as ts

    state = getattr(policy, "state", None)
    if not isinstance(state, GandivaState) or not any(j.state == "SUSPENDED" for j in snap.jobs):
        return {}  # a policy without time-slice groups, or nobody waits for a turn
    cfg = policy.config
    # The policy's own, where it just decided from ``snap``: the groups its decisions
    # changed in it are the ``changed`` ones, left out below.
    ledger = policy.ledger_of(snap)
    groups: set[Placement] = {ledger.placement[j] for j in ledger.by_state.get("SUSPENDED", ())
                              if j not in held and ledger.placement.get(j)}
    out: dict[str, Wait] = {}
    cache = {} if cache is None else cache
    for gone in set(cache) - groups:
        del cache[gone]
    deadline = time.perf_counter() + BUDGET_S
    # The copy of the policy that finds the turns does not pack: a trial it would start (only
    # while the cluster is overloaded) resumes a suspended job beside the running one, sooner.
    trials = ("sooner if a packing trial starts it beside the job running (trials are not foreseen here)"
              if cfg.enable_packing and ledger.overloaded() else "")
    for gpus in sorted(groups):
        members = [m for m in ledger.members(gpus) if m not in held]
        if any(m in changed for m in members):
            continue  # its turns were just changed: the next round's snapshot shows how
        units = ts.group_units(ledger, members, state)
        running = units[0] if units and ledger.state[units[0][0]] == "RUNNING" else ()
        waiting = [j for u in units if u != running and all(ledger.state[j] == "SUSPENDED" for j in u) for j in u]
        if not waiting:
            continue
        where = ",".join(f"{g.server}/{g.index}" for g in gpus)
        now_text = (f"{' and '.join(running)} run now (packed)" if len(running) > 1 else
                    f"{running[0]} runs now" if running else "nothing runs there now")
        head = f"in its time-slice group on {where} ({len(members)} jobs, slices of {cfg.quantum_s:g}s or more)"
        blocked = _blocked(ledger, state, members)
        views = ledger.jobs
        key = (tuple((m, ledger.state[m], views[m].last_state_change_at, views[m].attained_service_s,
                      views[m].priority, views[m].suspendable, state.kept_pairs.get(m)) for m in sorted(members)),
               state.slices.kept.get(gpus), cfg)
        if blocked:
            resumes = []
        elif gpus in cache and cache[gpus][0] == key:
            resumes = cache[gpus][1]
        elif time.perf_counter() < deadline:
            resumes = _rotation(policy, state, snap, gpus, members, waiting, lag_s)
            cache[gpus] = (key, resumes)
        else:
            continue  # worked out in a later round
        first: dict[str, float] = {}
        for at, j in resumes:
            first.setdefault(j, at)
        times = sorted({first[j] for j in waiting if j in first})
        for j in waiting:
            partners = [o for u in units if j in u for o in u if o != j]
            with_ = "".join(f"; with {o} (a kept pack: they take their turns together)" for o in partners)
            if j in first:
                place = times.index(first[j]) + 1
                before = list(dict.fromkeys(o for at, o in resumes if at < first[j] and o not in partners))
                text = f"{_ordinal(place)} of {len(times)} to run next {head}{with_}; {now_text}"
                if before:
                    text += f", then {_named(before, {})}"
                out[j] = Wait(text, place, "SUSPENDED", first[j], trials)
                continue
            why = blocked or (f"not within its group's next {MAX_TURNS} turns: those the policy ranks ahead of it "
                              f"(least attained service first) run first")
            out[j] = Wait(f"waiting {head}{with_}; {now_text}; {why}", len(times) + 1, "SUSPENDED")
    return out


# How many of the policy's decisions about a group a next turn is looked for in.
MAX_TURNS = 64


def _rotation(policy: Policy, state: GandivaState, snap: ClusterSnapshot, gpus: Placement,
              members: Sequence[str], waiting: Collection[str], lag_s: float = 0.0) -> list[tuple[float, str]]:
    """The resumes (time, job) the policy's own rotation makes in the group on ``gpus`` from
    ``snap.now``, in virtual time, if nothing else changes: a copy of the policy (its slice
    rules and what they remember: kept packs, a unit keeping the GPUs, the departures the
    Gittins order is drawn from) asked at each time it would act, its suspends and resumes
    carried out at once, until every waiting job has had a turn (at most MAX_TURNS calls).
    Migration, packing, growing and probes are off in the copy: they are not the rotation."""
    cfg = dataclasses.replace(policy.config, enable_migration=False, enable_packing=False,
                              enable_grow_shrink=False, probe_slices=False, probe_large=False)
    sim = type(policy)(cfg)
    own = getattr(sim, "state", None)
    if not isinstance(own, GandivaState):
        return []
    own.kept_pairs.update({a: b for a, b in state.kept_pairs.items() if a in members and b in members})
    own.service = state.service  # read only: no job departs in the copy
    if gpus in state.slices.kept:
        own.slices.kept[gpus] = state.slices.kept[gpus]
    names = {g.server for g in gpus}
    servers = tuple(s for s in snap.servers if s.name in names)
    jobs = {j.id: j for j in snap.jobs if j.id in set(members)}
    now, left = snap.now, set(waiting)
    out: list[tuple[float, str]] = []
    for _ in range(MAX_TURNS):
        for d in sim.decide(ClusterSnapshot(now, servers, tuple(jobs.values()))):
            j = jobs.get(d.job_id)
            if j is None:
                continue
            if isinstance(d, Suspend):  # as the live engine records it: service up to now
                jobs[j.id] = dataclasses.replace(j, state="SUSPENDED", last_state_change_at=now, reported_at=None,
                                                 attained_service_s=j.attained_at(now))
            elif isinstance(d, Resume):
                jobs[j.id] = dataclasses.replace(j, state="RUNNING", last_state_change_at=now, reported_at=now)
                out.append((now, j.id))
                left.discard(j.id)
        nxt = sim.next_wakeup()
        if not left or nxt is None:
            break
        now = max(nxt + lag_s, now + 1e-3)
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


def waits(policy: Policy, snap: ClusterSnapshot, held: Collection[str] = (),
          decided: Sequence[Decision] = (), cache: TurnCache | None = None, lag_s: float = 0.0) -> dict[str, Wait]:
    """Both answers for every waiting job of ``snap`` (job id -> its Wait). ``decided``: the
    decisions the policy just took from ``snap``, not carried out in it yet: the jobs they
    place, suspend, resume or move are left out of the queue, and the time-slice groups they
    touch (a newcomer placed onto a group's GPUs, whose start the engine may defer for
    rounds) are left out until a snapshot shows them carried out."""
    acted = [d for d in decided if not isinstance(d, Queue)]
    changed = {d.job_id for d in acted}
    touched = {g for d in acted for g in (*getattr(d, "gpus", ()), *getattr(d, "to_gpus", ()))}
    # And the GPUs a moved job leaves: the policy's ledger (next_turns) has it gone from there.
    touched |= {g for j in snap.jobs if j.id in changed for g in j.placement}
    if touched:
        changed |= {j.id for j in snap.jobs if touched.intersection(j.placement)}
    out = queue_places(policy, [j for j in snap.jobs if j.id not in changed])
    out.update(next_turns(policy, snap, held, changed, cache, lag_s))
    return out
