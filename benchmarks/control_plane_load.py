"""The control plane under load, with --auth token and TLS on (issue 10).

One real `gandiva scheduler` process (SQLite, then PostgreSQL if reachable). This
process simulates, over real gRPC with real tokens:
  * --helpers helpers (default 100, 4 virtual GPUs each), each with its own helper
    token: register, heartbeat at the interval the scheduler asks, take commands off
    ReceiveCommands and answer them (a launch adds the job to its heartbeat's
    running set, a stop removes it);
  * --runtimes job runtimes (default 1,000), each a Runtime.Connect stream with a
    token minted the way a helper mints it, sending one ProgressReport a second
    (steps = how many it has sent);
  * --submitters concurrent users (default 4) looping SubmitJob then GetJob.
After --duration seconds (default 60) it reports p50/p99 of SubmitJob and GetJob,
the scheduler's CPU (percent of one core) and RSS, and counts progress reports on
both sides: sent here, received by the scheduler (it logs the count at shutdown),
and the last step each job has in the database equals what its runtime sent last.

    PYTHONPATH=. nice -n 15 python benchmarks/control_plane_load.py [--db sqlite] [--duration 60]

Goal: p99 of SubmitJob and GetJob < 100 ms. The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from submit_throughput import GANDIVA, pct, pg_database, secure_setup

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import auth
from scheduler.state import migrate
from scheduler.state.db import make_engine, make_sessionmaker
from scheduler.transport import AUTH_HEADER, ClientSecurity, aio_channel

PG_ADMIN = "postgresql+asyncpg://gandiva:gandiva@127.0.0.1:5432/gandiva"
SPEC = common_pb2.JobSpec(command=["python", "train.py"], gpus=1, name="load")


def bearer(token: str) -> tuple[tuple[str, str]]:
    return ((AUTH_HEADER, f"Bearer {token}"),)


async def make_tokens(db_url: str, helpers: int) -> tuple[str, list[str]]:
    engine = make_engine(db_url)
    try:
        await migrate.upgrade(engine)
        async with make_sessionmaker(engine)() as s, s.begin():
            user = await auth.create_token(s, "loaduser", "user")
            hs = [await auth.create_token(s, f"h{i:03d}", "helper") for i in range(helpers)]
        return user, hs
    finally:
        await engine.dispose()


class Load:
    def __init__(self, address: str, ca: str, user: str, helper_tokens: list[str], args: argparse.Namespace) -> None:
        self.address, self.ca, self.user, self.helper_tokens, self.args = address, ca, user, helper_tokens, args
        self.lat: dict[str, list[float]] = {"SubmitJob": [], "GetJob": []}
        self.sent: dict[str, int] = {}
        self.broken_streams = 0
        self.errors: dict[str, int] = {}
        self.stop = asyncio.Event()

    def error(self, what: str, err: Exception) -> None:
        key = f"{what}: {getattr(err, 'code', lambda: type(err).__name__)()}"
        self.errors[key] = self.errors.get(key, 0) + 1

    async def helper(self, ch, token: str) -> None:  # type: ignore[no-untyped-def]
        name = token.split(".")[1]
        stub = helper_pb2_grpc.HelperStub(ch)
        md = bearer(token)
        gpus = [common_pb2.Gpu(index=i, model="virtual", memory_total_bytes=16 << 30) for i in range(4)]
        reply = await stub.Register(helper_pb2.RegisterServerRequest(name=name, address="127.0.0.1:1", gpus=gpus), metadata=md)
        running: set[str] = set()

        async def commands() -> None:
            async for cmd in stub.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=name), metadata=md):
                body = cmd.WhichOneof("body")
                if body == "launch":
                    running.add(cmd.launch.job_id)
                elif body == "stop":
                    running.discard(cmd.stop.job_id)
                await stub.ReportCommandResult(helper_pb2.HelperCommandResult(
                    server=name, command_id=cmd.command_id, ok=True, step=0), metadata=md)

        task = asyncio.create_task(commands())
        try:
            while not self.stop.is_set():
                try:
                    await stub.Heartbeat(helper_pb2.HeartbeatRequest(name=name, running_jobs=sorted(running)),
                                         metadata=md, timeout=10)
                except Exception as err:  # noqa: BLE001 - counted and reported
                    self.error("Heartbeat", err)
                await asyncio.sleep(reply.heartbeat_interval_s or 2.0)
        finally:
            task.cancel()

    async def runtime(self, ch, job_id: str, helper_token: str) -> None:  # type: ignore[no-untyped-def]
        stub = runtime_pb2_grpc.RuntimeStub(ch)
        token = auth.runtime_token(helper_token, job_id, "")
        self.sent[job_id] = 0
        await asyncio.sleep(random.random())  # spread the streams over the second

        async def messages():  # type: ignore[no-untyped-def]
            yield runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job_id, pid=1))
            while not self.stop.is_set():
                self.sent[job_id] += 1
                yield runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                    steps=self.sent[job_id], rate=1.0, last_step_s=1.0, at=time.time()))
                await asyncio.sleep(1.0)

        call = stub.Connect(messages(), metadata=bearer(token))
        try:
            async for _ in call:
                pass
        except Exception as err:  # noqa: BLE001 - a broken stream loses reports: counted
            if not self.stop.is_set():
                self.broken_streams += 1
                self.error("Connect", err)

    async def submitter(self, ch) -> None:  # type: ignore[no-untyped-def]
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        md = bearer(self.user)
        while not self.stop.is_set():
            try:
                t0 = time.perf_counter()
                job = (await stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=SPEC), metadata=md, timeout=30)).job
                t1 = time.perf_counter()
                await stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id), metadata=md, timeout=30)
                t2 = time.perf_counter()
                self.lat["SubmitJob"].append(t1 - t0)
                self.lat["GetJob"].append(t2 - t1)
            except Exception as err:  # noqa: BLE001 - counted and reported
                self.error("submit", err)
            await asyncio.sleep(0.05)

    async def run(self, sched_pid: int) -> dict:
        a = self.args
        sec = ClientSecurity(tls_ca=self.ca)
        channels = [aio_channel(self.address, sec) for _ in range(8)]
        stub = scheduler_pb2_grpc.SchedulerStub(channels[0])
        # The jobs whose runtimes stream: submitted first, by the user.
        reply = await stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(
            name="runtimes", jobs=[SPEC] * a.runtimes), metadata=bearer(self.user), timeout=120)
        job_ids = [j.id for j in reply.jobs]
        tasks = [asyncio.create_task(self.helper(channels[i % 8], t)) for i, t in enumerate(self.helper_tokens)]
        await asyncio.sleep(2.0)
        tasks += [asyncio.create_task(self.runtime(channels[i % 8], j, self.helper_tokens[i % len(self.helper_tokens)]))
                  for i, j in enumerate(job_ids)]
        await asyncio.sleep(3.0)  # streams open
        proc = psutil.Process(sched_pid)
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        subs = [asyncio.create_task(self.submitter(channels[i % 8])) for i in range(a.submitters)]
        await asyncio.sleep(a.duration)
        cpu1, t1 = proc.cpu_times(), time.monotonic()
        rss = proc.memory_info().rss / 2**20
        self.stop.set()
        await asyncio.sleep(1.5)  # the last reports are flushed (progress_flush_s is 0.25 s)
        for t in tasks + subs:
            t.cancel()
        await asyncio.gather(*tasks, *subs, return_exceptions=True)
        # The database's view: each job's steps must equal the last report its runtime sent.
        stored: dict[str, int] = {}
        for jid in job_ids:
            stored[jid] = (await stub.GetJob(scheduler_pb2.GetJobRequest(id=jid), metadata=bearer(self.user))).steps
        for ch in channels:
            await ch.close()
        cpu = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0) * 100
        short = sum(1 for j in job_ids if stored[j] != self.sent[j])
        return {"cpu": cpu, "rss": rss, "stored_short": short, "sent": sum(self.sent.values())}


def run_one(label: str, db_url: str, work: Path, args: argparse.Namespace) -> None:
    extra, ca = secure_setup(db_url, work)
    user, helper_tokens = asyncio.run(make_tokens(db_url, args.helpers))
    port_file = work / f"port-{uuid.uuid4().hex}"
    log_path = work / f"sched-{label}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*GANDIVA, "scheduler", "--listen", "127.0.0.1:0", "--db", db_url,
                                 "--port-file", str(port_file), "--log-level", "INFO", *extra],
                                stdout=log, stderr=log, env={"GANDIVA_HOME": str(work), **dict(__import__("os").environ)})
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"scheduler failed to start; see {log_path}")
        time.sleep(0.05)
    address = port_file.read_text().strip()
    load = Load(address, str(ca), user, helper_tokens, args)
    try:
        res = asyncio.run(load.run(proc.pid))
    finally:
        proc.terminate()
        proc.wait(60)
    m = re.search(r"delivered (\d+) progress reports", log_path.read_text())
    received = int(m.group(1)) if m else -1
    s, g = load.lat["SubmitJob"], load.lat["GetJob"]
    print(f"{label}: {args.helpers} helpers, {args.runtimes} runtimes, {args.submitters} submitters, "
          f"{args.duration:.0f} s, --auth token + TLS")
    for name, lat in (("SubmitJob", s), ("GetJob", g)):
        if lat:
            print(f"  {name:<10} n={len(lat):>5}  p50 {pct(lat, 0.5) * 1e3:7.1f} ms  p99 {pct(lat, 0.99) * 1e3:7.1f} ms  "
                  f"max {max(lat) * 1e3:7.1f} ms")
    print(f"  scheduler CPU {res['cpu']:.0f}% of one core, RSS {res['rss']:.0f} MB")
    print(f"  progress reports: sent {res['sent']}, received by the scheduler {received}, "
          f"broken streams {load.broken_streams}, jobs whose stored step != last sent {res['stored_short']}")
    if load.errors:
        print(f"  errors: {load.errors}")
    ok = received == res["sent"] and res["stored_short"] == 0 and load.broken_streams == 0
    print("  OK: no progress report lost" if ok else "  LOST: some progress reports did not arrive")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--helpers", type=int, default=100)
    ap.add_argument("--runtimes", type=int, default=1000)
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--pg-url", default=PG_ADMIN)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gandiva-load-"))
    if args.db in ("sqlite", "both"):
        run_one("sqlite", f"sqlite+aiosqlite:///{work / 'load.db'}", work, args)
    if args.db in ("postgresql", "both"):
        url = pg_database(args.pg_url)
        if url:
            run_one("postgresql", url, work, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
