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
- ``gittins_censored`` (off by default) removes that bias: when the table is computed, the
  jobs still in the cluster with some service count too, as observations censored at the
  service they have (they will run at least that long), and the distribution is the
  Kaplan-Meier estimate of the departures and those. A grid point then has an index while
  20 jobs, departed or present, ran past it and some departed past it; the mass the
  estimate leaves beyond the longest departure (jobs still running past it) never finishes
  within any D.
- ``gittins_history`` (off by default) mixes in a prior: the table is of the window and an
  even sample of the departures before it (``ServiceWindow.older``), so a burst of short
  jobs filling the window does not erase what the long jobs before it told (ITP cluster09;
  measured in docs/simulator.md: it loses ITP cluster02's JCT goal).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable

import numpy as np

# The latest departures kept (the empirical distribution).
WINDOW = 1000
# Fewer departures than this: no index (least attained service instead).
COLD_START = 100
# The table is computed again after this many departures (a tenth of the window).
REFRESH = 100
# A grid point's index is estimated only from at least this many departures past it.
MIN_ABOVE = 20
# ``gittins_history``: at most this many departures kept evenly over the whole history.
HISTORY = 1000
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

    @classmethod
    def censored(cls, samples: list[float] | deque[float], live: list[float],
                 least: int = MIN_ABOVE) -> GittinsTable:
        """The table of the Kaplan-Meier estimate of ``samples`` (service per GPU of departed
        jobs) and ``live`` (service per GPU of jobs still present: censored there)."""
        values = np.concatenate([np.asarray(samples, dtype=float), np.asarray(live, dtype=float)])
        event = np.concatenate([np.ones(len(samples), dtype=bool), np.zeros(len(live), dtype=bool)])
        # Ascending; at a tie the departure first (a job censored at c ran at least c).
        order = np.lexsort((~event, values))
        values, event = values[order], event[order]
        n = len(values)
        at_risk = n - np.arange(n)
        hazard = event / at_risk
        after = np.cumprod(1.0 - hazard)  # KM survival just after each observation
        before = np.concatenate([[1.0], after[:-1]])
        mass = before * hazard  # the estimate's mass at each departure (0 at a censoring)
        grid: list[float] = []
        index: list[float] = []
        residual: list[float] = []
        point = 0.0
        while True:
            i = int(np.searchsorted(values, point, side="right"))
            if n - i < least or not event[i:].any():
                break  # too few past it, or no departure: the estimate says nothing there
            nxt = GRID_FIRST_S if point == 0.0 else point * GRID_RATIO
            least_d = max(GRID_FIRST_S, nxt - point)
            total = float(before[i])  # P(S > point)
            r = values[i:][event[i:]] - point
            w = mass[i:][event[i:]]
            # A departure lies past ``point``, so total > 0 (the estimate keeps its mass).
            cum = np.cumsum(w)
            spent = np.cumsum(w * r) + (total - cum) * r
            ok = r >= least_d
            value = float(np.max(cum[ok] / spent[ok])) if np.any(ok) else 0.0
            short = ~ok
            ws = float(np.sum(w[short]))
            value = max(value, ws / (float(np.sum(w[short] * r[short])) + least_d * (total - ws)))
            # The mean residual, the mass left beyond the last departure put at the
            # longest observation (a lower bound: those jobs run at least that long).
            tail = total - float(cum[-1])
            residual.append((float(np.sum(w * r)) + tail * (values[-1] - point)) / total)
            grid.append(point)
            index.append(value)
            point = nxt
        if not grid:
            return cls([0.0], [0.0], 0.0)
        peak = max(range(len(grid)), key=lambda b: (residual[b], -b))
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
    """The service per GPU of the latest departures, and the Gittins table computed from it;
    beside them an even sample of every departure so far (``gittins_history``)."""

    def __init__(self, size: int = WINDOW, cold_start: int = COLD_START, refresh: int = REFRESH,
                 history_size: int = HISTORY) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.cold_start = cold_start
        self.refresh = refresh
        self.since = 0  # departures since the table was computed
        self.table: GittinsTable | None = None
        # Every ``stride``-th departure (numbered from 0, kept with its number); when more
        # than ``history_size`` are kept, every other one goes and the stride doubles, so
        # the kept ones stay evenly spread over the whole history at bounded memory.
        self.history: list[tuple[int, float]] = []
        self.history_size = history_size
        self.stride = 1
        self.departed = 0

    def _keep(self, served: float) -> None:
        if self.departed % self.stride == 0:
            self.history.append((self.departed, served))
            if len(self.history) > self.history_size:
                self.history = self.history[::2]
                self.stride *= 2
        self.departed += 1

    def older(self) -> list[float]:
        """The history's sample of the departures before the window (none of the window's)."""
        first = self.departed - len(self.samples)
        return [served for number, served in self.history if number < first]

    def add(self, served: float, live: Callable[[], list[float]] | None = None, history: bool = False) -> None:
        """One departure with ``served`` seconds of service per GPU. ``live``: with
        ``gittins_censored``, what gives the service per GPU of the jobs still present
        (called only when the table is computed). ``history`` (``gittins_history``): the
        table is of the window and the history's sample of the departures before it."""
        served = max(0.0, served)
        self.samples.append(served)
        if history:  # (off: no sample kept, nothing done per departure)
            self._keep(served)
        self.since += 1
        if len(self.samples) >= self.cold_start and (self.table is None or self.since >= self.refresh):
            samples: deque[float] | list[float] = self.samples
            if history:
                samples = [*self.samples, *self.older()]
            if live is None:
                self.table = GittinsTable.of(samples)
            else:
                self.table = GittinsTable.censored(samples, [x for x in live() if x > 0])
            self.since = 0
