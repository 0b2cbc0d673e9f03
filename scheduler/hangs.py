"""Jobs that make no progress: a process alive, its GPUs held, no mini-batch ending (a
deadlocked input pipeline, a hung collective, a program asleep between its runs).

The scheduler hears every job's progress from its shim (a report every half second while
its step count moves). `HangWatch` keeps, per running launch and in memory, when a
mini-batch last ended, on the monotonic clock. A job is judged *hung* once none has ended
for its bound: ``max(hang_after_s, HANG_STEPS x its own mini-batch time)``, the mini-batch
time as its shim measures it (the interval between two boundaries, or the last step's
duration if longer). Before two rises of its step count in this launch (its start-up, a
restore, and its first mini-batch, which builds TensorFlow's executors and often takes tens
of steps' time; the first rise may be only the restored step count) its bound is
STARTUP_FACTOR times longer (it used to be never judged there: a job that hung in its first
mini-batches held its GPUs for good). It is never judged

- before its shim's first progress report of this launch (a program that never connects is
  marked uncontrollable after the runtime's connect deadline instead);
- while it is not RUNNING (suspended, migrating, queued): its clock starts again when it
  runs again;
- while its shim says it is in a run that is not a training step (an evaluation, the
  program's own save) or applying a command (a checkpoint's save): its clock starts
  again when that ends.

The engine acts on the verdicts (scheduler/engine/live.py, `LiveEngine.watch_hangs`):
flagged, then restarted from its restore point ``hang_restart_after_s`` later
(docs/scheduler.md, "Jobs that make no progress").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# A job is judged hung after this many of its own mini-batch times without one (and at
# least Settings.hang_after_s).
HANG_STEPS = 20
# Before a launch's step count rose twice (its first mini-batches, its time not measured
# yet, and the first one slow: TensorFlow builds its executors, XLA compiles), the bound is
# this many times longer: an hour with the default --hang-after.
STARTUP_FACTOR = 6
# The reasons of the transitions a hang restart makes start with this (counted: the
# third hang of a job fails it instead).
HUNG = "hung: "
HUNG_RESTARTS = 2


@dataclass
class Watch:
    """One launch of a job, as its progress reports showed it."""

    incarnation: str
    steps: int
    since: float  # monotonic: its last sign of progress (or when its clock started again)
    rises: int = 0  # reports whose step count rose
    interval: float = 0.0  # its mini-batch time as its shim measured it (0: not yet)
    other_run: bool = False
    flagged_at: float = 0.0  # monotonic, when it was flagged (0: it is not)
    # Set when a flagged job moved on: how long it went without a mini-batch (the engine
    # records it, then clears it).
    moved_on_after: float = 0.0
    # When its program ended (it closed its runtime stream: tf_runtime's end of the script),
    # and whether the engine said that its process has not exited since.
    ended_at: float = 0.0
    ended_said: bool = False


@dataclass(frozen=True)
class Verdict:
    """What the engine should do about one job: ``flag`` it (hung for ``silent_s``, past
    ``bound_s``), ``restart`` it, record that it ``moved_on`` (a flagged job whose
    mini-batches end again), or say that its program ended ``silent_s`` ago and its process
    has ``not_exited`` (no action: it is past its training, not hung in it)."""

    action: str
    job_id: str
    incarnation: str
    silent_s: float
    bound_s: float
    interval_s: float


class HangWatch:
    def __init__(self, after_s: float, restart_after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self.restart_after_s = restart_after_s
        self.clock = clock
        self.watches: dict[str, Watch] = {}

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def flagged(self) -> set[str]:
        return {j for j, w in self.watches.items() if w.flagged_at}

    def silent_for(self) -> dict[str, float]:
        """Each flagged job -> seconds since its last mini-batch (`gandiva get problems`)."""
        now = self.clock()
        return {j: now - w.since for j, w in self.watches.items() if w.flagged_at}

    def bound(self, w: Watch) -> float:
        return max(self.after_s, HANG_STEPS * w.interval)

    def progress(self, job_id: str, incarnation: str, steps: int, rate: float, last_step_s: float,
                 other_run: bool) -> None:
        """A progress report of that launch (called for every report: a few dict and
        float operations)."""
        if not self.enabled:
            return
        now = self.clock()
        w = self.watches.get(job_id)
        if w is None or w.incarnation != incarnation:
            self.watches[job_id] = Watch(incarnation, steps, now, other_run=other_run)
            return
        interval = max(1.0 / rate if rate > 0 else 0.0, last_step_s)
        if interval > 0:
            w.interval = interval
        if steps > w.steps:
            w.steps = steps
            w.rises += 1
            w.ended_at, w.ended_said = 0.0, False  # another program of the launch trains
            if w.flagged_at:
                w.moved_on_after = now - w.since
                w.flagged_at = 0.0
            w.since = now
        if other_run or w.other_run:
            w.since = now  # in such a run, or it just ended: its clock starts again
        w.other_run = other_run

    def ended(self, job_id: str, incarnation: str) -> None:
        """That launch's program ended: its shim closed its runtime stream at the end of
        the script (normally or by an exception). Its process should exit at once; if it
        does not (a thread that is not a daemon, a wrapper script going on), it is not
        hung in a mini-batch: restarting it from its checkpoint would train its end again."""
        if not self.enabled:
            return
        now = self.clock()
        w = self.watches.get(job_id)
        if w is None or w.incarnation != incarnation:
            w = self.watches[job_id] = Watch(incarnation, 0, now)
        w.ended_at, w.ended_said = now, False

    def judge(self, running: dict[str, str], unfinished: Iterable[str]) -> list[Verdict]:
        """Verdicts on every watched job. `running`: job id -> current incarnation of the
        RUNNING jobs; `unfinished`: the ids of every job not finished (the others are
        forgotten)."""
        if not self.enabled:
            self.watches.clear()
            return []
        now = self.clock()
        keep = set(unfinished)
        out: list[Verdict] = []
        for job_id, w in list(self.watches.items()):
            current = running.get(job_id)
            if job_id not in keep:
                del self.watches[job_id]
                continue
            if current is None or current != w.incarnation:
                # Suspended, migrating or queued (its clock starts again once it runs), or
                # relaunched (its new launch's first report starts a new watch).
                if current is not None:
                    del self.watches[job_id]
                else:
                    w.since = now
                    w.flagged_at = 0.0
                continue
            bound = self.bound(w)
            silent = now - w.since
            if w.moved_on_after:
                out.append(Verdict("moved_on", job_id, w.incarnation, w.moved_on_after, bound, w.interval))
                w.moved_on_after = 0.0
            if w.ended_at:
                if not w.ended_said and now - w.ended_at >= self.after_s:
                    w.ended_said = True
                    out.append(Verdict("not_exited", job_id, w.incarnation, now - w.ended_at, self.after_s, w.interval))
                continue
            if w.other_run:
                continue
            if w.rises < 2:
                bound = STARTUP_FACTOR * bound
            if not w.flagged_at and silent >= bound:
                w.flagged_at = now
                out.append(Verdict("flag", job_id, w.incarnation, silent, bound, w.interval))
            elif w.flagged_at and self.restart_after_s > 0 and silent >= bound + self.restart_after_s:
                out.append(Verdict("restart", job_id, w.incarnation, silent, bound, w.interval))
        return out

    def forget(self, job_id: str) -> None:
        self.watches.pop(job_id, None)
