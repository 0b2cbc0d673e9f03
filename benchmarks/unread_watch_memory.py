"""How much memory event watches that read nothing cost a real `gandiva scheduler`.

Starts a scheduler (SQLite, no auth, in a temporary GANDIVA_HOME), opens WATCHES
`WatchEvents` from event 0 on one connection and never reads them, submits three
multi-jobs of 500 (1,500 jobs, their events), waits 8 s, and prints the scheduler's
resident and peak memory (VmRSS, VmHWM) before and after, a GetJob's time, and how many
events one watch that does read then gets within 20 s (all 1,501 when nothing is lost).

    PYTHONPATH=. python benchmarks/unread_watch_memory.py [--watches 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def _memory(pid: int) -> str:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return ", ".join(line.split(":")[0] + " " + line.split()[1] + " kB" for line in lines
                     if line.startswith(("VmRSS", "VmHWM")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watches", type=int, default=200)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gandiva-watch-"))
    port_file = home / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--db", f"sqlite+aiosqlite:///{home}/s.db",
         "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
        stdout=(home / "log").open("w"), stderr=subprocess.STDOUT, env={**os.environ, "GANDIVA_HOME": str(home)})
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the scheduler did not start; see {home}/log")
            time.sleep(0.1)
        address = port_file.read_text().strip()
        stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        one = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["x"], gpus=1))).job.id
        print("idle:", _memory(proc.pid), flush=True)
        raw = grpc.insecure_channel(address)
        watches = [scheduler_pb2_grpc.SchedulerStub(raw).WatchEvents(scheduler_pb2.WatchEventsRequest(after_id=0))
                   for _ in range(args.watches)]
        time.sleep(2)
        for k in range(3):
            stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name=f"m{k}", jobs=[
                common_pb2.JobSpec(command=["python", "y" * 2000], gpus=1, user=f"u{k}") for _ in range(500)]),
                timeout=300)
        time.sleep(8)
        start = time.perf_counter()
        stub.GetJob(scheduler_pb2.GetJobRequest(id=one), timeout=60)
        print(f"{args.watches} unread watches, 1,500 jobs: {_memory(proc.pid)}; "
              f"GetJob {(time.perf_counter() - start) * 1000:.1f} ms", flush=True)
        got = 0
        try:
            for _ in scheduler_pb2_grpc.SchedulerStub(raw).WatchEvents(
                    scheduler_pb2.WatchEventsRequest(after_id=0), timeout=20):
                got += 1
        except grpc.RpcError:
            pass  # its 20 s are over
        print(f"a watch that reads got {got} events in 20 s", flush=True)
        for watch in watches:
            watch.cancel()
        raw.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
