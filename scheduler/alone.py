"""Each job's mini-batch rate measured while it ran alone on its GPUs: a packing trial's baseline.

A packing trial is kept only if the two jobs' packed rates, each divided by that job's
rate alone, beat time-slicing (scheduler/policy/packing.py). The runtime's reported rate
is a moving average over its last mini-batches wherever they ran, and the last one stored
for a suspended job may come from a trial that was cut short, void or undone, or from
the moments a newcomer placed beside it ran before its suspend took effect: taken as the
job's rate alone, it kept a packing that halved both jobs' rates (CI of session 45:
"victim 2.5 packed vs 2.5 alone"). So the rate alone is measured here, from the steps the
job reported, only over stretches in which it was the one job running on its GPUs:

- the engine looks at each snapshot (``observe``): a job RUNNING whose every GPU
  neighbour is SUSPENDED (states are recorded when the job's runtime acks, so a
  neighbour placed, resuming or migrating counts as running) is alone;
- its stretch starts over whenever its launch, its GPUs, its own state change or any
  neighbour's state change (or a neighbour comes or goes): a change between two
  snapshots is seen by the time it was recorded, never missed; and it ends the moment a
  neighbour is told to resume (``resuming``) or a job is launched or migrated onto its
  GPUs (``launching``), before that job runs; once that job is settled (its resume
  refused, its migration over, landed or not: ``settled``), a new stretch starts then
  (ended by the next snapshot if that job runs there);
- a launch's first ``WARMUP_STEPS`` mini-batches are not counted, from the first step the
  engine saw of it (an ack or report): after a start, a restore or a move the program builds
  its graph and runs its first mini-batch slowly (about a second for the demo's MLP), and a
  stretch alone that began there read half the job's rate (demo of session 52: a restarted
  job "16.1 alone" where it ran 28-31/s, so a pack halving its rate would have read no loss:
  "30.2 packed vs 16.1 alone", 1.88x, clipped). A packing trial's own rates are sampled only
  in its second half for the same reason; a resume within a launch is no warm-up;
- reports received in the first ``SETTLE_S`` after the last of those states was recorded
  are not counted (a job's acks and reports share its stream: a report after its resume's
  ack was taken after it resumed), nor any but the last received before the engine saw
  the stretch;
- the rate is the steps reported over the time they took, added up over the stretches alone of the same
  launch on the same GPUs (time slices of a few seconds each count), the older ones
  fading once ``KEEP_S`` are counted (a job's rate may change by itself: a data phase;
  a job slower than ``MIN_STEPS`` in ``KEEP_S`` keeps its last ``MIN_STEPS``);
  never the runtime's moving average, which after a change goes on averaging the
  mini-batches from before it. A rate needs ``MIN_WINDOW_S`` and ``MIN_STEPS`` (a
  time slice shorter than that adds up with the next ones before the job is packed).

Which reports belong to a stretch is decided by when they arrived; the time a stretch took
is the runtime's own, where both its ends carry one: a report's ``step_at`` (when the job
went on training from the step it reports: the mini-batch's end, or a resume after it) and
an ack's (a resume's: when it went on; a suspend's: when its last mini-batch ended; a
slice's own acks give its exact first and last steps). Arrival times are the scheduler's,
read when the event loop handles a message: a stretch's first report comes at a busy
moment (a state change: its writes, its commands) and was handled late while its steps
were of earlier, so the window read short, every stretch alike (CI of 4210601: 11.5/s for a
true 10/s over 6.4 s of time slices; summed stretches keep the bias). Arrival times are
used where an end has no runtime time (an older shim, a runtime that sends none), and
where the runtime's interval is negative or off the arrival interval by more than
``CLOCK_SLACK_S`` and a mini-batch: its clock was stepped mid-stretch (NTP) or its
times are false. A runtime gains no power from its times: it reports its own steps too,
and could skew its rate alone with them as much, and its packed/alone ratio is clipped at 1,
which a huge packed rate already reaches (docs/security.md).

The rate is kept while the job waits suspended, and given to the policy only while the
job has the same launch and GPUs (``JobView.alone_rate``). In memory: a restarted
scheduler measures again before it packs. ``report`` runs on the event loop and
``observe`` on the engine's snapshot thread: a report racing a new stretch is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

SETTLE_S = 0.2  # a job suspended beside it acked before it was recorded: no more than in flight
# A launch's first mini-batches are its warm-up (module doc): its graph built, its first run
# (about a second for the demo's MLP at 30/s), a GPU's kernels tuned, its input pipeline filled.
WARMUP_STEPS = 10
# A rate counts once its stretches add up to MIN_STEPS and MIN_WINDOW_S: each stretch's
# ends are a report between two mini-batch boundaries (up to a mini-batch off) and an
# arrival time a loaded event loop may take late, so half a second at 10/s (5-6 steps)
# read anything from 8 to 14/s, and flipped a trial's verdict for a rate near its
# threshold (CI of 39a0368: 11.5 and 11.7/s alone for a true 10/s; traced, the arrivals
# were within 1 ms: the error was the steps'). A mini-batch in 20 is 5%, and so is an
# arrival 100 ms late in 2 s.
MIN_WINDOW_S = 2.0
MIN_STEPS = 20
KEEP_S = 30.0

# A stretch's runtime interval off its arrival interval by more than this and one of its
# mini-batches is not taken: a clock stepped mid-stretch. Within it: the lateness of a loaded
# event loop (a tenth of a second to a second), a real runtime's flush (half a second), and a
# report sent a mini-batch after its step ended (an evaluation's start: other_run).
CLOCK_SLACK_S = 1.0

# A running job whose rate is under this fraction of its rate alone is "slow" on the page, in
# `gandiva top` and `gandiva get jobs -o wide`: packed with a job that takes its GPU's time, or
# beside one that should not be there. (The runtime's rate averages its last mini-batches: a
# few percent off for a while after a switch.)
SLOW_AGAINST_ALONE = 0.8


def against_alone(running: bool, rate: float | None, alone: float | None) -> float | None:
    """A running job's rate over its rate alone, or None where either is not known."""
    if not running or not rate or rate <= 0 or not alone or alone <= 0:
        return None
    return rate / alone


GpuKey = tuple[tuple[str, int], ...]
Point = tuple[float, int, float]  # (when it arrived, steps, the runtime's time of them; 0: none)


@dataclass(frozen=True)
class Condition:
    """What a stretch alone is: the launch, its GPUs, and the states of the job and of
    every job on those GPUs, with when each was recorded."""

    incarnation: str
    gpus: GpuKey
    states: tuple[tuple[str, str, float], ...]


@dataclass
class _Stretch:
    condition: Condition
    count_after: float  # reports received before this are not counted
    anchor: Point | None = None  # the first report counted
    latest: Point | None = None
    added: tuple[float, int] = (0.0, 0)  # the seconds and steps of it already added to the job's sums
    closed: bool = False  # a job beside it was told to resume: no report counts any more
    closers: set[str] = field(default_factory=set)  # the jobs told to resume, or launched, beside it
    reopened: float | None = None  # when the last of those failed to resume: a new stretch from then


@dataclass
class _Sums:
    incarnation: str
    gpus: GpuKey
    seconds: float = 0.0
    steps: float = 0.0

    @property
    def rate(self) -> float | None:
        if self.seconds < MIN_WINDOW_S or self.steps < MIN_STEPS:
            return None
        return self.steps / self.seconds


@dataclass(frozen=True)
class JobRow:
    """What ``observe`` needs of an unfinished job."""

    id: str
    incarnation: str
    state: str
    state_changed_at: float
    gpus: GpuKey


class AloneRates:
    """Per job, its rate over its stretches alone on its GPUs (module doc)."""

    def __init__(self) -> None:
        self._stretches: dict[str, _Stretch] = {}
        self._sums: dict[str, _Sums] = {}
        # job -> its last report, and its last resume's ack: (launch, (when, steps))
        self._last: dict[str, tuple[str, Point]] = {}
        self._resumed: dict[str, tuple[str, Point]] = {}
        self._arrived: dict[str, tuple[str, Point]] = {}  # job -> (launch, its last ack's arrival and step)
        self._first: dict[str, tuple[str, int]] = {}  # job -> (launch, the first step seen of it)
        # What the last look returned: the dashboard, `gandiva top` and /metrics show each
        # job's rate against it (replaced whole at each look: read from the event loop).
        self.latest: dict[str, float] = {}

    def report(self, job_id: str, incarnation: str, steps: int, now: float, rate: float = 1.0,
               at: float = 0.0) -> None:
        """A progress report of the job's launch ``incarnation`` arrived at ``now``, with the
        runtime's ``rate`` and its time ``at`` of ``steps`` (ProgressReport.step_at; 0: none).

        A report without a rate (0: an old shim, or none measured yet) is not counted: a
        trial is judged by the rates the jobs report, so one started for a job that never
        reports a rate ends void after twice ``pack_trial_s``, and, its pair not rejected,
        would start again and again."""
        self._seen(job_id, incarnation, steps)
        if rate <= 0:
            return
        self._last[job_id] = (incarnation, (now, steps, at))
        stretch = self._stretches.get(job_id)
        if stretch is None or stretch.closed or stretch.condition.incarnation != incarnation:
            return
        self._count(job_id, stretch, (now, steps, at))

    def _seen(self, job_id: str, incarnation: str, step: int) -> None:
        """A step of the job's launch ``incarnation``: the first one seen begins its warm-up."""
        first = self._first.get(job_id)
        if first is None or first[0] != incarnation:
            self._first[job_id] = (incarnation, step)

    def _warm(self, job_id: str, incarnation: str, step: int) -> bool:
        """Whether ``step`` of the launch is past its warm-up (``WARMUP_STEPS``)."""
        first = self._first.get(job_id)
        return first is not None and first[0] == incarnation and step >= first[1] + WARMUP_STEPS

    def ack_arrived(self, job_id: str, incarnation: str, step: int, now: float, at: float = 0.0) -> None:
        """An ack of the job's runtime arrived (``acked`` comes later, when the command's
        caller runs again: on a loaded event loop, late enough to shorten a slice of a
        second or two by a tenth, and make its rate that much higher). ``at``: the runtime's
        time of ``step`` (CommandAck.step_at; 0: none)."""
        self._seen(job_id, incarnation, step)
        self._arrived[job_id] = (incarnation, (now, step, at))

    def acked(self, job_id: str, incarnation: str, resumed: bool, step: int, now: float, at: float = 0.0) -> None:
        """The job's runtime acked a resume (``resumed``) or a suspend at mini-batch ``step``
        (it arrived at ``ack_arrived``'s time, else ``now``; ``at``: the runtime's): its exact step where a time
        slice alone begins and ends (a slice of a second or two has room for one or two
        reports at most)."""
        self._seen(job_id, incarnation, step)
        arrived = self._arrived.pop(job_id, None)
        if arrived is not None and arrived[0] == incarnation and arrived[1][1] == step:
            now, at = arrived[1][0], at or arrived[1][2]
        if resumed:
            self._resumed[job_id] = (incarnation, (now, step, at))
            return
        stretch = self._stretches.get(job_id)
        if stretch is not None and stretch.condition.incarnation == incarnation and not stretch.closed:
            stretch.count_after = min(stretch.count_after, now)
            self._count(job_id, stretch, (now, step, at))

    def _count(self, job_id: str, stretch: _Stretch, point: Point) -> None:
        if point[0] < stretch.count_after or not self._warm(job_id, stretch.condition.incarnation, point[1]):
            return
        if stretch.anchor is None:
            stretch.anchor = point
        elif point[1] > (stretch.latest or stretch.anchor)[1] and point[0] > stretch.anchor[0]:
            stretch.latest = point  # (the first report of its step count: near a boundary, as the anchor)

    def resuming(self, job_id: str) -> None:
        """The job is told to resume (a time slice's turn, a packing trial, an operator): the
        stretches of the jobs on its GPUs end now. Its state is recorded only once it has
        acked, after it started running: reports until then were counted as alone (on a
        loaded machine, a measured 7.9/s where the job ran 10/s alone and 2.5/s packed)."""
        for stretch in list(self._stretches.values()):
            if any(state[0] == job_id for state in stretch.condition.states):
                self._close(stretch, job_id)

    def launching(self, job_id: str, gpus: Iterable[tuple[str, int]]) -> None:
        """The job is launched onto ``gpus`` (placed from the queue, or migrated in): the
        stretches on those GPUs end now. The snapshot that shows it comes a round later,
        and a warm copy runs at once: the reports in between were counted as alone (2 s at
        10/s and 3 s at the packed 2.5/s read 5.4/s)."""
        on = set(gpus)
        for stretch in list(self._stretches.values()):
            if on.intersection(stretch.condition.gpus):
                self._close(stretch, job_id)

    def settled(self, job_id: str, now: float) -> None:
        """The job told to resume, or moved onto these GPUs, is settled: its resume was
        refused (it never ran, and no state changed), or its migration is over, landed or
        not. The stretches it closed, none other closing them, start over from ``now`` at
        the next look: landed, it is on their GPUs in that look's snapshot, and its state
        there ends them (running) or starts them over; else they measure again (they were
        reused closed: nothing measured until a state changed)."""
        for stretch in list(self._stretches.values()):
            if job_id in stretch.closers:
                stretch.closers.discard(job_id)
                if not stretch.closers:
                    stretch.reopened = now

    @staticmethod
    def _close(stretch: _Stretch, job_id: str) -> None:
        stretch.closers.add(job_id)
        stretch.closed, stretch.reopened = True, None

    def observe(self, now: float, jobs: Iterable[JobRow]) -> dict[str, float]:
        """Look at a snapshot's unfinished jobs; returns each job's rate alone on its
        current launch and GPUs, where one was measured."""
        jobs = list(jobs)
        on_gpu: dict[tuple[str, int], list[JobRow]] = {}
        for j in jobs:
            for g in j.gpus:
                on_gpu.setdefault(g, []).append(j)
        where = {j.id: (j.incarnation, j.gpus) for j in jobs}
        stretches: dict[str, _Stretch] = {}
        for j in jobs:
            if j.state != "RUNNING" or not j.gpus:
                continue
            near = {o.id: o for g in j.gpus for o in on_gpu[g] if o.id != j.id}
            if any(o.state != "SUSPENDED" for o in near.values()):
                continue
            states = tuple(sorted((o.id, o.state, o.state_changed_at) for o in (j, *near.values())))
            condition = Condition(j.incarnation, j.gpus, states)
            stretch = self._stretches.get(j.id)
            if stretch is None or stretch.condition != condition or stretch.reopened is not None:
                # From when the last of those states was recorded (this look may come a
                # round later), or a resume beside it failed: the last report before this
                # look may be its anchor.
                began = max(state[2] for state in states)
                if stretch is not None and stretch.condition == condition and stretch.reopened is not None:
                    began = max(began, stretch.reopened)
                stretch = _Stretch(condition, began + SETTLE_S)
                resumed = self._resumed.pop(j.id, None)
                others = max((o.state_changed_at for o in near.values()), default=0.0)
                if resumed is not None and resumed[0] == j.incarnation and resumed[1][0] >= others \
                        and j.state_changed_at >= resumed[1][0]:
                    # Its own resume began it, every job beside it already suspended: from
                    # the step its ack gave (past its launch's warm-up; else from its first
                    # report past it).
                    stretch.count_after = resumed[1][0]
                    if self._warm(j.id, j.incarnation, resumed[1][1]):
                        stretch.anchor = resumed[1]
                last = self._last.get(j.id)
                if last is not None and last[0] == j.incarnation:  # it came before this look
                    self._count(j.id, stretch, last[1])
            stretches[j.id] = stretch
        # A stretch that ended since the last look (its job suspended, a job beside it
        # placed or resumed) counts up to its last report too: no report of it came after
        # its job stopped, or after a job beside it was told to resume (``resuming``).
        for job_id, stretch in (*self._stretches.items(), *stretches.items()):
            self._add(job_id, stretch)
        self._stretches = stretches
        self._sums = {k: v for k, v in self._sums.items() if where.get(k) == (v.incarnation, v.gpus)}
        # (A copy first: reports add to it on the event loop's thread meanwhile.)
        self._last = {k: v for k, v in list(self._last.items()) if k in where}
        self._resumed = {k: v for k, v in list(self._resumed.items()) if k in where}
        self._arrived = {k: v for k, v in list(self._arrived.items()) if k in where}
        self._first = {k: v for k, v in list(self._first.items()) if k in where}
        self.latest = {k: rate for k, v in self._sums.items() if (rate := v.rate) is not None}
        return self.latest

    def _add(self, job_id: str, stretch: _Stretch) -> None:
        """Add what the stretch measured since it was last added to its job's sums (those
        of its launch on its GPUs)."""
        if stretch.anchor is None or stretch.latest is None:
            return
        launch, gpus = stretch.condition.incarnation, stretch.condition.gpus
        sums = self._sums.get(job_id)
        if sums is None or (sums.incarnation, sums.gpus) != (launch, gpus):
            sums = self._sums[job_id] = _Sums(launch, gpus)
        seconds, steps = _seconds(stretch.anchor, stretch.latest), stretch.latest[1] - stretch.anchor[1]
        sums.seconds += seconds - stretch.added[0]
        sums.steps += steps - stretch.added[1]
        stretch.added = (seconds, steps)
        # The older stretches fade, down to KEEP_S or, for a job slower than MIN_STEPS in
        # KEEP_S, to the time its last MIN_STEPS took: faded to KEEP_S, a job of mini-batches
        # over 1.5 s (under 20 in 30 s) never had a rate alone, and was never packed.
        keep = max(KEEP_S, sums.seconds * MIN_STEPS / sums.steps) if sums.steps > 0 else sums.seconds
        if sums.seconds > keep:  # (MIN_STEPS kept whole: 19.999... read as no rate)
            sums.steps, sums.seconds = max(sums.steps * keep / sums.seconds, MIN_STEPS), keep


def _seconds(anchor: Point, latest: Point) -> float:
    """The time from ``anchor`` to ``latest``: the runtime's, where both carry one and it
    agrees with their arrivals to within ``CLOCK_SLACK_S`` and a mini-batch; else the
    arrivals' (module doc)."""
    arrived, steps = latest[0] - anchor[0], latest[1] - anchor[1]
    if anchor[2] > 0 and latest[2] > 0 and steps > 0:
        own = latest[2] - anchor[2]
        if 0 <= own and abs(own - arrived) <= CLOCK_SLACK_S + arrived / steps:
            return own
    return arrived
