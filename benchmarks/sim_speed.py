"""Speed and memory of the simulator: a 10,000-job synthetic trace on 1,000 GPUs.

Goal (issue 5): at most 60 s and under 1 GB on this machine; the same seed gives
the same output. Prints wall time, peak RSS and a digest of the metrics; run twice
with the same seed to compare digests. The machine is shared: figures are noisy.

    .venv/bin/python benchmarks/sim_speed.py [--jobs 10000] [--cluster 250x4] [--policy gandiva]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time

from scheduler.policy import get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--cluster", default="250x4")
    ap.add_argument("--policy", default="gandiva")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-load", type=float, default=0.9)
    args = ap.parse_args()
    servers = make_cluster(args.cluster)
    model = MechanismModel.default()
    jobs = generate(args.jobs, seed=args.seed)
    jobs, factor = scale_to_load(jobs, servers, model, args.target_load)
    start = time.perf_counter()
    result = Simulator(jobs, servers, get_policy(args.policy), model).run()
    wall = time.perf_counter() - start
    metrics = summarize(result)
    digest = hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest()[:16]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.jobs} jobs, {args.cluster} ({sum(s.num_gpus for s in servers)} GPUs), "
          f"policy {args.policy}, load {args.target_load} (arrivals x{factor:.3f})")
    print(f"wall {wall:.1f} s (goal <= 60 s), peak RSS {rss_mb:.0f} MB (goal < 1024 MB), "
          f"decide calls {result.decide_calls}")
    print(f"metrics digest {digest} (same seed -> same digest)")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in metrics.items()}))


if __name__ == "__main__":
    main()
