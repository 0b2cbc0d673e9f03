"""How low can the average JCT go? Orders of service on an ideal pooled cluster.

Replays a trace (scaled to ``--target-load`` exactly as ``gandiva sim`` does) on an ideal
cluster: one pool of GPUs (the cluster's total), where any job runs on any free GPUs at
its fastest (alone on as few servers as it needs, so a job larger than a server still
pays the spread slowdown it cannot avoid), and where suspending, resuming and moving a
job are free and instant. No locality, no time-slice groups, no mechanism cost. On that
cluster it serves the jobs in one of these orders, filling the pool greedily (the first
jobs of the order that fit run; a job that does not fit is skipped, as yarn-cs skips it):

- ``fifo``: first come first served, never preempting a started job (yarn-cs without
  its locality; on a trace of 1-GPU jobs it is yarn-cs);
- ``gittins``: preemptive, by the Gittins index of each job's attained service, computed
  from the distribution of **all** the trace's job lengths (an oracle for the distribution,
  not for any one job), divided by the job's GPUs (the chance to finish per GPU-second):
  the best known order for a scheduler that knows attained service and the length
  distribution but not the jobs' own lengths, which is what Gandiva knows. Gittins is
  optimal on one server (M/G/1) and near optimal on k servers for jobs of one GPU
  (Scully, Grosof and Harchol-Balter, 2021); for jobs of several GPUs it is a heuristic.
  Ties (equal index) go to the earlier arrival;
- ``srpt``: preemptive, the least remaining GPU-time first. It knows every job's length,
  which no scheduler here does: a reference for comparison, not a goal.

The point is the JCT goal of issue 11. Where every job needs one GPU, a goal that neither
order reaches on this ideal cluster is out of reach for any scheduler: every real mechanism
only adds cost, and even the order that knows each job's length falls short. Where jobs
need several GPUs, the ideal orders are references, not bounds: a greedy order by index
is not optimal there (a real policy can beat it), but the ideal cluster also ignores
locality, which favours it. The table prints each order's average JCT and its ratio to the
simulator's yarn-cs, the issue's JCT goal for the trace, and with ``--results FILE`` (repeatable; what
``sim_table.py --json`` wrote, same cluster and load) gandiva's and tiresias' own ratios
from that file, whose yarn-cs is then used instead of replaying it.

    .venv/bin/python benchmarks/sim_ideal.py --traces ../shared/traces [--only cluster09,cluster03]
    .venv/bin/python benchmarks/sim_ideal.py --trace ../shared/traces/itp/cluster09.csv

Cost: event-driven (arrivals, departures, and for ``gittins`` the points where a running
job's index can change); a few seconds to a few minutes a trace here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sim_traces import (
    TRACES,
    gavel_table_for,
    jct_goal,
    load_trace_as,
    trace_files,
    trace_name,
)
from scheduler.policy import get_policy
from scheduler.policy.gittins import GittinsTable
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.load import fastest_run_s, scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

ORDERS = ("fifo", "gittins", "srpt")
# A job is done when less than this much of its run time is left (float sums of slices).
EPS_S = 1e-6


@dataclass
class _Job:
    n: int  # arrival order (the tie-break)
    arrive: float
    gpus: int
    work: float  # seconds it runs at its fastest
    served: float = 0.0
    started: float | None = None
    done: float | None = None
    key: tuple[float, int] = (0.0, 0)  # its place in the order (changes only while it runs)
    mark: float = float("inf")  # gittins: the service at which its index can next change


def ideal_jct(specs: list[JobSpec], servers: tuple, model: MechanismModel, order: str) -> dict[str, float]:
    """Replay ``specs`` (arrivals already scaled) on the ideal pool in ``order``; the
    average JCT and queueing delay (s) and the makespan (s)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}: choose from {', '.join(ORDERS)}")
    pool = sum(s.num_gpus for s in servers)
    jobs = sorted((_Job(0, j.submit_time, j.num_gpus, fastest_run_s(j, servers, model)) for j in specs),
                  key=lambda j: j.arrive)
    for n, j in enumerate(jobs):
        j.n = n
    too_big = [j for j in jobs if j.gpus > pool]
    if too_big:
        raise ValueError(f"{len(too_big)} jobs need more GPUs than the cluster's {pool}")
    table = GittinsTable.of([j.work for j in jobs], least=1) if order == "gittins" else None

    def key(j: _Job) -> tuple[float, int]:
        """The job's place in the order; for gittins also sets the service at which it
        next needs looking at (``mark``)."""
        if order == "srpt":
            return ((j.work - j.served) * j.gpus, j.n)
        if order == "gittins":
            assert table is not None
            g = table.at(j.served)
            j.mark = table.next_change(j.served) if g is not None else float("inf")
            return (-(g if g is not None else 0.0) / j.gpus, j.n)
        return (0.0, j.n)  # fifo: arrival order (started jobs are kept first, below)

    now = 0.0
    nxt = 0  # the next arrival
    present: list[_Job] = []
    running: list[_Job] = []
    while nxt < len(jobs) or present:
        # Who runs from now on.
        if order == "fifo":
            run = [j for j in present if j.started is not None]  # never preempted
            free = pool - sum(j.gpus for j in run)
            for j in present:  # arrival order
                if j.started is None and j.gpus <= free:
                    run.append(j)
                    free -= j.gpus
        else:
            free = pool
            run = []
            for j in sorted(present, key=lambda j: j.key):
                if j.gpus <= free:
                    run.append(j)
                    free -= j.gpus
                    if free == 0:
                        break
        running = run
        for j in running:
            if j.started is None:
                j.started = now
        # The next event: an arrival, a departure, or (gittins) an index that may change.
        t = jobs[nxt].arrive if nxt < len(jobs) else float("inf")
        for j in running:
            t = min(t, now + min(j.work, j.mark) - j.served)
        if running:
            t = max(t, now)  # never backwards (float rounding)
        dt = t - now
        for j in running:
            served = j.served + dt
            if served >= j.mark - EPS_S:
                # Land on the grid point exactly (a hair below it would keep the old index
                # and make the next event a hair away), and take the new index.
                j.served = min(j.work, max(served, j.mark))
                j.key = key(j)
            else:
                j.served = min(j.work, served)
                if order == "srpt":
                    j.key = key(j)
        now = t
        if running:
            left = []
            for j in present:
                if j.work - j.served <= EPS_S:
                    j.done = now
                else:
                    left.append(j)
            present = left
        while nxt < len(jobs) and jobs[nxt].arrive <= now:  # in arrival order, as is ``present``
            jobs[nxt].key = key(jobs[nxt])
            present.append(jobs[nxt])
            nxt += 1
    jct = [j.done - j.arrive for j in jobs if j.done is not None]
    queued = [j.started - j.arrive for j in jobs if j.started is not None]
    start = min(j.arrive for j in jobs)
    return {"avg_jct_s": statistics.fmean(jct), "avg_queueing_s": statistics.fmean(queued),
            "makespan_s": max(j.done or 0.0 for j in jobs) - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, action="append", help="one trace (repeatable); default: the evaluation set")
    ap.add_argument("--traces", type=Path, default=TRACES, help="the shared traces folder (default: ../shared/traces)")
    ap.add_argument("--only", default="", help="comma-separated trace names (file stems) of the evaluation set")
    ap.add_argument("--min-jobs", type=int, default=500, help="Gavel traces with at least this many jobs")
    ap.add_argument("--cluster", default="25x4")
    ap.add_argument("--target-load", type=float, default=0.9)
    ap.add_argument("--orders", default=",".join(ORDERS), help=f"comma-separated, from {', '.join(ORDERS)}")
    ap.add_argument("--results", type=Path, action="append", default=[],
                    help="a sim_table.py --json file (same --cluster and --target-load; repeatable): its yarn-cs "
                    "instead of a replay, and gandiva's and tiresias' ratios beside the ideal orders")
    args = ap.parse_args(argv)
    results: dict = {}
    for file in args.results:
        try:
            results.update(json.loads(file.read_text()))
        except (OSError, ValueError) as exc:
            ap.error(f"--results {file}: {exc}")
    orders = [o for o in args.orders.split(",") if o]
    bad = [o for o in orders if o not in ORDERS]
    if bad:
        ap.error(f"unknown order(s) {', '.join(bad)}: choose from {', '.join(ORDERS)}")
    paths = args.trace or trace_files(args.traces, args.min_jobs)
    if args.only:
        wanted = set(args.only.split(","))
        paths = [p for p in paths if trace_name(p) in wanted]
    if not paths:
        print(f"no traces found (looked in {args.traces}); pass --trace FILE or --traces DIR", file=sys.stderr)
        return 2
    try:
        servers = make_cluster(args.cluster)
    except ValueError as exc:
        ap.error(f"--cluster: {exc}")
    settings = {"cluster": args.cluster, "target_load": args.target_load}
    head = ["trace", "jobs", "yarn-cs JCT h (queueing)", "goal"] + [f"ideal {o} h (x yarn-cs)" for o in orders]
    if results:
        head += ["gandiva (x yarn-cs)", "tiresias (x yarn-cs)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in paths:
        clock = time.perf_counter()
        workload, fmt = load_trace_as(path)
        table = gavel_table_for(path, fmt, args.traces / "gavel" / "simulation_throughputs.json")
        model = MechanismModel.from_gavel(table) if table else MechanismModel.default()
        try:
            jobs, _ = scale_to_load(workload, servers, model, args.target_load)
        except ValueError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        known = results.get(trace_name(path), {})
        if known and (known.get("settings") != settings or known.get("jobs") != len(jobs)):
            print(f"--results: {trace_name(path)} there was replayed at {known.get('settings')} with {known.get('jobs')} "
                  f"jobs, not at {settings} with {len(jobs)}: pass a file written with the same --cluster and "
                  "--target-load", file=sys.stderr)
            return 2
        yarn = known.get("yarn-cs") or summarize(Simulator(jobs, servers, get_policy("yarn-cs"), model).run())
        goal, share = jct_goal(yarn)
        y = yarn["avg_jct_s"]
        cells = [trace_name(path), f"{len(jobs):,}", f"{y / 3600:.1f} ({share:.0%})", f"<= {goal:.1f}x"]
        for o in orders:
            r = ideal_jct(jobs, servers, model, o)
            cells.append(f"{r['avg_jct_s'] / 3600:.1f} ({r['avg_jct_s'] / y:.2f})")
        if results:
            for name in ("gandiva", "tiresias"):
                got = known.get(name)
                cells.append(f"{got['avg_jct_s'] / 3600:.1f} ({got['avg_jct_s'] / y:.2f})" if got else "-")
        print("| " + " | ".join(cells) + f" |   ({time.perf_counter() - clock:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
