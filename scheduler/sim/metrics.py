"""Metrics of one simulated run: job completion times, makespan, utilization, counts."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

from scheduler.sim.engine import SimResult
from scheduler.sim.trace import JobSpec


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def makespan_span(result: SimResult) -> tuple[float, float]:
    """(the first arrival of the jobs the replay ran, finished or not; the last finish): the
    makespan's span. Not from the first *finished* job's arrival: a first arrival left
    unfinished made the makespan shorter than the run (and than its lower bound, which counts
    from the first arrival too). Jobs wider than the cluster are skipped, not run: not counted.
    The replay starts its GPU-use series at its first arrival (``SimBackend.start``)."""
    start = min((j.spec.submit_time for j in result.jobs), default=math.inf)
    if result.unfinished and result.busy_series:
        start = min(start, result.busy_series[0][0])
    end = max((j.finished_at or 0.0 for j in result.jobs), default=0.0)
    return (start if math.isfinite(start) else 0.0), end


def _busy_gpu_s(series: list[tuple[float, int]], t0: float, t1: float) -> float:
    """GPU-seconds busy between ``t0`` and ``t1`` of a (time, GPUs busy from then) series."""
    total = 0.0
    for (ta, busy), tb in zip(series, [t for t, _ in series[1:]] + [t1], strict=True):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi > lo:
            total += busy * (hi - lo)
    return total


def summarize(result: SimResult) -> dict[str, Any]:
    """Everything the table and ``-o json`` show, in seconds and fractions."""
    jobs = result.jobs
    jct = [j.finished_at - j.spec.submit_time for j in jobs if j.finished_at is not None]
    queued = [j.first_run_at - j.spec.submit_time for j in jobs if j.first_run_at is not None]
    first_n = [j.first_n_at - j.spec.submit_time for j in jobs if j.first_n_at is not None]
    start, end = makespan_span(result)
    makespan = max(0.0, end - start)
    capacity = result.num_gpus * makespan
    # GPU use up to the last finish only: a job left unfinished may hold GPUs to the replay's
    # end, after it (utilization 1.07, or 24 under tiresias, was printed).
    busy = _busy_gpu_s(result.busy_series, start, end) if result.unfinished else result.busy_gpu_s
    return {
        "jobs_finished": len(jct),
        "jobs_unfinished": len(result.unfinished),
        "jobs_skipped": len(result.skipped),
        "avg_jct_s": statistics.fmean(jct) if jct else 0.0,
        "median_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "makespan_s": makespan,
        "avg_queueing_delay_s": statistics.fmean(queued) if queued else 0.0,
        "utilization": busy / capacity if capacity else 0.0,
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


COUNT_COLUMNS = ("suspends", "resumes", "parks", "packs", "unpacks", "migrations", "grows", "shrinks")


def job_columns(first_n: int) -> list[str]:
    """The columns of ``gandiva sim --jobs-csv`` (``first_n``: its --first-n)."""
    return ["policy", "job_id", "status", "num_gpus", "model", "submit_s", "first_run_s", f"first_{first_n}_at_s",
            "finished_s", "jct_s", "queueing_delay_s", f"time_to_first_{first_n}_s", *COUNT_COLUMNS, "note"]


def _ms(seconds: float) -> float:
    """Seconds to the millisecond (73.746, not 73.74600000000001); -0.0 read as 0.0."""
    return round(seconds, 3) + 0.0


def job_rows(result: SimResult, specs: list[JobSpec], first_n: int,
             left_out: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """One row per job of ``result`` (``job_columns``): every finished job with its times, as
    ``summarize`` counts them (the mean of ``jct_s`` is ``avg_jct_s``, and so on), then the
    unfinished and skipped jobs of ``specs`` and the ``left_out`` (job id or "", why) ones,
    their times empty and the note saying why. Times are virtual seconds of the replay."""
    def row(spec: JobSpec | None, status: str, note: str = "", job_id: str = "") -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(job_columns(first_n), "")
        out.update(policy=result.policy, job_id=spec.id if spec is not None else job_id, status=status, note=note)
        if spec is not None:
            out.update(num_gpus=spec.num_gpus, model=spec.model)
            if status != "left_out":  # (a left-out job's submit time is not scaled by --target-load)
                out.update(submit_s=_ms(spec.submit_time))
        return out

    rows = []
    for job in sorted(result.jobs, key=lambda j: (j.spec.submit_time, j.arrival)):
        out = row(job.spec, "finished")
        submit = job.spec.submit_time
        if job.first_run_at is not None:
            out.update(first_run_s=_ms(job.first_run_at), queueing_delay_s=_ms(job.first_run_at - submit))
        if job.first_n_at is not None:
            out[f"first_{first_n}_at_s"] = _ms(job.first_n_at)
            out[f"time_to_first_{first_n}_s"] = _ms(job.first_n_at - submit)
        if job.finished_at is not None:
            out.update(finished_s=_ms(job.finished_at), jct_s=_ms(job.finished_at - submit))
        out.update({kind: job.counts.get(kind, 0) for kind in COUNT_COLUMNS})
        rows.append(out)
    by_id = {s.id: s for s in specs}
    total = result.num_gpus
    for jid in result.unfinished:
        rows.append(row(by_id.get(jid), "unfinished", "did not finish: the replay ended with it not done "
                                                     "(no policy decision could run it)", jid))
    for jid in result.skipped:
        spec = by_id.get(jid)
        gpus = f"{spec.num_gpus} GPUs, " if spec is not None else ""
        rows.append(row(spec, "skipped", f"needs {gpus}more than the cluster's {total}: not replayed", jid))
    for jid, why in left_out:
        rows.append(row(by_id.get(jid), "left_out", why, jid))
    return rows
