"""Live decision latency: placing one arriving job in a 1,000-server cluster.

Goal (issue 5): at most 5 ms. The cluster has 1,000 servers of 4 GPUs, mostly busy
with a mix of 1-, 2- and 4-GPU jobs; one job arrives. "cold" is a fresh policy (it
builds its ledger from the snapshot, as after a scheduler restart); "warm" is the
policy the live scheduler keeps between calls (its ledger is synced to the snapshot),
given the same JobView objects for unchanged jobs or ("rebuilt views") new ones.
Each figure is the median of --repeat runs. The machine is shared: figures are noisy.

    .venv/bin/python benchmarks/policy_latency.py [--servers 1000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

from scheduler.policy import ClusterSnapshot, GpuRef, JobView, Place, ServerView, get_policy


def busy_cluster(servers: int, seed: int, full: bool) -> tuple[tuple[ServerView, ...], list[JobView]]:
    rng = random.Random(seed)
    srv = tuple(ServerView(f"server-{i:04d}", 4) for i in range(servers))
    jobs: list[JobView] = []
    for s in srv:
        # 90% of servers busy (all of them when full), each with one job size (affinity).
        if not full and rng.random() < 0.1:
            continue
        size = rng.choice((1, 1, 2, 4))
        for start in range(0, 4, size):
            jobs.append(JobView(f"j{len(jobs)}", size, state="RUNNING",
                                placement=tuple(GpuRef(s.name, i) for i in range(start, start + size)),
                                submitted_at=0.0))
    return srv, jobs


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    for full in (False, True):
        srv, jobs = busy_cluster(args.servers, 0, full)
        new = JobView("arriving", 2, submitted_at=1.0)
        before = ClusterSnapshot(1.0, srv, tuple(jobs))
        after = ClusterSnapshot(2.0, srv, (*jobs, new))
        for name in ("gandiva", "yarn-cs", "tiresias"):
            decisions = get_policy(name).decide(after)
            placed = any(isinstance(d, Place) and d.job_id == "arriving" for d in decisions)
            cold = median_ms(lambda n=name, a=after: get_policy(n).decide(a), args.repeat)
            warm_policy = get_policy(name)
            warm_policy.decide(before)

            def warm(p=warm_policy, a=after, b=before) -> None:
                p.decide(a)
                p.decide(b)  # back to the state before the arrival

            warm_ms = median_ms(warm, args.repeat) / 2
            # The live scheduler may build new JobView objects from its database each call.
            rebuilt = ClusterSnapshot(2.0, srv, tuple(copy.copy(j) for j in after.jobs))
            fresh_ms = median_ms(lambda p=warm_policy, r=rebuilt, b=before: (p.decide(r), p.decide(b)),
                                 args.repeat) / 2
            print(f"{'full' if full else '90% busy':>8} {name:>8}: {len(jobs)} jobs on "
                  f"{args.servers * 4} GPUs, placed={placed}: warm {warm_ms:.2f} ms, warm with "
                  f"rebuilt views {fresh_ms:.2f} ms, cold {cold:.2f} ms (goal <= 5 ms)")


if __name__ == "__main__":
    main()
