"""PNG plots of simulated runs: JCT CDF per policy and GPU utilization over time."""

from __future__ import annotations

from pathlib import Path

from scheduler.sim.engine import SimResult
from scheduler.sim.metrics import utilization_series


def write_plots(results: dict[str, SimResult], directory: Path) -> list[Path]:
    """Write jct_cdf.png and utilization.png into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        jct = sorted((j.finished_at - j.spec.submit_time) / 3600.0
                     for j in result.jobs if j.finished_at is not None)
        if jct:
            ax.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    cdf = directory / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        xs, ys = utilization_series(result)
        ax.plot(xs, ys, label=name)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("fraction of GPUs running a job")
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU utilization over time")
    ax.grid(alpha=0.3)
    ax.legend()
    util = directory / "utilization.png"
    fig.tight_layout()
    fig.savefig(util, dpi=120)
    plt.close(fig)
    return [cdf, util]
