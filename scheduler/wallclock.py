"""The scheduler's wall clock, without its backward steps.

Everything the scheduler stamps and every duration it keeps in wall-clock terms (a time
slice's end, a job's fence, `--checkpoint-wait`, a packing trial, when a periodic
checkpoint is due, the events' times) is read from one clock, `SchedulerCore.clock`.
NTP correcting a clock that ran ahead, or an operator's `date -s`, can step the
system's wall clock back: an hour back stopped every periodic checkpoint for that hour
(and would hold a fence or a `--checkpoint-wait` in progress an hour longer). This clock
follows the system's wall clock, but where that steps back it goes on at 9/10 of the
pace of CLOCK_MONOTONIC (which no step moves) until the wall clock has caught up: it
never goes back, and no duration is stretched by more than a ninth. A forward step is
followed at once, as before (a slice or checkpoint interval in progress ends early then:
that can only shorten them, never hold a job). A job's fence, which must not end early
(an unanswered launch's lease), is timed on the monotonic clock by the engine instead
(SchedulerCore.note_fence, fence_holds)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# The pace at which the clock runs, against the monotonic clock, while the wall clock is
# behind it (after a step back): durations read on it are at most 1/0.9 as long.
CATCH_UP_PACE = 0.9
# A step back smaller than this is not worth a log line (NTP steps at 0.128 s and more).
LOGGED_STEP_S = 1.0


class StepFreeClock:
    """A callable giving unix seconds: the wall clock, but never going back (see module)."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._lock = threading.Lock()  # read from the event loop and from database threads
        self._last, self._last_mono = wall(), monotonic()
        self._behind = False  # whether the wall clock was behind at the last reading

    def __call__(self) -> float:
        with self._lock:
            wall, mono = self._wall(), self._monotonic()
            ran = max(0.0, mono - self._last_mono)
            slowest = self._last + CATCH_UP_PACE * ran
            now = max(wall, slowest)
            if wall < slowest and not self._behind:
                step = self._last + ran - wall
                if step >= LOGGED_STEP_S:
                    log.warning("the wall clock stepped back by %.1fs (NTP, or `date -s`); this scheduler's "
                                "clock runs at %.0f%% of its pace until the wall clock catches up (in about "
                                "%.0fs): no time slice, fence or checkpoint interval in progress is stretched "
                                "by the step", step, 100 * CATCH_UP_PACE, step / (1 - CATCH_UP_PACE))
            self._behind = wall < slowest
            self._last, self._last_mono = now, mono
            return now
