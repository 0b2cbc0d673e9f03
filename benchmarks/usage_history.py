"""What `gandiva get usage` costs a real `gandiva scheduler` on a long SQLite history.

Fills a fresh SQLite database (the schema of `gandiva db upgrade`) with DAYS days of
finished jobs, JOBS_PER_DAY a day for 20 users, each queued for a while and then time-sliced
(SLICES suspend/resume pairs; one job in twenty SLICES x 20, a long job of many turns), starts
a real scheduler on it, and times `GetUsage` over the last 7 days, per user and by job, while
a client asks GetJob back to back (the slowest GetJob meanwhile: how long the accounting held
the event loop). Prints the history's size and each time, with the machine's load.

    PYTHONPATH=. python benchmarks/usage_history.py [--days 30] [--jobs-per-day 2000] [--slices 4] [--reuse DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import create_engine, func, insert, select

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.state.models import Job, Transition

DAY = 86400.0


def fill(path: Path, days: int, per_day: int, slices: int, now: float) -> None:
    """The history."""
    rng = random.Random(0)
    engine = create_engine(f"sqlite:///{path}")
    jobs: list[dict] = []
    changes: list[dict] = []
    with engine.begin() as conn:
        for k in range(days * per_day):
            submitted = now - days * DAY + k * DAY / per_day
            at, gpus = submitted + rng.uniform(0, 3600), rng.choice((1, 1, 2, 4))
            started = at
            seq = [("QUEUED", "RUNNING", at)]
            for _ in range(slices * (20 if k % 20 == 0 else 1)):
                at += rng.uniform(60, 600)
                seq.append(("RUNNING", "SUSPENDED", at))
                at += rng.uniform(60, 600)
                seq.append(("SUSPENDED", "RUNNING", at))
            at += rng.uniform(60, 600)
            seq.append(("RUNNING", "SUCCEEDED", at))
            add_job(jobs, changes, k, gpus, submitted, started, seq)
            if len(changes) > 50000:
                insert_all(conn, {Job: jobs, Transition: changes})
        insert_all(conn, {Job: jobs, Transition: changes})


def add_job(jobs: list[dict], changes: list[dict], k: int, gpus: int, submitted: float, started: float,
            seq: list[tuple[str, str, float]]) -> None:
    """Job ``k`` of user ``k % 20``, SUCCEEDED at the last change of ``seq`` (its state changes)."""
    job_id, at = f"j-{k:010x}", seq[-1][2]
    jobs.append({"id": job_id, "name": f"train-{k}", "command": ["python", "t.py"], "gpus": gpus,
                 "user": f"user{k % 20}", "state": "SUCCEEDED", "submitted_at": submitted,
                 "updated_at": at, "started_at": started, "state_changed_at": at, "finished_at": at})
    changes.extend({"job_id": job_id, "from_state": f, "to_state": t, "at": a, "reason": "time slice over"}
                   for f, t, a in seq)


def insert_all(conn: Any, batches: dict[Any, list[dict]]) -> None:
    """Insert each table's rows (in the order given: jobs first) and empty the lists."""
    for table, rows in batches.items():
        if rows:
            conn.execute(insert(table), rows)
        rows.clear()


def upgrade(url: str, env: dict[str, str]) -> None:
    """A fresh database with the schema of `gandiva db upgrade`."""
    subprocess.run([sys.executable, "-m", "gandiva_cli.main", "db", "upgrade", "--db", url], check=True, env=env,
                   capture_output=True)


def start_scheduler(home: Path, url: str, env: dict[str, str], *flags: str) -> tuple[subprocess.Popen, str]:
    """A real `gandiva scheduler` on ``url`` (its log in HOME/log), once it listens: the
    process and its gRPC address."""
    port_file = home / "port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--db", url, "--listen", "127.0.0.1:0",
         "--port-file", str(port_file), *flags], stdout=(home / "log").open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while not (port_file.exists() and port_file.read_text().strip()):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"the scheduler did not start; see {home}/log")
        time.sleep(0.1)
    return proc, port_file.read_text().strip()


def history_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a history benchmark: its size, or an earlier run's folder to ask again."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--jobs-per-day", type=int, default=2000)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--reuse", type=Path, default=None, metavar="DIR",
                        help="the folder of an earlier run (its s.db): ask again without filling one")
    return parser


def history_home(reuse: Path | None, prefix: str) -> tuple[Path, Path, str, dict[str, str]]:
    """The run's folder (a new one unless ``reuse``), its SQLite file, URL and environment."""
    home = reuse or Path(tempfile.mkdtemp(prefix=prefix))
    db = home / "s.db"
    return home, db, f"sqlite+aiosqlite:///{db}", {**os.environ, "GANDIVA_HOME": str(home)}


def main() -> int:
    args = history_parser(__doc__).parse_args()
    home, db, url, env = history_home(args.reuse, "gandiva-usage-")
    if args.reuse is None:
        upgrade(url, env)
        t0 = time.monotonic()
        fill(db, args.days, args.jobs_per_day, args.slices, time.time())
        print(f"written in {time.monotonic() - t0:.0f}s into {home}", flush=True)
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        jobs = conn.execute(select(func.count()).select_from(Job)).scalar_one()
        changes = conn.execute(select(func.count()).select_from(Transition)).scalar_one()
    print(f"history: {jobs:,} jobs, {changes:,} state changes, {db.stat().st_size / 2**20:.0f} MiB", flush=True)
    proc, address = start_scheduler(home, url, env)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        some_job = f"j-{jobs - 1:010x}"
        baseline = []
        for _ in range(20):
            t = time.monotonic()
            stub.GetJob(scheduler_pb2.GetJobRequest(id=some_job), timeout=60)
            baseline.append(time.monotonic() - t)
        print(f"GetJob alone: slowest of 20 {max(baseline) * 1000:.0f} ms", flush=True)
        stub.GetJob(scheduler_pb2.GetJobRequest(id=some_job), timeout=60)
        for label, by_job in (("per user", False), ("by job", True), ("per user", False)):
            slowest, stop = [0.0], threading.Event()

            def ask(slowest: list[float] = slowest, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    t = time.monotonic()
                    stub.GetJob(scheduler_pb2.GetJobRequest(id=some_job), timeout=60)
                    slowest[0] = max(slowest[0], time.monotonic() - t)

            asker = threading.Thread(target=ask)
            asker.start()
            t = time.monotonic()
            got = stub.GetUsage(scheduler_pb2.GetUsageRequest(since=time.time() - 7 * DAY, by_job=by_job), timeout=600)
            took = time.monotonic() - t
            stop.set()
            asker.join()
            print(f"GetUsage --since 7d {label}: {took:.2f}s, {got.total.jobs:,} jobs counted, "
                  f"{got.total.gpu_seconds / 3600:,.0f} GPU-hours; slowest GetJob meanwhile {slowest[0] * 1000:.0f} ms; "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
