"""What Gandiva remembers between decide() calls (kept in memory, never persisted).

Losing it (a scheduler restart) is safe: a running pack is then judged by a trial again
(packing.trial_of_co_run; kept once its measured rates say it helps, its jobs taking turns
where no rate alone is known), rejected pairs may be tried once more, and timers start again.
"""

from __future__ import annotations

import collections
from collections.abc import Container
from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler.policy.gittins import ServiceWindow
from scheduler.policy.types import GpuRef

# Verdicts kept for observers (the live scheduler's decision log reads the new ones).
VERDICTS_KEPT = 256


@dataclass(frozen=True)
class PackTrial:
    """A packing trial: ``job_id`` was packed onto ``partner_id``'s GPUs at ``started_at``.

    base_rates are the two jobs' mini-batch rates when each ran alone; the trial is
    kept when the packed rates, normalized by these, sum to more than time-slicing's 1.
    """

    job_id: str
    partner_id: str
    started_at: float
    base_rates: tuple[float, float]
    # The pair's key (model names, else job ids), kept for a verdict after a job has gone.
    pair: frozenset[str] = frozenset()
    # The latest (job, partner) rates seen in the trial's second half, both running
    # packed: an early verdict uses them if the trial cannot run to its end.
    sample: tuple[float, float] | None = None
    sampled_at: float | None = None
    # The GPUs the two share (the partner's when packed): a trial whose jobs are no longer
    # both on them (a server lost, a job re-queued or moved) is void (judge_trials).
    gpus: tuple[GpuRef, ...] = ()
    # A trial of two jobs found running together, not packed by the policy
    # (packing.trial_of_co_run): its verdict says so (no `pack` decision came before it).
    found: bool = False


@dataclass(frozen=True)
class PackVerdict:
    """The outcome of a packing trial, for observers (the decision log, the demo).

    kept: True (kept packed), False (no gain: undone, and the pair is not tried again),
    None (void: the trial ended before its rates settled). gain: the packed rates over
    the alone rates, summed (time-slicing gives 1). unpacked: an Unpack decision carries
    this verdict (observers already see that one).
    """

    seq: int
    at: float
    job_id: str
    partner_id: str
    kept: bool | None
    gain: float | None
    reason: str
    unpacked: bool = False


@dataclass
class SliceBook:
    """When each time-slice group next needs a look (scheduler/policy/timeslice.py).

    due: the time a group's slice ends (a group with nothing to decide until it changes
    has none); heap: (time, group) entries, stale once ``due`` says otherwise; kept: the
    unit that kept its group's GPUs under ``las_slices``, and until when.
    """

    due: dict[tuple, float] = field(default_factory=dict)
    heap: list[tuple[float, tuple]] = field(default_factory=list)
    kept: dict[tuple, tuple[tuple[str, ...], float]] = field(default_factory=dict)


class Gathering(NamedTuple):
    """``gather_large``: servers held for ``size``-GPU jobs since ``since``. ``job``: with
    ``probe_slices``, the never-run job they are lent to for its first turn (None: the
    count keeps them); ``donors``: each server with the GPU count its jobs had (None: it
    was idle), to which it goes back after a loan."""

    size: int
    servers: tuple[str, ...]
    since: float
    job: str | None = None
    donors: tuple[tuple[str, int | None], ...] = ()


@dataclass
class GandivaState:
    """Packing trials and verdicts, defragmentation and grow timers, slice ends."""

    trials: dict[str, PackTrial] = field(default_factory=dict)
    kept_pairs: dict[str, str] = field(default_factory=dict)
    rejected: set[frozenset[str]] = field(default_factory=set)
    last_defrag_at: float | None = None
    last_balance_at: float | None = None
    idle_since: float | None = None
    # Since when each GPU on a grow-shrink job's server has been free (``grow``): a job grows
    # only onto GPUs each free for ``grow_idle_s``, not onto one freed a moment ago because
    # other servers' GPUs had been idle. A restart forgets them (they count from then).
    gpu_free_since: dict[GpuRef, float] = field(default_factory=dict)
    # The earliest time at which decide() would act without any new event (slice end,
    # trial end, defrag or grow timer); the simulator wakes the policy then.
    next_wakeup: float | None = None
    slices: SliceBook = field(default_factory=SliceBook)
    # The latest verdicts on packing trials, numbered (``seq``) for observers.
    verdicts: collections.deque[PackVerdict] = field(
        default_factory=lambda: collections.deque(maxlen=VERDICTS_KEPT))
    verdict_seq: int = 0
    # The service per GPU with which the latest jobs left, and its Gittins index
    # (``gittins_slices``; scheduler/policy/gittins.py). A restart starts it empty.
    service: ServiceWindow = field(default_factory=ServiceWindow)
    # ``probe_slices``: the newcomers let into full time-slice groups for their first turn,
    # and the group each joined (parked when that turn is over). A restart forgets them:
    # they then stay on as ordinary members.
    probes: dict[str, tuple] = field(default_factory=dict)
    # ``gather_large``: the gathering under way, and when it last looked. A restart forgets
    # it (the servers are then free to all again).
    gather: Gathering | None = None
    last_gather_at: float | None = None
    # With ``probe_slices`` too, while the job the servers were lent to has its first turn:
    # (that job, its GPUs, the gathering's donors, to which the servers go back).
    lent: tuple[str, tuple, tuple[tuple[str, int | None], ...]] | None = None
    # ``probe_large``: the first turn under way over other counts' servers (that job, its
    # GPUs, the servers held for it), and when a look last found no servers for one. A
    # restart forgets it (the servers' groups then go on beside the job).
    large_turn: tuple[str, tuple, frozenset[str]] | None = None
    large_turn_missed_at: float | None = None
    # The lengths of the queues of those GPU counts when a look last found no never-run job.
    large_turn_none_in: tuple[tuple[int, int], ...] | None = None
    # When each server was last given back after such a turn (the least recent go first).
    large_turn_lent: dict[str, float] = field(default_factory=dict)
    # A queued job placed on GPUs that grown jobs' shrinks free in the same round -> those
    # jobs. Live, its start waits for the shrinks (moves) to end; while one is MIGRATING the
    # job waits for it, not time-sliced elsewhere (gandiva.py, _place_queued). A restart forgets it.
    shrunk_for: dict[str, frozenset[str]] = field(default_factory=dict)

    def add_verdict(self, at: float, trial: PackTrial, kept: bool | None, gain: float | None,
                    reason: str, unpacked: bool = False) -> None:
        self.verdict_seq += 1
        self.verdicts.append(PackVerdict(self.verdict_seq, at, trial.job_id, trial.partner_id,
                                         kept, gain, reason, unpacked))

    def keep_pair(self, a: str, b: str) -> None:
        """A packed pair found worth keeping: each is the other's partner (they take their
        turns together, and neither is migrated or packed with a third job). A pair either was
        in ends: a trial of a co-run (packing.trial_of_co_run) may judge a job of a kept pair
        beside a third, and its old partner was left pointing at it, held as paired (never
        moved or packed) until that job ended."""
        self.drop_pair(a)
        self.drop_pair(b)
        self.kept_pairs[a] = b
        self.kept_pairs[b] = a

    def drop_pair(self, job_id: str) -> None:
        """The job leaves its kept pair, if it is in one (its partner takes turns alone)."""
        partner = self.kept_pairs.pop(job_id, None)
        if partner is not None:
            self.kept_pairs.pop(partner, None)

    def wake_at(self, when: float) -> None:
        if self.next_wakeup is None or when < self.next_wakeup:
            self.next_wakeup = when

    def forget_missing(self, live_ids: Container[str]) -> None:
        """Drop kept pairs and rejected job pairs of jobs that finished or were killed
        (their trials judge_trials has already ended, each with its verdict)."""
        for a, b in list(self.kept_pairs.items()):
            if a not in live_ids or b not in live_ids:
                del self.kept_pairs[a]
        # A verdict on a pair of jobs outlives neither job, so those stay bounded by the live
        # jobs; verdicts on a pair of models ("model:...") are knowledge kept for later jobs.
        self.rejected = {
            pair for pair in self.rejected
            if all(not k.startswith("job:") or k[len("job:"):] in live_ids for k in pair)
        }
