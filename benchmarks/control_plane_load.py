"""The control plane under load, with --auth token and TLS on (issue 10).

One real `gandiva scheduler` process (SQLite, then PostgreSQL if reachable). This
process simulates, over real gRPC with real tokens:
  * --helpers helpers (default 100, 16 virtual GPUs each), each with its own helper
    token: register, heartbeat at the interval the scheduler asks, take commands off
    ReceiveCommands and answer them; a launch starts a simulated runtime with a
    token minted for that launch, as a real helper does;
  * --runtimes jobs (default 1,000) submitted first, so the scheduler places them and
    the helpers start their runtimes: each a Runtime.Connect stream sending one
    ProgressReport a second (steps = how many it has sent) and acking commands;
  * --submitters concurrent users (default 4) looping SubmitJob then GetJob of 1-GPU
    jobs. The helpers have exactly as many GPUs as there are runtimes (default
    --gpus-per-helper: runtimes / helpers, rounded up), and the scheduler runs the
    fifo policy, so these jobs fit a server but queue behind the running ones: they
    never start runtimes (nor time-slice the running ones), and the streaming load
    stays what was asked.
After --duration seconds (default 60) it reports p50/p99 of SubmitJob and GetJob,
how many submissions succeeded and how many were refused (and by what status), the
scheduler's CPU (percent of one core, by thread) and RSS, the load generator's own CPU
(this process's simulated cluster, and the submitters' process: they share the machine
with the scheduler), the machine's load average, and counts
progress reports on both sides: sent here, received by the scheduler (it logs the
count at shutdown), and the last step each job has in the database equals what its
runtime sent last. It exits non-zero unless every submission succeeded and no
progress report was lost.

    PYTHONPATH=. nice -n 15 python benchmarks/control_plane_load.py [--db sqlite] [--duration 60]
    ... --profile DIR     # the scheduler runs under benchmarks/sampler.py: DIR/sched-DB.txt

Goal: p99 of SubmitJob and GetJob < 100 ms. The machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypedDict

import grpc
import psutil
from submit_throughput import PG_ADMIN, pct, pg_database, secure_setup, start

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
from scheduler.transport import ClientSecurity, aio_channel

SPEC = common_pb2.JobSpec(command=["python", "train.py"], gpus=1, name="load")


class Latencies(TypedDict):
    """What the submitters measured: seconds per successful call, refused calls by
    "METHOD STATUS", and the CPU seconds their process used."""

    SubmitJob: list[float]
    GetJob: list[float]
    refused: dict[str, int]
    cpu_s: float


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token``, as every gandiva client sends it."""
    return ClientSecurity(token=token).metadata()


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
    """The simulated cluster: helpers that launch simulated runtimes when the scheduler
    places a job on them, runtimes that stream progress and acknowledge commands."""

    def __init__(self, address: str, ca: str, user: str, helper_tokens: list[str], args: argparse.Namespace) -> None:
        self.address, self.ca, self.user, self.helper_tokens, self.args = address, ca, user, helper_tokens, args
        self.lat = Latencies(SubmitJob=[], GetJob=[], refused={}, cpu_s=0.0)
        self.sent: dict[str, int] = {}       # job id -> progress reports its runtimes sent
        self.runtimes: dict[tuple[str, str], asyncio.Task] = {}
        self.active: dict[tuple[str, str], asyncio.Event] = {}
        self.connected = 0
        self.broken_streams = 0
        self.errors: dict[str, int] = {}
        self.stop = asyncio.Event()
        self.channels: list = []

    def error(self, what: str, err: Exception) -> None:
        key = f"{what}: {getattr(err, 'code', lambda: type(err).__name__)()}"
        self.errors[key] = self.errors.get(key, 0) + 1

    async def helper(self, i: int, token: str) -> None:
        name = token.split(".")[1]
        stub = helper_pb2_grpc.HelperStub(self.channels[i % len(self.channels)])
        md = bearer(token)
        gpus = [common_pb2.Gpu(index=g, model="virtual", memory_total_bytes=16 << 30)
                for g in range(self.args.gpus_per_helper)]
        # An agent address of its own (none listens there): the scheduler refuses one that an up
        # server has already.
        reply = await stub.Register(helper_pb2.RegisterServerRequest(name=name, address=f"127.0.0.1:{20000 + i}",
                                                                     gpus=gpus), metadata=md)
        mine: set[tuple[str, str]] = set()  # the (job, incarnation) launches it runs

        async def commands() -> None:
            async for cmd in stub.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=name), metadata=md):
                body = cmd.WhichOneof("body")
                if body == "launch":
                    key = (cmd.launch.job_id, cmd.launch.incarnation)
                    mine.add(key)
                    # A pre-warmed process holds before its first step until activated.
                    self.active[key] = asyncio.Event()
                    if not cmd.launch.warm:
                        self.active[key].set()
                    # What a real helper does: start the job with a token for this launch only.
                    self.runtimes[key] = asyncio.create_task(self.runtime(i, *key, auth.runtime_token(token, *key)))
                elif body == "activate":
                    self.active.setdefault((cmd.activate.job_id, cmd.activate.incarnation), asyncio.Event()).set()
                elif body == "stop":
                    mine.difference_update({k for k in mine if k[0] == cmd.stop.job_id})
                    for key, task in list(self.runtimes.items()):
                        if key[0] == cmd.stop.job_id:
                            task.cancel()
                await stub.ReportCommandResult(helper_pb2.HelperCommandResult(
                    server=name, command_id=cmd.command_id, ok=True), metadata=md)

        task = asyncio.create_task(commands())
        peers_version = 0
        try:
            while not self.stop.is_set():
                try:
                    # As a real helper reports: (job, incarnation) pairs, checked for stale
                    # launches, and the version of the registered-helpers list it holds.
                    running = [helper_pb2.JobIncarnation(job_id=j, incarnation=inc) for j, inc in sorted(mine)]
                    answer = await stub.Heartbeat(helper_pb2.HeartbeatRequest(
                        name=name, running=running, peers_version=peers_version), metadata=md, timeout=10)
                    peers_version = answer.peers_version
                except Exception as err:  # noqa: BLE001 - counted and reported
                    self.error("Heartbeat", err)
                await asyncio.sleep(reply.heartbeat_interval_s or 2.0)
        finally:
            task.cancel()

    async def runtime(self, i: int, job_id: str, incarnation: str, token: str) -> None:
        stub = runtime_pb2_grpc.RuntimeStub(self.channels[i % len(self.channels)])
        acks: asyncio.Queue = asyncio.Queue()
        self.sent.setdefault(job_id, 0)

        ended = asyncio.Event()  # stopped for a migration, or killed: the process would exit

        async def messages():  # type: ignore[no-untyped-def]
            yield runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(job_id=job_id, incarnation=incarnation, pid=1))
            await asyncio.sleep(random.random())  # spread the reports over the second
            next_at = time.monotonic()
            active = self.active[(job_id, incarnation)]
            while not self.stop.is_set() and not ended.is_set():
                while not acks.empty():
                    yield acks.get_nowait()
                if active.is_set() and time.monotonic() >= next_at:
                    self.sent[job_id] += 1
                    yield runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                        steps=self.sent[job_id], rate=1.0, last_step_s=1.0, at=time.time()))
                    next_at += 1.0
                await asyncio.sleep(0.05)
            while not acks.empty():
                yield acks.get_nowait()
            # Stop: the stream is half-closed; the scheduler has read everything once it ends.

        call = stub.Connect(messages(), metadata=bearer(token))
        self.connected += 1
        try:
            async for cmd in call:
                acks.put_nowait(runtime_pb2.RuntimeMessage(ack=runtime_pb2.CommandAck(
                    command_id=cmd.command_id, ok=True, step=self.sent[job_id])))
                if cmd.kind in (runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION, runtime_pb2.COMMAND_KIND_KILL):
                    ended.set()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a broken stream may lose reports: counted
            self.broken_streams += 1
            self.error("Connect", err)

    async def run(self, sched_pid: int) -> dict:
        a = self.args
        sec = ClientSecurity(tls_ca=self.ca)
        self.channels = [aio_channel(self.address, sec) for _ in range(8)]
        stub = scheduler_pb2_grpc.SchedulerStub(self.channels[0])
        helpers = [asyncio.create_task(self.helper(i, t)) for i, t in enumerate(self.helper_tokens)]
        await asyncio.sleep(3.0)
        # The jobs whose runtimes stream, placed by the scheduler on the helpers.
        await stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(
            name="runtimes", jobs=[SPEC] * a.runtimes), metadata=bearer(self.user), timeout=120)
        deadline = time.monotonic() + 180
        while self.connected < a.runtimes and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        print(f"  {self.connected} runtimes connected; measuring for {a.duration:.0f} s", flush=True)
        proc, me = psutil.Process(sched_pid), psutil.Process()
        cpu0, mine0, t0 = proc.cpu_times(), me.cpu_times(), time.monotonic()
        threads0 = thread_cpu(sched_pid)
        load0 = os.getloadavg()
        # The submitters run in a process of their own, so that this process's busy event
        # loop (1,000 streams) does not inflate the latencies they measure.
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            self.lat = await loop.run_in_executor(pool, submitters, self.address, self.ca, self.user,
                                                  a.submitters, a.duration, a.think_s)
        cpu1, mine1, t1 = proc.cpu_times(), me.cpu_times(), time.monotonic()
        threads1 = thread_cpu(sched_pid)
        load1 = os.getloadavg()
        by_thread: dict[str, float] = {}
        for tid, (name, used) in threads1.items():
            by_thread[name] = by_thread.get(name, 0.0) + (used - threads0.get(tid, (name, 0.0))[1]) / (t1 - t0) * 100
        rss = proc.memory_info().rss / 2**20
        self.stop.set()
        # Every runtime half-closes; its call ends once the scheduler has read it all.
        await asyncio.wait(list(self.runtimes.values()), timeout=60)
        for t in [*helpers, *self.runtimes.values()]:
            t.cancel()
        await asyncio.gather(*helpers, *self.runtimes.values(), return_exceptions=True)
        # The database's view: each job's steps reach the last report its runtime sent.
        short: list[str] = []
        deadline = time.monotonic() + 60
        for jid, sent in self.sent.items():
            while True:
                got = (await stub.GetJob(scheduler_pb2.GetJobRequest(id=jid), metadata=bearer(self.user))).steps
                if got == sent or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            if got != sent:
                short.append(jid)
                if len(short) <= 3:
                    job = await stub.GetJob(scheduler_pb2.GetJobRequest(id=jid), metadata=bearer(self.user))
                    print(f"  {jid}: sent {sent}, stored {got}, {common_pb2.JobState.Name(job.state)}: "
                          f"{job.message}", flush=True)
        for ch in self.channels:
            await ch.close()
        cpu = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0) * 100
        cluster = ((mine1.user + mine1.system) - (mine0.user + mine0.system)) / (t1 - t0) * 100
        return {"cpu": cpu, "rss": rss, "cluster_cpu": cluster, "submitters_cpu": self.lat["cpu_s"] / (t1 - t0) * 100, "stored_short": len(short), "sent": sum(self.sent.values()),
                "load": (load0[0], load1[0]), "threads": by_thread}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Thread id -> (name, CPU seconds so far) of a process's threads (Linux)."""
    out: dict[int, tuple[str, float]] = {}
    for t in psutil.Process(pid).threads():
        try:
            name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            continue
        if t.id == pid:
            name = "event loop"
        elif name.startswith("python"):
            name = "other Python threads"  # SQLite's writer and aiosqlite's threads
        out[t.id] = (re.sub(r"[-_]?\d+$", "", name) or "?", t.user_time + t.system_time)
    return out


def submitters(address: str, ca: str, user: str, n: int, duration: float,
               think_s: float) -> Latencies:
    """n users looping SubmitJob then GetJob for ``duration`` seconds (in a child process).
    Their 1-GPU jobs fit any server but find every GPU taken: they queue (the policy
    sees them every round) and never start runtimes. Refused calls are counted by
    status, per method (key "refused"); latencies are of successful calls only."""
    lat = Latencies(SubmitJob=[], GetJob=[], refused={}, cpu_s=0.0)
    spec = common_pb2.JobSpec(command=["python", "train.py"], gpus=1, name="q")

    def refused(method: str, err: Exception) -> None:
        code = err.code().name if isinstance(err, grpc.RpcError) else type(err).__name__
        key = f"{method} {code}"
        lat["refused"][key] = lat["refused"].get(key, 0) + 1

    async def one(ch) -> None:  # type: ignore[no-untyped-def]
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        md = bearer(user)
        end = time.monotonic() + duration
        while time.monotonic() < end:
            try:
                t0 = time.perf_counter()
                job = (await stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), metadata=md, timeout=30)).job
                lat["SubmitJob"].append(time.perf_counter() - t0)
            except Exception as err:  # noqa: BLE001 - counted and reported
                refused("SubmitJob", err)
                await asyncio.sleep(think_s)
                continue
            try:
                t1 = time.perf_counter()
                await stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id), metadata=md, timeout=30)
                lat["GetJob"].append(time.perf_counter() - t1)
            except Exception as err:  # noqa: BLE001 - counted and reported
                refused("GetJob", err)
            await asyncio.sleep(think_s)

    async def go() -> None:
        async with aio_channel(address, ClientSecurity(tls_ca=ca)) as ch:
            await asyncio.gather(*(one(ch) for _ in range(n)))

    cpu0 = time.process_time()
    asyncio.run(go())
    lat["cpu_s"] = time.process_time() - cpu0
    return lat


def run_one(label: str, db_url: str, work: Path, args: argparse.Namespace) -> bool:
    """One database; True when every submission succeeded and no report was lost."""
    extra, ca = secure_setup(db_url, work)
    user, helper_tokens = asyncio.run(make_tokens(db_url, args.helpers))
    log_path = work / f"sched-{label}.log"
    profile = Path(args.profile) / f"sched-{label}.txt" if args.profile else None
    with open(log_path, "w") as log:  # INFO: the progress-report count at the end is read from it
        # fifo: queued jobs wait for free GPUs; no time-slicing disturbs the runtimes.
        proc, address = start(db_url, work, ["--log-level", "INFO", "--policy", "fifo", *extra], log,
                              profile=profile)
    load = Load(address, str(ca), user, helper_tokens, args)
    try:
        res = asyncio.run(load.run(proc.pid))
    finally:
        proc.terminate()
        proc.wait(60)
    m = re.search(r"delivered (\d+) progress reports", log_path.read_text())
    received = int(m.group(1)) if m else -1
    s, g = load.lat["SubmitJob"], load.lat["GetJob"]
    refused = load.lat["refused"]
    print(f"{label}: {args.helpers} helpers x {args.gpus_per_helper} GPUs, {args.runtimes} runtimes, {args.submitters} submitters, "
          f"{args.duration:.0f} s, --auth token + TLS")
    print(f"  submissions: {len(s)} OK, {sum(v for k, v in refused.items() if k.startswith('SubmitJob'))} refused; "
          f"GetJob: {len(g)} OK, {sum(v for k, v in refused.items() if k.startswith('GetJob'))} refused"
          + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(refused.items()))})" if refused else ""))
    for name, lat in (("SubmitJob", s), ("GetJob", g)):
        if lat:
            print(f"  {name:<10} n={len(lat):>5}  p50 {pct(lat, 0.5) * 1e3:7.1f} ms  p99 {pct(lat, 0.99) * 1e3:7.1f} ms  "
                  f"max {max(lat) * 1e3:7.1f} ms")
    print(f"  scheduler CPU {res['cpu']:.0f}% of one core, RSS {res['rss']:.0f} MB; "
          f"load average (1 min) {res['load'][0]:.1f} at the start, {res['load'][1]:.1f} at the end "
          f"of the measurement, {os.cpu_count()} CPUs")
    print(f"  load generator CPU (same machine, % of one core): simulated helpers and runtimes {res['cluster_cpu']:.0f}, "
          f"submitters {res['submitters_cpu']:.0f}")
    top = sorted(res["threads"].items(), key=lambda kv: -kv[1])[:6]
    print("  scheduler CPU by thread (% of one core): " + ", ".join(f"{n} {v:.0f}" for n, v in top))
    print(f"  progress reports: sent {res['sent']}, received by the scheduler {received}, "
          f"broken streams {load.broken_streams}, jobs whose stored step != last sent {res['stored_short']}")
    if load.errors:
        print(f"  errors of the simulated cluster: {load.errors}")
    ok = received == res["sent"] and res["stored_short"] == 0 and load.broken_streams == 0
    print("  OK: no progress report lost" if ok else "  LOST: some progress reports did not arrive")
    submitted = bool(s) and not refused
    print("  OK: every submission succeeded" if submitted else
          "  FAILED: submissions were refused (or none was made); the latencies above do not measure SubmitJob")
    return ok and submitted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--helpers", type=int, default=100)
    ap.add_argument("--runtimes", type=int, default=1000)
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--gpus-per-helper", type=int, default=0,
                    help="virtual GPUs per simulated helper (default: runtimes / helpers rounded up, so "
                    "the runtimes' jobs take every GPU and the submitters' jobs queue)")
    ap.add_argument("--think-s", type=float, default=0.05, help="pause between a submitter's calls")
    ap.add_argument("--pg-url", default=PG_ADMIN)
    ap.add_argument("--profile", metavar="DIR", help="run the scheduler under benchmarks/sampler.py "
                    "(a sampling profiler of its event loop); the report goes to DIR/sched-DB.txt")
    args = ap.parse_args()
    args.gpus_per_helper = args.gpus_per_helper or math.ceil(args.runtimes / args.helpers)
    if args.helpers * args.gpus_per_helper != args.runtimes:
        # Free GPUs would start the submitters' jobs: more runtimes than asked for.
        ap.error(f"--helpers {args.helpers} x --gpus-per-helper {args.gpus_per_helper} GPUs must equal "
                 f"--runtimes {args.runtimes}, so that the submitters' jobs queue; change one of them")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gandiva-load-"))
    ok = True
    if args.db in ("sqlite", "both"):
        ok &= run_one("sqlite", f"sqlite+aiosqlite:///{work / 'load.db'}", work, args)
    if args.db in ("postgresql", "both"):
        url = pg_database(args.pg_url)
        if url:
            ok &= run_one("postgresql", url, work, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
