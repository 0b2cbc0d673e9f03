"""`gandiva bench migration`: the migration latency benchmark (issue 4), with the helper
code it drives (migration_helper.bench).

Runs real TensorFlow jobs on two local helpers and migrates them back and forth by
the pre-warmed fast path and by the naive path (stop, cold start, restore from
disk), then prints a table and writes a CSV and a PNG chart. Figures on a shared
machine are noisy: compare fast and naive from the same run.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks")
    sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    mig = sub.add_parser(
        "migration",
        help="migration latency: pre-warmed fast path vs naive restart, real TensorFlow jobs",
        description=__doc__,
    )
    mig.add_argument("--models", default="mlp,resnet50,vgg16",
                     help="comma-separated: mlp, resnet50 (25M params), vgg16 (138M params)")
    mig.add_argument("--replicas", default="1,2,4,8", help="comma-separated replica counts")
    mig.add_argument("--repeats", type=int, default=3, help="migrations per path and size (default 3)")
    mig.add_argument("--transfer", choices=["shared", "stream"], default="shared",
                     help="fast path checkpoint route: shared mount (default) or gRPC stream")
    mig.add_argument("--out", type=Path, default=None,
                     help="directory for the CSV, the chart and job logs (default ./bench-migration-TIME)")
    mig.add_argument("--quick", action="store_true",
                     help="mlp and resnet50, 1 and 2 replicas, 1 repeat (a minute or two)")
    mig.add_argument("--job-arg", action="append", default=[],
                     help="extra argument for every example program (repeatable), e.g. --job-arg=--threads=1")
    mig.set_defaults(func=run_migration)


def _ints(value: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag} {value!r}: expected comma-separated integers") from None


def run_migration(args: argparse.Namespace) -> int:
    from migration_helper.bench import BenchConfig

    out = args.out or Path(f"bench-migration-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        config = BenchConfig(
            models=("mlp", "resnet50") if args.quick else tuple(m.strip() for m in args.models.split(",") if m.strip()),
            replicas=(1, 2) if args.quick else _ints(args.replicas, "--replicas"),
            repeats=1 if args.quick else args.repeats,
            out_dir=out, transfer=args.transfer, job_args=tuple(args.job_arg),
        )
    except ValueError as exc:
        print(f"gandiva bench migration: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=out / "bench.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from scheduler.cli.serve import run_loop

    return run_loop(_run(config))


async def _run(config: Any) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from migration_helper import bench_report
    from migration_helper.bench import Measurement, run_bench

    # Wide enough for the table when the output goes to a file or a pipe.
    console = Console(width=None if sys.stdout.isatty() else 130)
    results: list[Measurement] = []
    total = len(config.models) * len(config.replicas) * config.repeats * 2
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("starting helpers", total=total)

        def on_config(model: str, replicas: int) -> None:
            progress.update(task, description=f"{model} x{replicas}: starting the job")

        def on_result(m: Measurement) -> None:
            results.append(m)
            progress.update(task, advance=1, description=f"{m.model} x{m.replicas}: {m.path} {m.total_s:.2f} s")

        try:
            await run_bench(config, on_result, on_config)
        except (RuntimeError, TimeoutError) as exc:
            console.print(f"[red]benchmark stopped: {exc}[/red] (see {config.out_dir / 'logs'})")
            if not results:
                return 1
    summaries = bench_report.summarize(results)
    table = Table(title=f"Migration latency, seconds from the stop command to the first step at the "
                        f"destination (fast path via {config.transfer}; x = replicas; phase medians)")
    for h in bench_report.TABLE_HEADER:
        table.add_column(h, justify="left" if h in ("model", "path") else "right")
    for row in bench_report.table_rows(summaries):
        table.add_row(*row)
    console.print(table)
    csv_path, png_path = config.out_dir / "migration.csv", config.out_dir / "migration.png"
    bench_report.write_csv(results, csv_path)
    bench_report.write_chart(summaries, png_path)
    for line in _goals(summaries):
        console.print(line)
    console.print(f"wrote {csv_path} and {png_path}")
    return 0


def _goals(summaries: list[Any]) -> list[str]:
    """The issue's goals for the ResNet-50-sized model, checked against this run."""
    from migration_helper.bench_report import speedups

    fast = {s.replicas: s.median_s for s in summaries if s.model == "resnet50" and s.path == "fast"}
    ups = {r: v for (m, r), v in speedups(summaries).items() if m == "resnet50"}
    lines = []

    def check(ok: bool, text: str) -> None:
        lines.append(f"{'[green]MET[/green]' if ok else '[red]MISSED[/red]'}  {text}")

    for r, t in sorted(fast.items()):
        check(t <= 1.0, f"resnet50 x{r} fast path {t:.2f} s (goal <= 1.0 s)")
    if 1 in ups:
        check(ups[1] >= 5, f"resnet50 x1 speedup {ups[1]:.1f}x (goal >= 5x)")
    if 8 in ups:
        check(ups[8] >= 10, f"resnet50 x8 speedup {ups[8]:.1f}x (goal >= 10x)")
    if 1 in fast and max(fast) > 1:
        lines.append(f"      resnet50 fast path x{max(fast)} / x1 = {fast[max(fast)] / fast[1]:.2f} (flat is 1.0)")
    return lines
