"""How the simulator's cost grows with the trace: generated workloads of 10k-80k jobs on 1,000 GPUs.

For each job count and policy, replays the project's generated workload (seed 0) on 250x4
at target load 0.9 and prints CPU seconds, peak RSS (of this process so far), decide calls,
decisions applied (switches, placements, moves) and microseconds per decide call. Cost
should grow with the decisions, not with the queue: the us/call column stays flat as the
trace grows. Goals (issue 11): 80,000 jobs within 180 s and 2 GB per policy; 10,000 within
60 s and 1 GB. The digest column is a hash of every metric: the same seed gives the same
digest in any process (tests/scheduler/sim/test_sim_scaling.py checks that).

    .venv/bin/python benchmarks/sim_scaling.py [--jobs 10000,20000,40000,80000]
        [--policies gandiva,yarn-cs,tiresias] [--cluster 250x4] [--seed 0]

Run it under `nice`: the machine is shared, and figures are CPU time of this process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time

from scheduler.policy import get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel


def digest(metrics: dict) -> str:
    """A short hash of every metric (the decide-call count included)."""
    return hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="10000,20000,40000,80000", help="comma-separated job counts")
    ap.add_argument("--policies", default="gandiva,yarn-cs,tiresias")
    ap.add_argument("--cluster", default="250x4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-load", type=float, default=0.9)
    args = ap.parse_args()
    servers = make_cluster(args.cluster)
    model = MechanismModel.default()
    print(f"cluster {args.cluster} ({sum(s.num_gpus for s in servers)} GPUs), load {args.target_load}, "
          f"seed {args.seed}")
    print(f"{'jobs':>6} {'policy':>9} | {'cpu s':>7} {'peak MB':>7} | {'calls':>7} {'decisions':>9} "
          f"{'us/call':>7} | {'suspends':>8} {'avg JCT h':>9} | digest")
    for n in (int(x) for x in args.jobs.split(",")):
        jobs, _ = scale_to_load(generate(n, seed=args.seed), servers, model, args.target_load)
        for name in args.policies.split(","):
            start = time.process_time()
            result = Simulator(jobs, servers, get_policy(name), model).run()
            cpu = time.process_time() - start
            m = summarize(result)
            applied = sum(result.counts.values()) + len(result.jobs)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{n:>6} {name:>9} | {cpu:>7.1f} {rss:>7.0f} | {result.decide_calls:>7} {applied:>9} "
                  f"{1e6 * cpu / max(1, result.decide_calls):>7.0f} | {m['suspends']:>8} "
                  f"{m['avg_jct_s'] / 3600:>9.2f} | {digest(m)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
