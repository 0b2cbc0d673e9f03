"""Submission throughput and latency of the scheduler, on SQLite and PostgreSQL.

Starts a real `gandiva scheduler` process (uvloop, grpc.aio) per database, waits for
it to settle, reads its idle RSS, then drives SubmitJob over gRPC from concurrent
clients in this process for a fixed number of submissions, and prints throughput,
latency percentiles and RSS.

    python benchmarks/submit_throughput.py                  # SQLite, and PostgreSQL if reachable
    python benchmarks/submit_throughput.py --db sqlite --n 3000 --concurrency 16
    python benchmarks/submit_throughput.py --mode both      # plaintext, then --auth token + TLS
    python benchmarks/submit_throughput.py --mode both --rounds 6   # taking turns: robust to load swings

PostgreSQL: scripts/pg-test-setup.sh starts a local server; override with --pg-url.
Goals (issue 2): >= 500 submissions/s sustained, p99 < 50 ms, idle RSS < 150 MB.
Goal (issue 10): with auth and TLS on, at most 20% fewer submissions/s than plaintext.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO

import psutil

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.transport import ClientSecurity, aio_channel

PG_ADMIN = "postgresql+asyncpg://gandiva:gandiva@127.0.0.1:5432/gandiva"


GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]


def secure_setup(db_url: str, workdir: Path) -> tuple[list[str], Path]:
    """Certificates (`gandiva tls init`) and the scheduler flags for auth + TLS."""
    pki = workdir / "pki"
    if not (pki / "ca.pem").exists():
        subprocess.run([*GANDIVA, "tls", "init", str(pki), "--host", "127.0.0.1", "--host", "localhost"],
                       check=True, capture_output=True)
    flags = ["--auth", "token", "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server-key.pem")]
    return flags, pki / "ca.pem"


def make_token(db_url: str, name: str, *role: str) -> str:
    """A token as the administrator makes it (`gandiva token create`)."""
    out = subprocess.run([*GANDIVA, "token", "--db", db_url, "create", name, *role],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def start(db_url: str, workdir: Path, extra: list[str] | None = None,
          log: IO[str] | None = None, profile: Path | None = None) -> tuple[subprocess.Popen, str]:
    """A scheduler process (``extra`` flags win over the defaults); its address once it listens.
    ``log``: where its output goes (default: this process's). ``profile``: run it under
    benchmarks/sampler.py, whose report goes to that file when it stops (SIGTERM is a
    graceful stop)."""
    port_file = workdir / f"port-{uuid.uuid4().hex}"
    sampler = str(Path(__file__).with_name("sampler.py"))
    gandiva = GANDIVA if profile is None else [sys.executable, sampler, "-o", str(profile),
                                                "-m", "gandiva_cli.main"]
    proc = subprocess.Popen(
        [*gandiva, "scheduler", "--listen", "127.0.0.1:0",
         "--db", db_url, "--port-file", str(port_file), "--log-level", "WARNING",
         "--max-jobs-per-user", "0", *(extra or [])],  # thousands of one user's jobs
        env={**os.environ, "GANDIVA_HOME": str(workdir)}, stdout=log, stderr=log,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"scheduler failed to start on {db_url}" + (f"; see {log.name}" if log else ""))
        time.sleep(0.05)
    return proc, port_file.read_text().strip()


async def drive(address: str, n: int, concurrency: int, security: ClientSecurity | None = None) -> list[float]:
    latencies: list[float] = []
    counter = iter(range(n))
    spec = common_pb2.JobSpec(command=["python", "train.py", "--lr", "0.1"], gpus=1, name="bench")

    async def worker(stub: scheduler_pb2_grpc.SchedulerStub) -> None:
        for _ in counter:
            t0 = time.perf_counter()
            await stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec))
            latencies.append(time.perf_counter() - t0)

    async with aio_channel(address, security) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        await stub.ListJobs(scheduler_pb2.ListJobsRequest(limit=1))  # connect first
        await asyncio.gather(*(worker(stub) for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else values[0]


def pg_database(admin_url: str) -> str | None:
    import asyncpg

    name = f"gandiva_bench_{uuid.uuid4().hex[:8]}"
    dsn = admin_url.replace("postgresql+asyncpg://", "postgresql://")

    async def create() -> None:
        conn = await asyncpg.connect(dsn, timeout=3)
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()

    try:
        asyncio.run(create())
    except Exception as err:  # noqa: BLE001 - report why PostgreSQL is skipped
        print(f"PostgreSQL skipped: {err.__class__.__name__}: {err} (run scripts/pg-test-setup.sh)")
        return None
    return admin_url.rsplit("/", 1)[0] + "/" + name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--n", type=int, default=3000, help="submissions per database (default 3000)")
    ap.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    ap.add_argument("--pg-url", default=PG_ADMIN, help="admin URL of a PostgreSQL whose role may create databases")
    ap.add_argument("--mode", choices=["plain", "secure", "both"], default="plain",
                    help="plain: no TLS, no tokens (default); secure: --auth token and TLS; both: each, compared")
    ap.add_argument("--rounds", type=int, default=1,
                    help="split the submissions into this many rounds; with --mode both the modes take "
                    "turns round by round and the median of the paired differences is reported (default 1)")
    args = ap.parse_args()

    targets: list[tuple[str, str]] = []
    work = Path(tempfile.mkdtemp(prefix="gandiva-bench-"))
    if args.db in ("sqlite", "both"):
        targets.append(("sqlite", f"sqlite+aiosqlite:///{work / 'bench.db'}"))
    if args.db in ("postgresql", "both"):
        url = pg_database(args.pg_url)
        if url:
            targets.append(("postgresql", url))

    modes = ["plain", "secure"] if args.mode == "both" else [args.mode]
    rounds = max(1, args.rounds)
    print(f"{'database':<11} {'mode':<7} {'round':>5} {'subs':>6} {'subs/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'idle RSS MB':>12} {'loaded RSS MB':>14}")
    for label, base_url in targets:
        # Every mode's scheduler runs from the start, each on its own fresh database; the
        # modes then take turns (order alternating per round), so that a change in the
        # machine's load hits both alike: on a shared machine, one run of each in a row
        # measures the load more than the difference.
        procs: dict[str, tuple[subprocess.Popen, str, ClientSecurity | None]] = {}
        idle_rss: dict[str, float] = {}  # MB, once start-up work has settled
        try:
            for mode in modes:
                url = base_url if mode == modes[0] else fresh(base_url, work, label, args.pg_url)
                security, extra = None, []
                if mode == "secure":
                    extra, ca = secure_setup(url, work)
                    security = ClientSecurity(token=make_token(url, "bench"), tls_ca=str(ca))
                proc, address = start(url, work, extra)
                procs[mode] = (proc, address, security)
            time.sleep(2.0)  # let start-up work (migrations, first rounds) settle
            for mode, (proc, address, security) in procs.items():
                idle_rss[mode] = psutil.Process(proc.pid).memory_info().rss / 2**20
                asyncio.run(drive(address, min(200, args.n), args.concurrency, security))  # warm-up
            rates: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(rounds):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    proc, address, security = procs[mode]
                    t0 = time.perf_counter()
                    lat = asyncio.run(drive(address, max(1, args.n // rounds), args.concurrency, security))
                    elapsed = time.perf_counter() - t0
                    loaded_rss = psutil.Process(proc.pid).memory_info().rss / 2**20
                    rates[mode].append(len(lat) / elapsed)
                    print(
                        f"{label:<11} {mode:<7} {r + 1:>5} {len(lat):>6} {len(lat) / elapsed:>8.0f} "
                        f"{pct(lat, 0.5) * 1e3:>7.1f} {pct(lat, 0.99) * 1e3:>7.1f} {max(lat) * 1e3:>7.1f} "
                        f"{idle_rss[mode]:>12.1f} {loaded_rss:>14.1f}", flush=True)
        finally:
            for proc, _, _ in procs.values():
                proc.terminate()
                proc.wait(30)
        if len(modes) == 2:
            paired = [100 * (s / p - 1) for p, s in zip(rates["plain"], rates["secure"])]
            print(f"{label:<11} auth+TLS vs plaintext: median {statistics.median(paired):+.1f}% submissions/s "
                  f"over {rounds} paired rounds ({', '.join(f'{x:+.0f}%' for x in paired)}); medians "
                  f"{statistics.median(rates['plain']):.0f} vs {statistics.median(rates['secure']):.0f}/s "
                  "(goal: no worse than -20%)")
    return 0


def fresh(url: str, work: Path, label: str, pg_admin: str) -> str:
    """Another empty database of the same kind, so each mode starts alike."""
    if label == "sqlite":
        return f"sqlite+aiosqlite:///{work / f'bench-{uuid.uuid4().hex[:6]}.db'}"
    return pg_database(pg_admin) or url


if __name__ == "__main__":
    sys.exit(main())
