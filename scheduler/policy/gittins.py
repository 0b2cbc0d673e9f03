"""The Gittins index of attained service, from the service with which jobs left (``gittins_slices``).

For a job whose total service S (GPU-seconds per GPU) is unknown and which has attained
``a`` of it, the Gittins index is

    G(a) = max over D > 0 of  P(S - a <= D | S > a) / E[min(S - a, D) | S > a]

(the chance to finish within the next D seconds of service, per second of service spent
trying); serving the job with the highest index first minimizes the mean response time
of an M/G/1 queue with unknown sizes (Gittins; Aalto, Ayesta and Righter). It reduces to
least attained service where the hazard rate decreases (heavy-tailed lengths: the longer a
job has run, the longer it will still run) and to first come first served where it
increases (a job that has run longer is closer to its end).

The distribution of S is the empirical one of the latest ``WINDOW`` departures: the
attained service per GPU of each job when it left the cluster, finished or killed (a killed
job is counted at the service it had: the policy cannot tell a kill from a finish, and a
killed job is as finished for the GPUs). The window is bounded, so memory and cost are, and
it follows a workload that changes.

- The index is computed on a fixed grid of ages (0, then ``GRID_FIRST_S`` x 2^(k/4): steps
  of 19%) every ``REFRESH`` departures, not per call; a unit's index is the one of the
  grid point at or below its service, so it changes only when its service crosses the next
  grid point (the time-slice rotation wakes up then, ``next_change``).
- Cold start: with fewer than ``COLD_START`` departures there is no table (callers fall
  back to ``las_slices``: least attained service).
- The tail: a grid point is estimated only while at least ``MIN_ABOVE`` departures ran
  past it (fewer say little about what remains); from the first grid point with fewer
  (``end``) the distribution says nothing, and a unit there has no index (``at`` is None):
  callers rank it behind every unit with one, by least attained service, as before any
  job left. (A first version estimated points only while 5% of the window ran past them and
  gave a unit beyond the last the index there: on Philly b436b2, whose window's top 5%
  started near an hour, that index was above a newcomer's, and jobs of days then ran first
  come first served ahead of newcomers; docs/simulator.md, "Ablation of the measured slice
  orders".)
- The survivor bias: early in a trace only short jobs have left, so the window ends where
  the short ones do; a long job is then past ``end`` and ordered by least attained service
  behind the jobs the window covers, as under ``las_slices``. The window's reach grows as
  long jobs depart.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

import numpy as np

# The latest departures kept (the empirical distribution).
WINDOW = 1000
# Fewer departures than this: no index (least attained service instead).
COLD_START = 100
# The table is computed again after this many departures (a tenth of the window).
REFRESH = 100
# A grid point's index is estimated only from at least this many departures past it.
MIN_ABOVE = 20
# The first grid point after 0 (the paper's quantum) and the ratio between grid points.
GRID_FIRST_S = 60.0
GRID_RATIO = 2.0 ** 0.25


class GittinsTable:
    """The index on the grid: ``grid[i]`` the ages (rising), ``index[i]`` G there; ``end``:
    the first grid point with too few departures past it (no index from there on)."""

    __slots__ = ("end", "grid", "index", "mrl_peak")

    def __init__(self, grid: list[float], index: list[float], end: float,
                 mrl_peak: float | None = None) -> None:
        self.grid = grid
        self.index = index
        self.end = end
        # ``fifo_after_measured``'s bucket boundary: the grid point where the mean residual
        # service E[S - a | S > a] is highest; None (no bucket) when that is the last point,
        # the mean residual service still rising where the departures end.
        self.mrl_peak = mrl_peak

    @classmethod
    def of(cls, samples: list[float] | deque[float], least: int = MIN_ABOVE) -> GittinsTable:
        """The table of the empirical distribution of ``samples`` (service per GPU, >= 0)."""
        s = np.sort(np.asarray(samples, dtype=float))
        n = len(s)
        grid: list[float] = []
        index: list[float] = []
        residual: list[float] = []
        point = 0.0
        while True:
            i = int(np.searchsorted(s, point, side="right"))
            m = n - i
            if m < least:
                break
            after = GRID_FIRST_S if point == 0.0 else point * GRID_RATIO
            # D is at least the service a unit gets once it runs: a quantum, and the way to
            # the next grid point (the index is looked at again no sooner). Shorter D would
            # make the index of an empirical distribution spike wherever one sample lies
            # just above ``point``.
            least_d = max(GRID_FIRST_S, after - point)
            r = s[i:] - point  # residual service of the jobs that ran past ``point``; all > 0
            k = np.arange(1, m + 1)
            # D = r[k-1]: k of m finish within D; each of them spends its residual, the
            # others D. Between sample points the ratio only falls, so these and D = least_d
            # are the maxima.
            spent = np.cumsum(r) + (m - k) * r
            ratios = (k / spent)[r >= least_d]
            short = r < least_d
            at_least = np.count_nonzero(short) / (float(np.sum(r[short])) + least_d * (m - np.count_nonzero(short)))
            residual.append(float(np.mean(r)))
            grid.append(point)
            index.append(max(at_least, float(np.max(ratios)) if len(ratios) else 0.0))
            point = after
        if not grid:  # too few ran at all: no index anywhere
            return cls([0.0], [0.0], 0.0)
        peak = max(range(len(grid)), key=lambda b: (residual[b], -b))  # the first of equal peaks
        return cls(grid, index, point, grid[peak] if peak < len(grid) - 1 else None)

    def _bin(self, served: float) -> int:
        return max(0, bisect_right(self.grid, served) - 1)

    def at(self, served: float) -> float | None:
        """The index of a unit with ``served`` seconds of service per GPU (None: past ``end``,
        the departures say nothing there)."""
        if served >= self.end:
            return None
        return self.index[self._bin(served)]

    def next_change(self, served: float) -> float:
        """The service at which the index of a unit now at ``served`` (below ``end``) can
        next change: the next grid point, or ``end``."""
        b = self._bin(served) + 1
        return self.grid[b] if b < len(self.grid) else self.end


class ServiceWindow:
    """The service per GPU of the latest departures, and the Gittins table computed from it."""

    def __init__(self, size: int = WINDOW, cold_start: int = COLD_START, refresh: int = REFRESH) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.cold_start = cold_start
        self.refresh = refresh
        self.since = 0  # departures since the table was computed
        self.table: GittinsTable | None = None

    def add(self, served: float) -> None:
        self.samples.append(max(0.0, served))
        self.since += 1
        if len(self.samples) >= self.cold_start and (self.table is None or self.since >= self.refresh):
            self.table = GittinsTable.of(self.samples)
            self.since = 0
