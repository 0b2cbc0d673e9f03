"""Time until each job's first 100 mini-batches: a 1,000-job burst on 180 GPUs.

The paper (brief section 4): 1,000 jobs arriving over 2 hours on 180 GPUs, Gandiva
with time-slicing and packing only, against the YARN capacity scheduler: 498 s vs
2,203 s until a job has done 100 mini-batches. Here the workload comes from our own
Philly-like generator (GPU counts up to 8), the cluster is 45 servers of 4 GPUs, and
gandiva runs with migration and grow-shrink switched off to match the paper's setup.

    .venv/bin/python benchmarks/sim_burst.py [--seed 0] [--jobs 1000] [--hours 2]
"""

from __future__ import annotations

import argparse

from scheduler.policy import PolicyConfig, get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--cluster", default="45x4")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    jobs = generate(args.jobs, seed=args.seed, mean_interarrival_s=args.hours * 3600 / args.jobs,
                    max_gpus=8)
    servers = make_cluster(args.cluster)
    model = MechanismModel.default()
    paper_setup = PolicyConfig(enable_migration=False, enable_grow_shrink=False)
    rows = {
        "gandiva": summarize(Simulator(jobs, servers, get_policy("gandiva", paper_setup), model).run()),
        "yarn-cs": summarize(Simulator(jobs, servers, get_policy("yarn-cs"), model).run()),
    }
    print(f"{args.jobs} jobs over {args.hours} h on {args.cluster} "
          f"({sum(s.num_gpus for s in servers)} GPUs), seed {args.seed}")
    print(f"{'policy':>8} {'avg to 100 mb':>14} {'median':>8} {'avg JCT':>9} {'util':>6} {'packs':>6} {'unpacks':>7}")
    for name, m in rows.items():
        print(f"{name:>8} {m['avg_time_to_first_n_s']:>12.0f} s {m['median_time_to_first_n_s']:>6.0f} s "
              f"{m['avg_jct_s'] / 3600:>7.2f} h {m['utilization']:>6.3f} {m['packs']:>6} {m['unpacks']:>7}")
    print("paper: 498 s (gandiva) vs 2,203 s (yarn-cs)")


if __name__ == "__main__":
    main()
