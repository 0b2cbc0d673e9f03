"""PNG plots of simulated runs: JCT and time-to-first-N CDFs per policy, GPU utilization over time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scheduler.sim.engine import SimResult
from scheduler.sim.metrics import utilization_series


def write_plots(results: dict[str, SimResult], directory: Path) -> list[Path]:
    """Write jct_cdf.png, first_n_cdf.png and utilization.png into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)

    def save(fig: Any, ax: Any, name: str, title: str, xlabel: str, ylabel: str) -> Path:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        path = directory / name
        fig.tight_layout()
        # Written whole or not at all: into a temporary file beside it, then renamed over
        # it, so an interrupted run never leaves a truncated PNG (or loses the last good one).
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        try:
            fig.savefig(tmp, dpi=120, format="png")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)
        return path

    def ecdf(ax: Any, values: list[float], name: str) -> None:
        """The empirical CDF of ``values`` as steps rising from 0: drawn point to point from
        the first job's (x, 1/n), a policy with one finished job drew nothing at all, and
        the y axis spanned 0.96-1.04."""
        if values:
            xs = sorted(values)
            ax.step([xs[0], *xs], [0.0, *((i + 1) / len(xs) for i in range(len(xs)))], where="post", label=name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        ecdf(ax, [(j.finished_at - j.spec.submit_time) / 3600.0 for j in result.jobs if j.finished_at is not None],
            name)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    cdf = save(fig, ax, "jct_cdf.png", "JCT CDF", "job completion time (hours, log scale)", "fraction of jobs")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        ecdf(ax, [max(1.0, j.first_n_at - j.spec.submit_time) for j in result.jobs if j.first_n_at is not None], name)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    first = save(fig, ax, "first_n_cdf.png", "Early feedback: time to the first mini-batches",
                 "seconds from submission to the first N mini-batches (log scale)", "fraction of jobs")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        xs, ys = utilization_series(result)
        ax.plot(xs, ys, label=name)
    ax.set_ylim(0, 1.05)
    util = save(fig, ax, "utilization.png", "GPU utilization over time", "hours since the first arrival",
                "fraction of GPUs running a job")
    return [cdf, first, util]
