"""Seeded random faults over a real multi-host cluster (Linux network namespaces; root).

    nice -n 10 python benchmarks/chaos.py --seed 1 --minutes 3 [--jobs 5] [--pace 0.5] [--dry]
        [--db sqlite|postgres] [--more]

A scheduler (SQLite, or PostgreSQL with --db postgres) and 3 helpers each in its own
namespace, N feed_step jobs; over --minutes a schedule generated from --seed (printed
first, the same for the same seed) of: link cuts (helper or scheduler side), helper
SIGSTOP/SIGCONT, helper kill -9 and restart, operator migrate, suspend/resume, scheduler
kill -9 and restart; with --db postgres also the database server stopped (fast or
immediate) and started again; with --more also: a job killed by its user right after a
migration was asked for, a helper restarted with another GPU count (1 or 4; back to 2 at
its next restart), the scheduler killed -9 just after a migration was asked for (in its
transfer), and a job whose program exits non-zero by itself at a random step (then its
user submits it again: that copy must succeed); with --more, job0 and job1 opt in to
grow-shrink (`--devices auto`: their towers spread over the GPUs they hold). Then every
fault is undone and the invariants are checked: every job ends exactly once with all
its steps, final variables bit-identical to an uninterrupted run, never two copies
training at once (the multihost tests' sampler, tests/multihost/conftest.py), and in the
database no GPU beyond its server's count, no ended or queued job holding GPUs, no running
job holding a different number than it needs, nothing left at the end. Jobs sharing a GPU
(time-slicing, packs) are allowed: listed as info. Exit status 0 when every invariant held.
The schedule depends on the seed only; what the cluster does in between does not (a
migration picks, at its time, the scheduled job or the next running one). Note: the
sampler counts a fresh copy's start-up (importing TensorFlow) as training, so a stale copy
still starting beside its replacement shows as two copies; read the job's log to tell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = ROOT  # the scheduler, helpers and jobs run this checkout
os.environ.setdefault("GANDIVA_NETNS_PREFIX", "chaos")  # names of namespaces and links

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from tests.conftest import _wait_for
from tests.multihost.conftest import (
    FEED_ARGS,
    SCHED_PORT,
    Cluster,
    Net,
    _skip_reason,
    feed_step_origin,
)
from tests.tf_runtime.conftest import load_variables

PG_BIN = "/usr/lib/postgresql/15/bin"

DONE = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)
HELPERS = ["h1", "h2", "h3"]
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_schedule(seed: int, minutes: float, njobs: int, pace: float = 1.0, db: str = "sqlite",
                  more: bool = False) -> list[dict]:
    """A list of fault events: {t, kind, target, dur}, non-overlapping per target, at most
    two helpers faulted at once, all ended by the end of the window. Without --db postgres
    and --more, the same schedules as before those were added (seeds stay comparable)."""
    rng = random.Random(seed)
    end = minutes * 60
    busy: dict[str, float] = {}  # target -> time it is free again
    events: list[dict] = []
    t = rng.uniform(15, 25)  # let the jobs start
    kinds = ["cut_helper", "cut_sched", "stop_helper", "kill_helper", "migrate", "suspend", "kill_sched"]
    weights = [3, 1, 3, 2, 4, 2, 1]
    if db == "postgres":
        kinds, weights = kinds + ["pg_down"], weights + [1]
    if more:
        kinds += ["kill_migrating", "regpus_helper", "kill_sched_migrating", "crash"]
        weights += [1, 1, 1, 1]
    crashes = 0
    while t < end - 20:
        kind = rng.choices(kinds, weights)[0]
        dur = round(rng.uniform(2, 12), 1)
        if kind == "crash":  # a job of its own, not one of the N: at most 2, early enough to end
            if crashes >= 2 or t > end - 60:
                t += rng.uniform(2, 6)
                continue
            crashes += 1
            events.append({"t": round(t, 1), "kind": kind, "target": f"crash{crashes}",
                           "at_step": rng.randrange(20, 150), "dur": 0})
            t += rng.uniform(3, 10) * pace
            continue
        if kind in ("cut_helper", "stop_helper", "kill_helper", "regpus_helper"):
            free = [h for h in HELPERS if busy.get(h, 0) <= t]
            faulted = sum(1 for h in HELPERS if busy.get(h, 0) > t)
            if not free or faulted >= 2:
                t += rng.uniform(2, 6)
                continue
            target = rng.choice(free)
            busy[target] = t + dur + 1
            events.append({"t": round(t, 1), "kind": kind, "target": target, "dur": dur})
            if kind == "regpus_helper":
                events[-1]["gpus"] = rng.choice([1, 4])
        elif kind in ("cut_sched", "kill_sched", "pg_down", "kill_sched_migrating"):
            if busy.get("sched", 0) > t:
                t += rng.uniform(2, 6)
                continue
            dur = round(rng.uniform(2, 8), 1)
            busy["sched"] = t + dur + 3
            ev = {"t": round(t, 1), "kind": kind, "target": "sched", "dur": dur}
            if kind == "pg_down":
                ev["mode"] = rng.choice(["fast", "immediate"])
            if kind == "kill_sched_migrating":
                ev.update(job=f"job{rng.randrange(njobs)}", dest=rng.choice(HELPERS), after=round(rng.uniform(0.1, 1.5), 2))
            events.append(ev)
        elif kind == "kill_migrating":
            if sum(e["kind"] == kind for e in events) >= 2:  # most jobs must still run to their end
                t += rng.uniform(2, 6)
                continue
            events.append({"t": round(t, 1), "kind": kind, "target": f"job{rng.randrange(njobs)}",
                           "dest": rng.choice(HELPERS), "after": round(rng.uniform(0.0, 1.5), 2), "dur": 0})
        elif kind == "migrate":
            events.append({"t": round(t, 1), "kind": kind, "target": f"job{rng.randrange(njobs)}",
                           "dest": rng.choice(HELPERS), "dur": 0})
        elif kind == "suspend":
            events.append({"t": round(t, 1), "kind": kind, "target": f"job{rng.randrange(njobs)}", "dur": dur})
        t += rng.uniform(3, 10) * pace
    return events


class PrivatePg:
    """A PostgreSQL 15 server of this run's own: initdb in a temporary folder owned by
    postgres, no TCP, a Unix socket in that folder. The scheduler in its namespace reaches
    it by the socket's path (the machine's own cluster listens on 127.0.0.1 of the root
    namespace only), and stopping it as a fault disturbs no one else's tests."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "gandiva", "-E", "UTF8")
        self.start()
        self._pg("createdb", "-h", str(self.dir), "-U", "gandiva", "gandiva")
        self.url = f"postgresql+asyncpg://gandiva@/gandiva?host={self.dir}"
        self.dsn = f"postgresql://gandiva@/gandiva?host={self.dir}"

    def _pg(self, *argv: str) -> None:
        cmd = " ".join(shlex.quote(a) for a in [f"{PG_BIN}/{argv[0]}", *argv[1:]])
        subprocess.run(["su", "postgres", "-c", cmd], check=True, capture_output=True, timeout=120, cwd="/")

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60",
                 "-o", f"-k {self.dir} -c listen_addresses=''", "start")

    def stop(self, mode: str) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class Db:
    """Read-only looks into the scheduler's database, SQLite or PostgreSQL: each call one
    consistent snapshot (also while the scheduler is down)."""

    def __init__(self, sqlite_path: Path | None = None, pg_dsn: str | None = None) -> None:
        self.sqlite_path, self.pg_dsn = sqlite_path, pg_dsn

    def query(self, *sqls: str) -> list[list[tuple]]:
        if self.pg_dsn is None:
            with contextlib.closing(sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=2)) as db:
                db.execute("BEGIN")  # one snapshot
                return [db.execute(q).fetchall() for q in sqls]
        import asyncpg

        async def look() -> list[list[tuple]]:
            conn = await asyncpg.connect(self.pg_dsn, timeout=3)
            try:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    return [[tuple(r) for r in await conn.fetch(q)] for q in sqls]
            finally:
                await conn.close()
        return asyncio.run(look())


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
        self.net = Net()
        self.c = Cluster(self.net, self.tmp, _wait_for)
        self.pg = PrivatePg() if args.db == "postgres" else None
        if self.pg is not None:
            self.c.db_url = self.pg.url
        self.db = Db(self.tmp / "state.db", self.pg.dsn if self.pg else None)
        self.gpus = {h: args.gpus for h in HELPERS}  # each helper's GPU count at its next start
        self.expect: dict[str, str] = {}  # jobN -> the end it must reach, when not SUCCEEDED
        self.steps: dict[str, int] = {}  # jobN -> its program's --steps
        self.most_held: dict[str, int] = {}  # job id -> the most GPUs the database gave it at once
        self.jobs: dict[str, str] = {}  # jobN -> id
        self.dumps: dict[str, Path] = {}
        self.gpu_shared: list[str] = []
        self.gpu_running2: set[str] = set()
        self.db_errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sched_down = False

    def spawn_helper(self, name: str) -> None:
        ns, addr = self.net.add_host(name) if name not in self.net.hosts else self.net.hosts[name][:2]
        self.c._spawn(name, ns, [
            "helper", "--server-name", name, "--gpus", str(self.gpus[name]), "--scheduler",
            f"{self.c.sched_addr}:{SCHED_PORT}", "--listen", f"{addr}:0", "--ramdisk", str(self.tmp / "rd" / name),
            "--shared-root", str(self.tmp / "rd"), "--log-dir", str(self.tmp / "logs"), "--insecure"])

    def db_sampler(self) -> None:
        """Every 0.5 s: each GPU's holders in the database (placements + migration reservations)."""
        while not self.stop.wait(0.5):
            try:
                places, servers, rows = self.db.query("SELECT job_id, server_name, gpu_index FROM placements",
                                                      "SELECT name, num_gpus FROM servers",
                                                      "SELECT id, state, gpus, grow_shrink FROM jobs")
            except Exception as e:  # noqa: BLE001 - sqlite3 or asyncpg (the database is down: a fault)
                self.db_errors.append(str(e))
                continue
            holders: dict[tuple[str, int], set[str]] = {}
            per_job: dict[str, int] = {}
            for job_id, server, gpu in places:
                holders.setdefault((server, gpu), set()).add(job_id)
                per_job[job_id] = per_job.get(job_id, 0) + 1
            ngpus = {n: k for n, k in servers}
            jobs = {j: (s, g) for j, s, g, _ in rows}
            grows = {j for j, _, _, grow in rows if grow}
            now = time.strftime('%H:%M:%S')
            for (server, gpu), js in holders.items():
                running = sorted(j for j in js if jobs.get(j, ("", 0))[0] == "RUNNING")
                if len(running) > 1:
                    self.gpu_running2.add(f"{server}/{gpu}: {running}")
                if gpu >= ngpus.get(server, 0):
                    self.gpu_shared.append(f"{now} {server}/{gpu} beyond its {ngpus.get(server)} GPUs: {sorted(js)}")
            for j, n in per_job.items():
                self.most_held[j] = max(n, self.most_held.get(j, 0))
                state, want = jobs.get(j, ("?", 0))
                if state in ("SUCCEEDED", "FAILED", "KILLED", "QUEUED"):
                    self.gpu_shared.append(f"{now} {j} {state} holds {n} GPU(s)")
                elif n != want and not (j in grows and n > want and n & (n - 1) == 0):  # grown: 2, 4 GPUs
                    self.gpu_shared.append(f"{now} {j} {state} holds {n} GPU(s), needs {want}")

    # ---- faults ---------------------------------------------------------------
    def later(self, delay: float, fn, *a) -> None:  # type: ignore[no-untyped-def]
        def run() -> None:
            self.stop.wait(delay)  # undone early when the run stops
            try:
                fn(*a)
            except Exception as e:  # noqa: BLE001
                log(f"  undo {fn.__name__}{a} failed: {e!r}")
        threading.Thread(target=run, daemon=True).start()

    def restart_sched(self) -> None:
        with self.lock:
            log("  scheduler restarted")
            self.c.start_scheduler(5.0)
            self.sched_down = False

    def restart_helper(self, name: str) -> None:
        log(f"  helper {name} restarted with {self.gpus[name]} GPU(s)")
        self.spawn_helper(name)
        self.gpus[name] = self.args.gpus  # a helper with another count comes back with the usual one next time

    def pg_start(self) -> None:
        assert self.pg is not None
        self.pg.start()
        log("  PostgreSQL started")

    def migrate(self, target: str, dest: str) -> str | None:
        """An operator's migrate of the scheduled job (or the next running one): its id
        when the scheduler took it."""
        try:
            jid, dest = self.pick_migration(target, dest)
        except grpc.RpcError as e:
            log(f"  migrate: {e.code().name}")
            return None
        if jid is None:
            log("  migrate: no running job")
            return None
        try:
            j = self.c.stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=jid, to_server=dest), timeout=10)
            log(f"  migrate {jid} -> {dest}: {common_pb2.JobState.Name(j.state)}")
            return jid
        except grpc.RpcError as e:
            log(f"  migrate {jid} -> {dest}: {e.code().name} {e.details()[:200]}")
            return None

    def cont(self, name: str) -> None:
        log(f"  helper {name} SIGCONT")
        self.c.signal(name, signal.SIGCONT)

    def restore(self, name: str) -> None:
        log(f"  link {name} restored")
        self.net.restore(name)

    def resume(self, jid: str) -> None:
        try:
            self.c.stub.ResumeJob(scheduler_pb2.JobActionRequest(id=jid), timeout=10)
            log(f"  resume {jid}: ok")
        except grpc.RpcError as e:
            log(f"  resume {jid}: {e.code().name} {e.details()}")
            # retry once later (the scheduler may be down)
            self.later(5, self.resume_retry, jid)

    def resume_retry(self, jid: str) -> None:
        for _ in range(30):
            try:
                j = self.c.job(jid)
                if j.state != common_pb2.JOB_STATE_SUSPENDED:
                    log(f"  resume retry {jid}: state {common_pb2.JobState.Name(j.state)}, nothing to do")
                    return
                self.c.stub.ResumeJob(scheduler_pb2.JobActionRequest(id=jid), timeout=10)
                log(f"  resume retry {jid}: ok")
                return
            except grpc.RpcError as e:
                log(f"  resume retry {jid}: {e.code().name} {e.details()[:150]}")
                time.sleep(3)

    def pick_migration(self, target: str, dest: str) -> tuple[str | None, str]:
        """The scheduled job if it runs, else the next running one; the scheduled
        destination unless the job is there already or it has no free GPU (then the next)."""
        names = list(self.jobs)
        i = names.index(target)
        for name in names[i:] + names[:i]:
            j = self.c.job(self.jobs[name])
            if j.state == common_pb2.JOB_STATE_RUNNING and j.placement:
                here = j.placement[0].server
                break
        else:
            return None, dest
        servers = {s.name: s for s in self.c.stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=10).servers}
        k = HELPERS.index(dest)
        for h in HELPERS[k:] + HELPERS[:k]:
            s = servers.get(h)
            if h != here and s is not None and s.up and s.allocated < s.gpus:
                return j.id, h
        return j.id, dest

    def apply(self, ev: dict) -> None:
        kind, target, dur = ev["kind"], ev["target"], ev["dur"]
        log(f"EVENT {ev}")
        if kind == "cut_helper" or kind == "cut_sched":
            self.net.cut(target)
            self.later(dur, self.restore, target)
        elif kind == "stop_helper":
            self.c.signal(target, signal.SIGSTOP)
            self.later(dur, self.cont, target)
        elif kind == "kill_helper":
            self.c.kill9(target)
            self.later(dur, self.restart_helper, target)
        elif kind == "kill_sched":
            with self.lock:
                self.c.kill9("scheduler")
                self.sched_down = True
            self.later(dur, self.restart_sched)
        elif kind == "migrate":
            self.migrate(target, ev["dest"])
        elif kind == "pg_down":
            assert self.pg is not None
            self.pg.stop(ev["mode"])
            log(f"  PostgreSQL stopped (-m {ev['mode']})")
            self.later(dur, self.pg_start)
        elif kind == "regpus_helper":
            self.c.kill9(target)
            self.gpus[target] = ev["gpus"]
            self.later(dur, self.restart_helper, target)
        elif kind == "kill_migrating":
            jid = self.migrate(target, ev["dest"])
            if jid is None:
                return
            time.sleep(ev["after"])
            name = next(n for n, i in self.jobs.items() if i == jid)
            self.expect[name] = "KILLED"  # asked for: even if the kill then fails, the job must not end otherwise
            try:
                j = self.c.stub.KillJob(scheduler_pb2.JobActionRequest(id=jid), timeout=10)
                log(f"  kill {name} ({jid}) mid-migration: {common_pb2.JobState.Name(j.state)}")
            except grpc.RpcError as e:
                log(f"  kill {name} ({jid}) mid-migration: {e.code().name} {e.details()[:200]}")
                del self.expect[name]
        elif kind == "kill_sched_migrating":
            jid = self.migrate(ev["job"], ev["dest"])
            time.sleep(ev["after"])
            with self.lock:
                self.c.kill9("scheduler")
                self.sched_down = True
            log(f"  scheduler killed -9 {ev['after']} s after the migrate of {jid}")
            self.later(dur, self.restart_sched)
        elif kind == "crash":
            self.submit_crash(target, ev["at_step"])
        elif kind == "suspend":
            jid = self.jobs.get(target)
            if jid is None:
                return
            try:
                j = self.c.stub.SuspendJob(scheduler_pb2.JobActionRequest(id=jid), timeout=10)
                log(f"  suspend {target}: {common_pb2.JobState.Name(j.state)}")
                self.later(dur, self.resume, jid)
            except grpc.RpcError as e:
                log(f"  suspend {target}: {e.code().name} {e.details()[:200]}")

    def submit(self, name: str, grow: bool = False, crash_at: int = 0) -> None:
        """A feed_step job; `grow`: opted in to grow-shrink, its towers on the GPUs it holds;
        `crash_at`: its program stops at that step and exits with status 3 (a crash)."""
        dump = self.tmp / f"final-{name}.npz"
        # A grow-shrink job grows only while nothing waits: it runs 1.5x as long, so that
        # it still trains once the others have ended.
        self.steps[name] = crash_at or (self.args.steps * 3 // 2 if grow else self.args.steps)
        cmd = ["python", feed_step_origin(), *FEED_ARGS, "--steps", str(self.steps[name]), "--step-sleep",
               str(self.args.sleep), "--dump", str(dump), *(["--devices", "auto"] if grow else [])]
        if crash_at:  # through bash, whose PATH may have no python with the shim's packages: this one
            cmd = ["bash", "-c", shlex.join([sys.executable, *cmd[1:]]) + "; exit 3"]
        spec = common_pb2.JobSpec(name=name, command=cmd, gpus=1, workdir=str(self.tmp), priority=1, grow_shrink=grow)
        self.jobs[name] = self.c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
        self.dumps[name] = dump

    def submit_all(self) -> None:
        for i in range(self.args.jobs):
            self.submit(f"job{i}", grow=self.args.more and i < 2)

    def submit_crash(self, name: str, at_step: int) -> None:
        """A job whose program exits non-zero at `at_step`; once it has failed its user
        submits it again (`NAME-again`), which must succeed like the others."""
        try:
            self.submit(name, crash_at=at_step)
        except grpc.RpcError as e:
            log(f"  submit {name}: {e.code().name} (the scheduler is down: not submitted)")
            return
        self.expect[name] = "FAILED"
        log(f"  submitted {name} ({self.jobs[name]}), crashing at step {at_step}")

        def resubmit() -> None:
            deadline = time.monotonic() + 600
            while not self.stop.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(grpc.RpcError):
                    j = self.c.job(self.jobs[name])
                    if j.state in DONE:
                        log(f"  {name} ended {common_pb2.JobState.Name(j.state)} at step {j.steps}: submitted again")
                        self.submit(f"{name}-again")
                        return
                self.stop.wait(1)
        threading.Thread(target=resubmit, daemon=True).start()

    def run(self) -> int:
        a = self.args
        schedule = print_schedule(a)
        base = {n: baseline(n, self.tmp) for n in {a.steps, a.steps * 3 // 2 if a.more else a.steps}}
        if a.more:  # grow-shrink jobs grow once GPUs have been idle this long (default: minutes)
            self.c.sched_args = ["--policy-option", "grow_idle_s=5"]
        self.c.start_scheduler(5.0)
        self.c.sampler.start()
        for h in HELPERS:
            self.spawn_helper(h)
        _wait_for(lambda: all(self.c.server_up(h) for h in HELPERS), 90)
        threading.Thread(target=self.db_sampler, daemon=True).start()
        self.submit_all()
        log(f"submitted {self.jobs}")
        start = time.monotonic()
        for ev in schedule:
            delay = start + ev["t"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                self.apply(ev)
            except Exception as e:  # noqa: BLE001
                log(f"  event failed: {e!r}")
        # let the last undo land
        time.sleep(15)
        log("fault window over; every fault undone; waiting for jobs")
        deadline = time.monotonic() + a.finish
        final: dict[str, common_pb2.Job] = {}
        while time.monotonic() < deadline and (len(final) < len(self.jobs) or self.awaiting_resubmit()):
            for name, jid in list(self.jobs.items()):
                if name in final:
                    continue
                try:
                    j = self.c.job(jid)
                except grpc.RpcError:
                    continue
                if j.state in DONE:
                    final[name] = j
                elif j.state == common_pb2.JOB_STATE_SUSPENDED:
                    with contextlib.suppress(grpc.RpcError):
                        self.c.stub.ResumeJob(scheduler_pb2.JobActionRequest(id=jid), timeout=10)
                        log(f"  {name} found suspended at the end: resumed")
            time.sleep(1)
        time.sleep(3)  # the sampler's last looks
        self.stop.set()
        return self.check(final, base)

    def connected_note(self, violation: str) -> str:
        """What each copy did: connected its runtime to the scheduler, and wrote a checkpoint
        (every 2 s of training, --checkpoint-interval). A copy that never connected, or never
        checkpointed although it was connected longer than that, was most likely still starting
        (the sampler counts start-up CPU as training): read the job's log to tell."""
        text = "".join(p.read_text(errors="replace") for p in self.tmp.glob("scheduler.log"))
        incs = re.findall(r"[0-9a-f]{12}", violation.split("copies training", 1)[-1])
        job = violation.split("job ", 1)[-1].split(":", 1)[0]
        try:
            (rows,) = self.db.query(f"SELECT message FROM events WHERE job_id = '{job}' AND kind = 'job.checkpoint'")
        except Exception:  # noqa: BLE001
            rows = []
        notes = [f"{i}: {'connected' if f'(incarnation {i}, pid' in text else 'never connected'}, "
                 f"{'checkpointed' if any(i in r[0] for r in rows) else 'never checkpointed'}" for i in incs]
        return f" [{'; '.join(notes)}]"

    def awaiting_resubmit(self) -> bool:
        return any(f"{n}-again" not in self.jobs for n, e in self.expect.items() if e == "FAILED")

    def check(self, final: dict[str, common_pb2.Job], bases: dict[int, dict[str, bytes]]) -> int:
        broken: list[str] = []
        for name in self.expect:
            if self.expect[name] == "FAILED" and f"{name}-again" not in self.jobs:
                broken.append(f"{name} was never submitted again (it did not end?)")
        for name, jid in list(self.jobs.items()):
            j = final.get(name)
            if j is None:
                with contextlib.suppress(grpc.RpcError):
                    j = self.c.job(jid)
                broken.append(f"{name} ({jid}) did not end: {common_pb2.JobState.Name(j.state) if j else '?'} "
                              f"{j.message if j else ''}")
                continue
            states = [common_pb2.JobState.Name(t.to_state).removeprefix("JOB_STATE_") for t in j.history]
            ends = [s for s in states if s in ("SUCCEEDED", "FAILED", "KILLED")]
            grown = self.most_held.get(jid, 0) > j.spec.gpus
            log(f"{name}: {common_pb2.JobState.Name(j.state)} steps {j.steps} history {states} msg {j.message!r}"
                + (f" grown to {self.most_held[jid]} GPUs" if grown else ""))
            want = self.expect.get(name, "SUCCEEDED")
            if want != "SUCCEEDED":
                if ends != [want]:
                    broken.append(f"{name} ended {ends}, expected [{want}] ({j.message})")
                continue
            if j.state != common_pb2.JOB_STATE_SUCCEEDED or ends != ["SUCCEEDED"]:
                broken.append(f"{name} ended {ends} ({j.message})")
            base = bases[self.steps[name]]
            if j.steps != self.steps[name]:
                broken.append(f"{name} steps {j.steps} != {self.steps[name]}")
            dump = self.dumps[name]
            if not dump.exists():
                broken.append(f"{name} wrote no final variables")
            else:
                got = load_variables(dump)
                differ = [k for k in base if got.get(k) != base[k]]
                if differ or got.keys() != base.keys():
                    broken.append(f"{name} final variables differ: {differ[:4]}")
        s = self.c.sampler
        log(f"sampler: {s.samples} samples, training seen {{{', '.join(f'{k}: {len(v)}' for k, v in s.training_seen.items())}}}")
        if s.samples < 50:
            broken.append(f"sampler ran only {s.samples} samples")
        broken += [f"two copies: {v}{self.connected_note(v)}" for v in s.violations]
        broken += [f"GPU in DB: {v}" for v in self.gpu_shared[:20]]
        log(f"(info) GPUs seen with two RUNNING jobs (packs): {sorted(self.gpu_running2)}; db read errors {len(self.db_errors)}")
        try:
            left, migs = self.db.query("SELECT job_id, server_name, gpu_index FROM placements",
                                       "SELECT job_id, phase FROM migrations")
            if left:
                broken.append(f"placements left after every job ended: {left}")
            if migs:
                broken.append(f"migrations left: {migs}")
        except Exception as e:  # noqa: BLE001
            broken.append(f"db read: {e}")
        print("INVARIANTS:", "HELD" if not broken else "BROKEN")
        for b in broken:
            print("  BROKEN:", b)
        return 1 if broken else 0

    def close(self) -> None:
        self.stop.set()
        # resume anything stopped, so SIGTERM works
        for name in HELPERS:
            with contextlib.suppress(Exception):
                self.c.signal(name, signal.SIGCONT)
        self.c.close()
        self.net.close()
        if self.pg is not None:
            self.pg.close()
        if self.args.keep:
            print(f"logs kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def print_schedule(a: argparse.Namespace) -> list[dict]:
    schedule = make_schedule(a.seed, a.minutes, a.jobs, a.pace, a.db, a.more)
    print(f"seed {a.seed} minutes {a.minutes} jobs {a.jobs} steps {a.steps} pace {a.pace} db {a.db} "
          f"more {a.more} schedule:")
    for ev in schedule:
        print("  ", json.dumps(ev))
    return schedule


def baseline(steps: int, tmp: Path) -> dict[str, bytes]:
    """The final variables of the same program run once, uninterrupted, without the shim."""
    path = tmp / f"baseline-{steps}.npz"
    if not path.exists():
        env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
        subprocess.run([sys.executable, feed_step_origin(), *FEED_ARGS, "--steps", str(steps), "--dump", str(path)],
                       env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=True, capture_output=True, timeout=300)
    return load_variables(path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--sleep", type=float, default=0.25)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--finish", type=float, default=240, help="seconds to wait for the jobs after the window")
    p.add_argument("--pace", type=float, default=1.0, help="scale the gaps between events (0.5: twice as many)")
    p.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite",
                   help="the scheduler's database; postgres: a private PostgreSQL 15 server of the run's own "
                   "(initdb under /tmp; needs /usr/lib/postgresql/15), also stopped and started as a fault")
    p.add_argument("--more", action="store_true",
                   help="also: kill mid-migration, helper restarted with another GPU count, scheduler killed "
                   "during a migration, a job crashing by itself (then resubmitted), grow-shrink jobs")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--dry", action="store_true", help="print the schedule only")
    args = p.parse_args()
    if args.dry:
        print_schedule(args)
        return 0
    if why := _skip_reason():
        print(why)
        return 2
    ch = Chaos(args)
    try:
        return ch.run()
    finally:
        ch.close()


if __name__ == "__main__":
    sys.exit(main())
