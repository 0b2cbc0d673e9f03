"""The GPU memory cycle of a training job (brief §2.5).

Within a mini-batch the job's GPU memory rises (activations) and falls back at the
boundary; the minima mark the boundaries, so the interval between two minima is
the mini-batch time, a cross-check of the shim's own timing.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from dataclasses import dataclass

# A cycle must span at least this share of its maximum, and this many bytes, to
# count: allocator jitter of a few pages is not a mini-batch.
MIN_SWING_FRACTION = 0.02
MIN_SWING_BYTES = 1 << 20
# A sample within this share of the swing above the minimum is "at the minimum".
LOW_BAND = 0.25


@dataclass(frozen=True)
class CycleSummary:
    min_bytes: int
    max_bytes: int
    minibatch_s: float  # 0.0 when no cycle was seen
    minima: int         # how many minima the estimate rests on


class MemoryCycle:
    """A sliding window of (time, bytes) samples for one job on one GPU."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, used_bytes: int) -> None:
        self._samples.append((at, used_bytes))
        while self._samples and self._samples[0][0] < at - self.window_s:
            self._samples.popleft()

    def __len__(self) -> int:
        return len(self._samples)

    def summary(self) -> CycleSummary:
        if not self._samples:
            return CycleSummary(0, 0, 0.0, 0)
        values = [b for _, b in self._samples]
        lo, hi = min(values), max(values)
        swing = hi - lo
        if swing < max(MIN_SWING_BYTES, hi * MIN_SWING_FRACTION):
            return CycleSummary(lo, hi, 0.0, 0)
        minima = self._minima_times(lo + swing * LOW_BAND)
        intervals = [b - a for a, b in itertools.pairwise(minima)]
        return CycleSummary(lo, hi, statistics.median(intervals) if intervals else 0.0, len(minima))

    def _minima_times(self, threshold: float) -> list[float]:
        """The time of the lowest sample in each run of samples below the threshold,
        counting only runs entered from above (a window starting low is no boundary)."""
        times: list[float] = []
        run_best: tuple[int, float] | None = None
        seen_high = False
        for at, b in self._samples:
            if b <= threshold:
                if seen_high and (run_best is None or b < run_best[0]):
                    run_best = (b, at)
            else:
                if run_best is not None:
                    times.append(run_best[1])
                    run_best = None
                seen_high = True
        return times
