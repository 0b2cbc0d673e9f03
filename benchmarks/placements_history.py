"""What the GPUs' history (gpu_holds) costs a real `gandiva scheduler` on a long SQLite history.

Fills a fresh SQLite database (the schema of `gandiva db upgrade`) with DAYS days of finished
jobs, JOBS_PER_DAY a day, each placed on 1-4 GPUs of one of SERVERS servers of 8 GPUs,
time-sliced (SLICES suspend/resume pairs) and, one in ten, moved once to another server (two
holds), then starts a real scheduler on it and times:

- its start (the decision log and the per-GPU timeline of the last hour drawn from the
  database: "GPU timeline: N GPUs" in its log);
- `ListPlacements` at an instant an hour ago and 25 days ago (every GPU, then one GPU of one
  server), and over the last hour;
- `GetUsage --since 7d` (which reads the period's holds too).

    PYTHONPATH=. python benchmarks/placements_history.py [--days 30] [--jobs-per-day 2000] [--reuse DIR]
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import grpc
from sqlalchemy import create_engine, func, select

from benchmarks.usage_history import (
    add_job,
    history_home,
    history_parser,
    insert_all,
    start_scheduler,
    upgrade,
)
from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.state.models import GpuHold, Job, Transition

DAY = 86400.0


def fill(path: Path, days: int, per_day: int, slices: int, servers: int, now: float) -> None:
    rng = random.Random(0)
    engine = create_engine(f"sqlite:///{path}")
    jobs: list[dict] = []
    changes: list[dict] = []
    held: list[dict] = []
    with engine.begin() as conn:
        for k in range(days * per_day):
            submitted = now - days * DAY + k * DAY / per_day
            at, gpus = submitted + rng.uniform(0, 600), rng.choice((1, 1, 2, 4))
            started = at
            job_id = f"j-{k:010x}"
            seq = [("QUEUED", "RUNNING", at)]
            server, first = rng.randrange(servers), rng.randrange(0, 8, gpus)
            hold_start = at
            for i in range(slices):
                at += rng.uniform(60, 600)
                seq.append(("RUNNING", "SUSPENDED", at))
                at += rng.uniform(60, 600)
                seq.append(("SUSPENDED", "RUNNING", at))
                if i == 0 and k % 10 == 0:  # moved once: its first GPUs left, others held
                    at += rng.uniform(60, 600)
                    seq.append(("RUNNING", "MIGRATING", at))
                    at += rng.uniform(1, 5)
                    seq.append(("MIGRATING", "RUNNING", at))
                    held += [{"job_id": job_id, "server_name": f"node-{server}", "gpu_index": first + g,
                              "start_at": hold_start, "end_at": at} for g in range(gpus)]
                    server, first, hold_start = rng.randrange(servers), rng.randrange(0, 8, gpus), at
            at += rng.uniform(60, 600)
            seq.append(("RUNNING", "SUCCEEDED", at))
            held += [{"job_id": job_id, "server_name": f"node-{server}", "gpu_index": first + g,
                      "start_at": hold_start, "end_at": at} for g in range(gpus)]
            add_job(jobs, changes, k, gpus, submitted, started, seq)
            if len(changes) > 50000:
                insert_all(conn, {Job: jobs, Transition: changes, GpuHold: held})
        insert_all(conn, {Job: jobs, Transition: changes, GpuHold: held})


def main() -> int:
    parser = history_parser(__doc__)
    parser.add_argument("--servers", type=int, default=64)
    args = parser.parse_args()
    home, db, url, env = history_home(args.reuse, "gandiva-holds-")
    if args.reuse is None:
        upgrade(url, env)
        t0 = time.monotonic()
        # The history ends an hour from now, so that the last hour has jobs on the GPUs.
        fill(db, args.days, args.jobs_per_day, args.slices, args.servers, time.time())
        print(f"written in {time.monotonic() - t0:.0f}s into {home}", flush=True)
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        counts = [conn.execute(select(func.count()).select_from(t)).scalar_one() for t in (Job, Transition, GpuHold)]
    print(f"history: {counts[0]:,} jobs, {counts[1]:,} state changes, {counts[2]:,} GPU holds, "
          f"{db.stat().st_size / 2**20:.0f} MiB", flush=True)
    t0 = time.monotonic()
    proc, address = start_scheduler(home, url, env, "--http-listen", "127.0.0.1:0")
    try:
        drawn = re.findall(r"decision log: .*", (home / "log").read_text())
        print(f"scheduler started in {time.monotonic() - t0:.1f}s ({', '.join(drawn) or 'no read-back line'}); "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        now = time.time()
        for label, req in (
                ("--at 1h (every GPU)", scheduler_pb2.ListPlacementsRequest(since=now - 3600, until=now - 3600)),
                ("--at 25d (every GPU)", scheduler_pb2.ListPlacementsRequest(since=now - 25 * DAY,
                                                                             until=now - 25 * DAY)),
                ("--at 25d --server node-3 --gpu 0", scheduler_pb2.ListPlacementsRequest(
                    since=now - 25 * DAY, until=now - 25 * DAY, server="node-3", gpu=0)),
                ("--since 1h (every GPU)", scheduler_pb2.ListPlacementsRequest(since=now - 3600))):
            took = []
            for _ in range(3):
                t = time.monotonic()
                got = stub.ListPlacements(req, timeout=600)
                took.append(time.monotonic() - t)
            print(f"ListPlacements {label}: {min(took) * 1000:.0f}-{max(took) * 1000:.0f} ms (3 asks), "
                  f"{len(got.placements)} placements; load average {os.getloadavg()[0]:.1f}", flush=True)
        # `gandiva get usage --since 7d`: since session 49 it also reads the period's GPU holds
        # (HELD-H, the cluster's busy GPU-hours) and the servers' spans (none here).
        for _ in range(2):
            t = time.monotonic()
            used = stub.GetUsage(scheduler_pb2.GetUsageRequest(since=time.time() - 7 * DAY), timeout=600)
            print(f"GetUsage --since 7d: {time.monotonic() - t:.2f}s, {used.total.jobs:,} jobs, "
                  f"{used.busy_gpu_seconds / 3600:,.0f} busy GPU-hours; load average {os.getloadavg()[0]:.1f}",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
