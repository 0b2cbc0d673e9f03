"""Check the helper's NVML sampling on a real GPU (for a lent GPU machine).

Run from the repository root, on a machine with an NVIDIA driver, PyTorch and
nvidia-ml-py (TensorFlow is not needed):

    python -m benchmarks.gpu_checks [--seconds 6] [--period 0.25]

It starts a PyTorch process that holds a base allocation and, every mini-batch,
allocates "activations", computes on them and frees them (emptying PyTorch's cache
so the driver sees the memory go, as TensorFlow's allocator does between steps).
Meanwhile it samples that process through migration_helper.gpus.NvmlBackend and
checks: the per-process memory, the GPU utilization, the memory cycle's min and
max, and the mini-batch time from the cycle's minima against the child's own.
Prints the figures; exits 0 when every check passes, 1 when one fails, 2 when there
is no GPU to check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from migration_helper.cycle import MemoryCycle
from migration_helper.gpus import JobProcesses, NvmlBackend, NvmlUnavailable

MiB = 1 << 20

# The child: BASE MiB of "weights", then ACT MiB of "activations" per mini-batch.
CHILD = r"""
import json, sys, time, torch
base_mb, act_mb, period, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
dev = torch.device("cuda:0")
weights = torch.empty(base_mb * 2**20 // 4, dtype=torch.float32, device=dev).normal_()
m = torch.randn(4096, 4096, device=dev)
torch.cuda.synchronize()
print(json.dumps({"ready": True}), flush=True)
starts, end = [], time.time() + seconds
while time.time() < end:
    t0 = time.time()
    starts.append(t0)
    act = torch.empty(act_mb * 2**20 // 4, dtype=torch.float32, device=dev).fill_(1.0)
    x = m
    while time.time() - t0 < period * 0.7:   # compute: keeps utilization up
        x = torch.tanh(x @ m)
        torch.cuda.synchronize()
    del act, x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()                  # give the memory back, as at a TF step boundary
    time.sleep(max(0.0, period - (time.time() - t0)))
gaps = [b - a for a, b in zip(starts, starts[1:])]
print(json.dumps({"steps": len(starts), "period_s": sorted(gaps)[len(gaps) // 2] if gaps else 0}), flush=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--period", type=float, default=0.25, help="mini-batch time of the child (s)")
    p.add_argument("--base-mb", type=int, default=1024)
    p.add_argument("--act-mb", type=int, default=2048)
    p.add_argument("--interval", type=float, default=0.01, help="sampling interval (s)")
    args = p.parse_args()
    try:
        backend = NvmlBackend()
    except NvmlUnavailable as exc:
        print(f"no GPU to check: {exc}")
        return 2
    gpus = backend.gpus()
    for g in gpus:
        print(f"GPU {g.index}: {g.model} {g.uuid} {g.memory_total_bytes / 2**30:.1f} GiB")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(args.base_mb), str(args.act_mb), str(args.period), str(args.seconds)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    assert child.stdout is not None
    ready = child.stdout.readline()
    if not ready:
        print("the PyTorch child failed to start (see its stderr above)")
        return 1
    jobs = {"check": JobProcesses(frozenset([child.pid]), (0,))}
    cycle = MemoryCycle(window_s=args.seconds + 5)
    utils: list[float] = []
    per_process: list[int] = []
    t_sample: list[float] = []
    while child.poll() is None:
        t0 = time.perf_counter()
        samples = backend.sample(jobs)
        t_sample.append(time.perf_counter() - t0)
        mine = [s for s in samples if s.job_id == "check" and s.gpu_index == 0]
        if mine:
            cycle.add(mine[0].at, mine[0].job_memory_bytes)
            per_process.append(mine[0].job_memory_bytes)
            utils.append(mine[0].utilization)
        time.sleep(args.interval)
    report = json.loads(child.stdout.readline() or "{}")
    backend.close()
    summary = cycle.summary()
    figures = {
        "samples": len(per_process),
        "sample_call_ms_median": round(statistics.median(t_sample) * 1000, 3) if t_sample else None,
        "job_memory_min_mib": round(summary.min_bytes / MiB),
        "job_memory_max_mib": round(summary.max_bytes / MiB),
        "utilization_max": max(utils, default=0.0),
        "utilization_median": statistics.median(utils) if utils else 0.0,
        "minibatch_s_from_memory_cycle": round(summary.minibatch_s, 4),
        "minima": summary.minima,
        "minibatch_s_child_measured": round(report.get("period_s", 0.0), 4),
        "child_steps": report.get("steps"),
    }
    print(json.dumps(figures, indent=2))
    checks = {
        "per-process memory seen (>= base)": summary.max_bytes >= args.base_mb * MiB,
        "cycle min near the base (within base + 600 MiB context)":
            args.base_mb * MiB <= summary.min_bytes <= (args.base_mb + 600) * MiB,
        "cycle max holds the activations": summary.max_bytes >= (args.base_mb + args.act_mb) * MiB,
        "utilization seen (> 20%)": figures["utilization_max"] > 0.2,
        "mini-batch time from minima within 20% of the child's":
            report.get("period_s", 0) > 0 and abs(summary.minibatch_s - report["period_s"]) <= 0.2 * report["period_s"],
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
