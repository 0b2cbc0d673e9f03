"""Metrics of one simulated run: job completion times, makespan, utilization, counts."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from scheduler.sim.engine import SimResult


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(result: SimResult) -> dict[str, Any]:
    """Everything the table and ``-o json`` show, in seconds and fractions."""
    jobs = result.jobs
    jct = [j.finished_at - j.spec.submit_time for j in jobs if j.finished_at is not None]
    queued = [j.first_run_at - j.spec.submit_time for j in jobs if j.first_run_at is not None]
    first_n = [j.first_n_at - j.spec.submit_time for j in jobs if j.first_n_at is not None]
    start = min((j.spec.submit_time for j in jobs), default=0.0)
    end = max((j.finished_at or 0.0 for j in jobs), default=0.0)
    makespan = max(0.0, end - start)
    capacity = result.num_gpus * makespan
    return {
        "jobs_finished": len(jct),
        "jobs_unfinished": len(result.unfinished),
        "jobs_skipped": len(result.skipped),
        "avg_jct_s": statistics.fmean(jct) if jct else 0.0,
        "median_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "makespan_s": makespan,
        "avg_queueing_delay_s": statistics.fmean(queued) if queued else 0.0,
        "utilization": result.busy_gpu_s / capacity if capacity else 0.0,
        "avg_time_to_first_n_s": statistics.fmean(first_n) if first_n else 0.0,
        "median_time_to_first_n_s": percentile(first_n, 50),
        "suspends": result.counts.get("suspends", 0),
        "parks": result.counts.get("parks", 0),
        "packs": result.counts.get("packs", 0),
        "unpacks": result.counts.get("unpacks", 0),
        "migrations": result.counts.get("migrations", 0),
        "grows": result.counts.get("grows", 0),
        "shrinks": result.counts.get("shrinks", 0),
        "decide_calls": result.decide_calls,
        "max_suspended_per_server": result.max_suspended_per_server,
    }


def utilization_series(result: SimResult, buckets: int = 200) -> tuple[list[float], list[float]]:
    """(hours since the first arrival, fraction of GPUs busy) averaged over ``buckets`` equal
    spans of the run, from the first arrival to the last completion (the makespan: the
    series' mean is the run's utilization)."""
    series = result.busy_series
    if len(series) < 2:
        return [], []
    t0, t1 = series[0][0], series[-1][0]
    if t1 <= t0:
        return [], []
    width = (t1 - t0) / buckets
    area = [0.0] * buckets
    for (ta, busy), (tb, _) in itertools.pairwise(series):
        if tb <= ta or busy == 0:
            continue
        first = min(int((ta - t0) / width), buckets - 1)
        last = min(int((tb - t0) / width), buckets - 1)
        for k in range(first, last + 1):
            lo = max(ta, t0 + k * width)
            hi = min(tb, t0 + (k + 1) * width) if k < buckets - 1 else tb
            if hi > lo:
                area[k] += busy * (hi - lo)
    xs = [(k + 0.5) * width / 3600.0 for k in range(buckets)]
    return xs, [a / (width * result.num_gpus) for a in area]
