"""Per-mini-batch measurements: steps, duration, moving-average rate, metrics.

Updated on the hot path (a few float operations per step, no locks beyond the
GIL's atomic attribute writes); the stream client reads `snapshot()` from its
flusher thread every half second, so progress is batched, never one RPC a step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Snapshot:
    """Progress as reported to the scheduler."""

    steps: int
    rate: float
    last_step_s: float
    at: float
    metrics: dict[str, float] = field(default_factory=dict)
    # In a run that is not a training step (an evaluation, a save), or applying a
    # command: no mini-batch is due until it returns (the scheduler's hang detection).
    other_run: bool = False
    # The step at which the program stops, when it says so itself (its StopAtStepHook); 0: unknown.
    total_steps: int = 0
    # Unix seconds at which the job last went on training from mini-batch `steps` (its
    # end, or the end of a pause after it); 0: unknown. The scheduler's rate alone.
    step_at: float = 0.0


class ProgressMeter:
    """Counts boundaries; rate is an exponential moving average of 1/duration.

    The rate uses the interval between two boundaries (step time plus the
    program's own work between steps), which is what the scheduler's
    introspection compares. An interval ends at a boundary only when the one
    before it was seen since the last pause: the process's first mini-batch
    (TensorFlow's lazy set-up: often tens of times a step) does not count, nor
    does the first after a pause (a suspension, a command applied). The rate is 0
    (not measured) until a second boundary in a row, or a job suspended after its
    first step would report a fraction of its rate (the policy judges packing
    trials against it).
    """

    def __init__(self, alpha: float = 0.1) -> None:
        self._alpha = alpha
        self.steps = 0
        self.last_step_s = 0.0
        self._avg_interval = 0.0
        self._last_boundary: float | None = None
        # (steps, unix seconds) of the last boundary or pause: one tuple, written at once,
        # so that the flusher never pairs one step's count with another's time.
        self._went_on: tuple[int, float] = (0, 0.0)
        self._metrics: dict[str, float] = {}
        self._lock = threading.Lock()
        self.version = 0  # bumped on each change, so the flusher can skip idle periods
        # The step at which the program stops, when it says so (tf_runtime.shim: the
        # last_step of a StopAtStepHook); 0: it does not. The scheduler's progress and ETA.
        self.total_steps = 0
        # Runs of the training session in flight that are not training steps (several
        # threads may make them: a Supervisor's summary thread beside an evaluation).
        self._other = 0

    def begin_other(self) -> None:
        """A run that is not a mini-batch starts (an evaluation, the program's own save),
        or the shim applies a command (a checkpoint's save): the scheduler is told that no
        mini-batch is due until it ends, however long it takes."""
        with self._lock:
            self._other += 1
        self.version += 1

    def end_other(self) -> None:
        with self._lock:
            self._other = max(0, self._other - 1)
        self.version += 1

    def set_steps(self, steps: int) -> None:
        """The global step became known (restore, checkpoint): count from it."""
        self.steps = int(steps)
        self.version += 1

    def pause(self) -> None:
        """Forget the last boundary so a suspension does not count as a slow step. The job
        goes on training from its current step now (a resume, a command applied)."""
        self._last_boundary = None
        self._went_on = (self.steps, time.time())

    def went_on_at(self, steps: int) -> float:
        """Unix seconds at which the job last went on training from mini-batch ``steps``
        (its end, or a pause since); 0 if that is not its current step."""
        went_on = self._went_on
        return went_on[1] if went_on[0] == steps else 0.0

    def step(self, duration_s: float, now: float) -> None:
        """One mini-batch finished at `now` (perf_counter seconds)."""
        self.steps += 1
        self._went_on = (self.steps, time.time())
        self.last_step_s = duration_s
        last, self._last_boundary = self._last_boundary, now
        if last is None:
            # The process's first boundary, or the first after a pause (a suspension, a
            # command applied): no interval ends here. The run's own duration is no stand-in:
            # it leaves out the program's work between runs (input, logging), and a job
            # doing 20 mini-batches/s was reported at 95/s for a second after each resume.
            self.version += 1
            return
        interval = now - last
        if self._avg_interval == 0.0:
            self._avg_interval = interval
        else:
            self._avg_interval += self._alpha * (interval - self._avg_interval)
        self.version += 1

    def add_metrics(self, metrics: dict[str, float]) -> None:
        """Metrics fetched by the program or published with tf_runtime.report()."""
        with self._lock:
            self._metrics.update(metrics)
        self.version += 1

    def snapshot(self) -> Snapshot:
        with self._lock:
            metrics = dict(self._metrics)
            other = self._other > 0
        rate = 1.0 / self._avg_interval if self._avg_interval > 0 else 0.0
        steps = self.steps
        return Snapshot(steps, rate, self.last_step_s, time.time(), metrics, other, self.total_steps,
                        self.went_on_at(steps))
