"""How much memory a flood of large requests costs `gandiva scheduler --auth token`.

Starts a real scheduler (SQLite, --auth token), sends N concurrent SubmitJob calls of
about SIZE MiB each (a spec of many 100-byte arguments, refused for its size anyway:
what is measured is the receiving), once without a token and once with a user's token,
and prints the scheduler's peak resident memory (VmHWM, read again before each round
after resetting it through /proc/PID/clear_refs) and its memory after each round.

    PYTHONPATH=. python benchmarks/big_request_memory.py [--calls 64] [--mib 14] [--rounds 3]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _flood(address: str, calls: int, mib: float, token: str) -> dict[str, int]:
    spec = common_pb2.JobSpec(name="big", gpus=1, command=["python", *["x" * 100] * int(mib * 1024 * 1024 / 102)])
    request = scheduler_pb2.SubmitJobRequest(spec=spec)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    codes: dict[str, int] = {}

    def one(_: int) -> str:
        with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            try:
                scheduler_pb2_grpc.SchedulerStub(ch).SubmitJob(request, metadata=metadata, timeout=120)
                return "OK"
            except grpc.RpcError as err:
                return err.code().name

    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        for code in pool.map(one, range(calls)):
            codes[code] = codes.get(code, 0) + 1
    return codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--mib", type=float, default=14.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite+aiosqlite:///{tmp}/g.db"
        env = {**os.environ, "GANDIVA_HOME": tmp}
        gandiva = [sys.executable, "-m", "gandiva_cli.main"]
        token = subprocess.run([*gandiva, "token", "create", "alice", "--db", db], env=env, check=True,
                               capture_output=True, text=True).stdout.split()[-1]
        port_file = Path(tmp) / "port"
        sched = subprocess.Popen([*gandiva, "scheduler", "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                                  "--db", db, "--auth", "token", "--log-level", "WARNING"], env=env)
        try:
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.1)
            address = port_file.read_text().strip()
            print(f"scheduler pid {sched.pid} at {address}, idle RSS {_kib(sched.pid, 'VmRSS') / 1024:.0f} MB")
            for label, tok in [("no token", ""), ("user token", token)] * args.rounds:
                Path(f"/proc/{sched.pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
                t0 = time.monotonic()
                codes = _flood(address, args.calls, args.mib, tok)
                print(f"{label:10}: {args.calls} x {args.mib:g} MiB SubmitJob -> {codes} in "
                      f"{time.monotonic() - t0:.1f}s; peak RSS {_kib(sched.pid, 'VmHWM') / 1024:.0f} MB, "
                      f"after {_kib(sched.pid, 'VmRSS') / 1024:.0f} MB")
        finally:
            sched.terminate()
            sched.wait(30)


if __name__ == "__main__":
    main()
