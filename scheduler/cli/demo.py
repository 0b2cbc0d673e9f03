"""`gandiva demo`: the main job on the embedded default, showing the scheduler think.

Starts a real scheduler on the SQLite file under GANDIVA_HOME (with its metrics and
live dashboard on an HTTP port), two real helpers with two virtual GPUs each, and
submits real TensorFlow training jobs: a grow-shrink job, a sweep of 8
configurations, then a short, a long and a 2-GPU job, then late jobs. Four GPUs for
thirteen jobs and more: the scheduler itself time-slices, tries packs and keeps or undoes them by
the measured rate, migrates to make room for the 2-GPU job on one server, grows and
shrinks, and each decision is printed with its
reason as it happens. The end: a summary per job, the best configuration of the
sweep and a PNG timeline of the GPUs. Everything runs as separate processes talking
gRPC over loopback, exactly as on a real cluster; the policy's timers are shortened
(6 s time slices, 4 s packing trials) so that the story fits in about 3 minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from scheduler.cli.argtypes import mini_batches, positive_seconds, whole_number
from scheduler.cli.local_cluster import LocalCluster
from scheduler.config import default_db_url, gandiva_home
from scheduler.validation import MAX_SERVER_GPUS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a local cluster (scheduler, helpers, real TensorFlow jobs) end to end",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Bounded: `--servers 100000` started helper after helper (a process of about 90 MB each)
    # until it was stopped; 0 or -1 started none and the jobs waited out --timeout; `--gpus 1`
    # ended in a traceback at the story's 2-GPU job, which fits no server then.
    p.add_argument("--servers", type=whole_number(1, 16, " (each a helper process on this machine)"), default=2,
                   help="local helpers to start (default 2; at most 16)")
    p.add_argument("--gpus", type=whole_number(2, MAX_SERVER_GPUS,
                                                f" (the story has a 2-GPU job; a helper has at most {MAX_SERVER_GPUS})"),
                   default=2, help="virtual GPUs per helper (default 2)")
    p.add_argument("--steps", type=mini_batches, default=400,
                   help="mini-batches per sweep member (default 400; the other jobs run multiples of it)")
    p.add_argument("--http-listen", default="127.0.0.1:0",
                   help="where the dashboard and /metrics listen (default 127.0.0.1, a free port)")
    p.add_argument("--http-allow-host", action="append", default=[], metavar="NAME",
                   help="a name the dashboard's users type (repeatable): needed with --http-listen on a "
                   "network address, as for `gandiva scheduler` (others get 421, against DNS rebinding)")
    p.add_argument("--db", default=None, help="database URL (default: the SQLite file under GANDIVA_HOME)")
    p.add_argument("--timeout", type=positive_seconds, default=300, help="give up after this many seconds (default 300)")
    p.add_argument("--keep", action="store_true", help="leave the scheduler and helpers running at the end")
    p.set_defaults(func=run)


# Shorter timers than the paper's, so that every primitive shows within minutes. grow_idle_s
# is longer than the story's other waits: where the sweep's last jobs run on a loaded machine,
# the grow-shrink job grew beside them (idle GPUs, nothing waiting: a right grow) before the
# locality story that needs it on one GPU (its 2-GPU job then time-sliced with it, no move).
DEMO_POLICY = ("pack_trial_s=4", "slice_growth=0", "slice_slack_s=1", "grow_idle_s=30", "defrag_interval_s=10")


def local_cluster(args: argparse.Namespace, run_dir: Path, db: str, names: list[str]) -> LocalCluster:
    """The demo's scheduler and helpers, not started. --http-allow-host goes to its scheduler:
    `--http-listen 0.0.0.0:9100` is refused without it (no tokens), and the refusal's "Give
    --http-allow-host NAME" named a flag the demo did not take."""
    # 50051 (the clients' default address) when the scheduler can bind it, else a free port
    # (LocalCluster.port_fallback): a check that it was free before the scheduler bound it
    # failed the demo when something took it in between.
    return LocalCluster(run_dir, db, names, args.gpus, http_listen=args.http_listen, port=50051, port_fallback=True,
                        scheduler_args=["--quantum", "6", "--tick", "0.5",
                                        *(x for opt in DEMO_POLICY for x in ("--policy-option", opt)),
                                        *(x for name in args.http_allow_host for x in ("--http-allow-host", name))])


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    # Piped into a file or a test, rich would assume 80 columns and fold the summary.
    console = Console(width=None if sys.stdout.isatty() else 120)
    home = gandiva_home()
    run_dir = home / "demo" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    db = args.db or default_db_url()
    names = [f"node-{i + 1}" for i in range(args.servers)]
    cluster = local_cluster(args, run_dir, db, names)
    try:
        address = cluster.start_scheduler()
        console.print(f"scheduler on {address}, state in {db}" + (f" ({cluster.note})" if cluster.note else ""))
        http = cluster.http
        console.print(f"[bold]dashboard: http://{http}/[/]   (metrics: http://{http}/metrics, "
                      f"or `gandiva top --http {http}`)")
        console.print(f"helpers {', '.join(names)} with {args.gpus} virtual GPUs each")
        cluster.start_helpers({**os.environ, "GANDIVA_HOME": str(home)})
        cluster.wait_for_helpers()
        from scheduler.cli.demo_run import DemoRun

        demo = DemoRun(address, http, args.steps, run_dir, console)
        ok = demo.play(args.timeout)
        if args.keep:
            console.print(
                f"\nStill running (scheduler at {address}); try:\n"
                f"  export GANDIVA_SCHEDULER={address}\n  gandiva get jobs\n  gandiva get events\n"
                f"  open http://{http}/\n"
                f"Stop it with: kill {' '.join(str(p) for p in cluster.pids())}; then remove its ramdisks: "
                f"rm -r {' '.join(str(cluster.ramdisk(n)) for n in names)}"
            )
            cluster.procs.clear()
        console.print(f"\nLogs: {run_dir}", soft_wrap=True)
        return 0 if ok else 1
    except (RuntimeError, OSError) as err:
        console.print(f"[red]gandiva demo: {err}[/] (logs in {run_dir})")
        return 1
    finally:
        cluster.stop()
