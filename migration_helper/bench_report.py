"""Summaries of the migration benchmark: medians and spread, the table, CSV, PNG."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from migration_helper.bench import PHASES, Measurement


@dataclass(frozen=True)
class Summary:
    model: str
    replicas: int
    path: str
    n: int
    median_s: float
    min_s: float
    max_s: float
    phases: dict[str, float]  # medians
    prewarm_s: float


def summarize(results: list[Measurement]) -> list[Summary]:
    groups: dict[tuple[str, int, str], list[Measurement]] = defaultdict(list)
    for m in results:
        groups[(m.model, m.replicas, m.path)].append(m)
    out = []
    for (model, replicas, path), ms in groups.items():
        totals = [m.total_s for m in ms]
        out.append(Summary(
            model, replicas, path, len(ms), statistics.median(totals), min(totals), max(totals),
            {p: statistics.median(m.phases.get(p, 0.0) for m in ms) for p in PHASES},
            statistics.median(m.prewarm_s for m in ms)))
    return sorted(out, key=lambda s: (s.model, s.replicas, s.path))


def speedups(summaries: list[Summary]) -> dict[tuple[str, int], float]:
    by = {(s.model, s.replicas, s.path): s for s in summaries}
    return {
        (s.model, s.replicas): by[(s.model, s.replicas, "naive")].median_s / s.median_s
        for s in summaries
        if s.path == "fast" and (s.model, s.replicas, "naive") in by and s.median_s > 0
    }


def write_csv(results: list[Measurement], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "replicas", "path", "repeat", "total_s", *PHASES, "prewarm_s", "step"])
        for m in results:
            w.writerow([m.model, m.replicas, m.path, m.repeat, f"{m.total_s:.4f}",
                        *(f"{m.phases.get(p, 0.0):.4f}" for p in PHASES), f"{m.prewarm_s:.4f}", m.step])


def table_rows(summaries: list[Summary]) -> list[list[str]]:
    ups = speedups(summaries)
    rows = []
    for s in summaries:
        up = ups.get((s.model, s.replicas)) if s.path == "fast" else None
        rows.append([
            s.model, str(s.replicas), s.path, f"{s.median_s:.2f}", f"{s.min_s:.2f}-{s.max_s:.2f}",
            *(f"{s.phases[p]:.2f}" for p in PHASES),
            f"{s.prewarm_s:.2f}" if s.path == "fast" else "-",
            f"{up:.1f}x" if up else "",
        ])
    return rows


# Short names: the table must fit a terminal. Columns after "range" are phase medians.
SHORT = {"wait_boundary": "boundary", "save": "save", "transfer": "xfer", "cold_start": "cold",
         "restore": "restore", "first_step": "1st step"}
TABLE_HEADER = ["model", "x", "path", "median s", "range s", *(SHORT[p] for p in PHASES), "prewarm", "speedup"]


def write_chart(summaries: list[Summary], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    models = sorted({s.model for s in summaries})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), squeeze=False)
    cmap = plt.get_cmap("tab10")
    colors = {p: cmap(i) for i, p in enumerate(PHASES)}
    for ax, model in zip(axes[0], models, strict=True):
        rows = [s for s in summaries if s.model == model]
        replicas = sorted({s.replicas for s in rows})
        for j, path in enumerate(("fast", "naive")):
            for i, r in enumerate(replicas):
                s = next((x for x in rows if x.replicas == r and x.path == path), None)
                if s is None:
                    continue
                x = i + (j - 0.5) * 0.38
                bottom = 0.0
                for p in PHASES:
                    ax.bar(x, s.phases[p], 0.36, bottom=bottom, color=colors[p],
                           label=p if i == 0 else None,
                           hatch="//" if path == "naive" else None, edgecolor="white")
                    bottom += s.phases[p]
                ax.errorbar(x, s.median_s, yerr=[[s.median_s - s.min_s], [s.max_s - s.median_s]],
                            fmt="k_", capsize=3)
        ax.set_xticks(range(len(replicas)), [f"{r}" for r in replicas])
        ax.set_xlabel("replicas (left: fast, right hatched: naive)")
        ax.set_ylabel("stop command to first step at destination (s)")
        ax.set_title(model)
        handles, labels = ax.get_legend_handles_labels()
        uniq: dict[str, object] = {}
        for label, handle in zip(labels, handles, strict=True):
            uniq.setdefault(label, handle)  # the plain (fast) bar's patch, not the hatched one
        ax.legend(uniq.values(), uniq.keys(), fontsize=7)
    fig.suptitle("Gandiva migration latency: pre-warmed fast path vs naive restart (median, min-max)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
