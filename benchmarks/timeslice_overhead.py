"""Time-slicing overhead, live: 4 real jobs time-sliced on 2 virtual GPUs vs back to back.

One helper with 2 virtual GPUs, 4 real TensorFlow MLPs of --steps mini-batches each:

* time-sliced: the gandiva policy with a --quantum (default 10 s) time slice; packing,
  migration and grow-shrink off, so that only suspend/resume at mini-batch boundaries
  differs;
* back to back: the fifo policy runs two at a time, each to completion.

Aggregate throughput = all mini-batches / (last job's end - first submission). Prints both,
the overhead (goal: at most 5% lower), and the suspend/resume latencies the scheduler
measured (its /metrics). Run under `nice -n 15`; a few minutes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.cli.client import TERMINAL_STATES, Client
from scheduler.cli.demo_run import _example
from scheduler.cli.local_cluster import LocalCluster

ONLY_TIME_SLICING = ("enable_packing=false", "enable_migration=false", "enable_grow_shrink=false", "slice_slack_s=0.5")


def run(tmp: Path, policy: str, quantum: float, steps: int, sleep: float) -> tuple[float, int, dict[str, tuple[int, float]]]:
    run_dir = tmp / policy
    run_dir.mkdir()
    c = LocalCluster(run_dir, f"sqlite+aiosqlite:///{run_dir}/g.db", ["node-1"], 2, scheduler_args=[
        "--policy", policy, "--quantum", str(quantum), "--tick", "0.5",
        *(x for o in ONLY_TIME_SLICING for x in ("--policy-option", o))])
    try:
        c.start_scheduler()
        c.start_helpers()
        c.wait_for_helpers()
        client = Client(c.address)
        t0 = time.time()
        ids = []
        for i in range(4):
            spec = common_pb2.JobSpec(name=f"job-{i}", gpus=1, priority=1, workdir=str(run_dir), command=[
                "python", _example("mlp"), "--steps", str(steps), "--step-sleep", str(sleep), "--seed", str(i)])
            ids.append(client.call("SubmitJob", scheduler_pb2.SubmitJobRequest(spec=spec)).job.id)
        while True:
            jobs = [client.call("GetJob", scheduler_pb2.GetJobRequest(id=j)) for j in ids]
            if all(j.state in TERMINAL_STATES for j in jobs):
                break
            time.sleep(0.5)
        if any(j.state != common_pb2.JOB_STATE_SUCCEEDED for j in jobs):
            raise RuntimeError(f"{policy}: a job did not succeed; see {run_dir}")
        makespan = max(j.finished_at for j in jobs) - t0
        slices = sum(t.to_state == common_pb2.JOB_STATE_SUSPENDED for j in jobs for t in j.history)
        switches = {}
        with urllib.request.urlopen(f"http://{c.http}/metrics", timeout=10) as r:
            for fam in text_string_to_metric_families(r.read().decode()):
                if fam.name == "gandiva_switch_seconds":
                    for s in fam.samples:
                        cmd = s.labels.get("command", "")
                        n, total = switches.get(cmd, (0, 0.0))
                        if s.name.endswith("_count"):
                            switches[cmd] = (int(s.value), total)
                        elif s.name.endswith("_sum"):
                            switches[cmd] = (n, s.value)
        print(f"  {policy}: makespan {makespan:.1f}s, {slices} suspensions", flush=True)
        return makespan, slices, switches
    finally:
        c.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000, help="mini-batches per job (default 2000)")
    p.add_argument("--quantum", type=float, default=10.0, help="time slice in seconds (default 10)")
    p.add_argument("--step-sleep", type=float, default=0.01, help="sleep after each step (default 0.01)")
    args = p.parse_args()
    total = 4 * args.steps
    with tempfile.TemporaryDirectory(prefix="gandiva-ts-bench-") as d:
        tmp = Path(d)
        sliced, slices, switches = run(tmp, "gandiva", args.quantum, args.steps, args.step_sleep)
        serial, _, _ = run(tmp, "fifo", args.quantum, args.steps, args.step_sleep)
    tp_sliced, tp_serial = total / sliced, total / serial
    print(f"4 jobs x {args.steps} mini-batches on 2 virtual GPUs, {args.quantum:.0f} s quantum")
    print(f"aggregate throughput: time-sliced {tp_sliced:.1f}/s ({slices} suspensions), back to back "
          f"{tp_serial:.1f}/s: {100 * (1 - tp_sliced / tp_serial):+.1f}% lower (goal: at most 5%)")
    for cmd, (n, s) in sorted(switches.items()):
        if n:
            print(f"  {cmd}: {n} commands, mean {1000 * s / n:.0f} ms from command to acknowledgement at a boundary")


if __name__ == "__main__":
    main()
