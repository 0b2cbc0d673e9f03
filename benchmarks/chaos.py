"""Seeded random faults over a real multi-host cluster (Linux network namespaces; root).

    nice -n 10 python benchmarks/chaos.py --seed 1 --minutes 3 [--jobs 5] [--pace 0.5] [--dry]

A scheduler (SQLite) and 3 helpers each in its own namespace, N feed_step jobs; over
--minutes a schedule generated from --seed (printed first, the same for the same seed)
of: link cuts (helper or scheduler side), helper SIGSTOP/SIGCONT, helper kill -9 and
restart, operator migrate, suspend/resume, scheduler kill -9 and restart. Then every
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
import contextlib
import json
import os
import random
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

DONE = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)
HELPERS = ["h1", "h2", "h3"]
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_schedule(seed: int, minutes: float, njobs: int, pace: float = 1.0) -> list[dict]:
    """A list of fault events: {t, kind, target, dur}, non-overlapping per target, at most
    two helpers faulted at once, all ended by the end of the window."""
    rng = random.Random(seed)
    end = minutes * 60
    busy: dict[str, float] = {}  # target -> time it is free again
    events: list[dict] = []
    t = rng.uniform(15, 25)  # let the jobs start
    kinds = ["cut_helper", "cut_sched", "stop_helper", "kill_helper", "migrate", "suspend", "kill_sched"]
    weights = [3, 1, 3, 2, 4, 2, 1]
    while t < end - 20:
        kind = rng.choices(kinds, weights)[0]
        dur = round(rng.uniform(2, 12), 1)
        if kind in ("cut_helper", "stop_helper", "kill_helper"):
            free = [h for h in HELPERS if busy.get(h, 0) <= t]
            faulted = sum(1 for h in HELPERS if busy.get(h, 0) > t)
            if not free or faulted >= 2:
                t += rng.uniform(2, 6)
                continue
            target = rng.choice(free)
            busy[target] = t + dur + 1
            events.append({"t": round(t, 1), "kind": kind, "target": target, "dur": dur})
        elif kind in ("cut_sched", "kill_sched"):
            if busy.get("sched", 0) > t:
                t += rng.uniform(2, 6)
                continue
            dur = round(rng.uniform(2, 8), 1)
            busy["sched"] = t + dur + 3
            events.append({"t": round(t, 1), "kind": kind, "target": "sched", "dur": dur})
        elif kind == "migrate":
            events.append({"t": round(t, 1), "kind": kind, "target": f"job{rng.randrange(njobs)}",
                           "dest": rng.choice(HELPERS), "dur": 0})
        elif kind == "suspend":
            events.append({"t": round(t, 1), "kind": kind, "target": f"job{rng.randrange(njobs)}", "dur": dur})
        t += rng.uniform(3, 10) * pace
    return events


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
        self.net = Net()
        self.c = Cluster(self.net, self.tmp, _wait_for)
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
            "helper", "--server-name", name, "--gpus", str(self.args.gpus), "--scheduler",
            f"{self.c.sched_addr}:{SCHED_PORT}", "--listen", f"{addr}:0", "--ramdisk", str(self.tmp / "rd" / name),
            "--shared-root", str(self.tmp / "rd"), "--log-dir", str(self.tmp / "logs"), "--insecure"])

    def db_sampler(self) -> None:
        """Every 0.5 s: each GPU's holders in the database (placements + migration reservations)."""
        while not self.stop.wait(0.5):
            try:
                with contextlib.closing(sqlite3.connect(f"file:{self.tmp / 'state.db'}?mode=ro", uri=True, timeout=2)) as db:
                    db.execute("BEGIN")  # one snapshot
                    holders: dict[tuple[str, int], set[str]] = {}
                    per_job: dict[str, int] = {}
                    for job_id, server, gpu in db.execute("SELECT job_id, server_name, gpu_index FROM placements"):
                        holders.setdefault((server, gpu), set()).add(job_id)
                        per_job[job_id] = per_job.get(job_id, 0) + 1
                    ngpus = {n: k for n, k in db.execute("SELECT name, num_gpus FROM servers")}
                    jobs = {j: (s, g) for j, s, g in db.execute("SELECT id, state, gpus FROM jobs")}
            except sqlite3.Error as e:
                self.db_errors.append(str(e))
                continue
            now = time.strftime('%H:%M:%S')
            for (server, gpu), js in holders.items():
                running = sorted(j for j in js if jobs.get(j, ("", 0))[0] == "RUNNING")
                if len(running) > 1:
                    self.gpu_running2.add(f"{server}/{gpu}: {running}")
                if gpu >= ngpus.get(server, 0):
                    self.gpu_shared.append(f"{now} {server}/{gpu} beyond its {ngpus.get(server)} GPUs: {sorted(js)}")
            for j, n in per_job.items():
                state, want = jobs.get(j, ("?", 0))
                if state in ("SUCCEEDED", "FAILED", "KILLED", "QUEUED"):
                    self.gpu_shared.append(f"{now} {j} {state} holds {n} GPU(s)")
                elif n != want:
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
        log(f"  helper {name} restarted")
        self.spawn_helper(name)

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
            try:
                jid, dest = self.pick_migration(target, ev["dest"])
            except grpc.RpcError as e:
                log(f"  migrate: {e.code().name}")
                return
            if jid is None:
                log("  migrate: no running job")
                return
            try:
                j = self.c.stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=jid, to_server=dest), timeout=10)
                log(f"  migrate {jid} -> {dest}: {common_pb2.JobState.Name(j.state)}")
            except grpc.RpcError as e:
                log(f"  migrate {jid} -> {dest}: {e.code().name} {e.details()[:200]}")
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

    def submit_all(self) -> None:
        origin = feed_step_origin()
        for i in range(self.args.jobs):
            dump = self.tmp / f"final{i}.npz"
            cmd = ["python", origin, *FEED_ARGS, "--steps", str(self.args.steps), "--step-sleep",
                   str(self.args.sleep), "--dump", str(dump)]
            self.jobs[f"job{i}"] = self.c.submit(f"job{i}", cmd)
            self.dumps[f"job{i}"] = dump

    def run(self) -> int:
        a = self.args
        schedule = print_schedule(a)
        base = baseline(a.steps, self.tmp)
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
        while time.monotonic() < deadline and len(final) < len(self.jobs):
            for name, jid in self.jobs.items():
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

    def check(self, final: dict[str, common_pb2.Job], base: dict[str, bytes]) -> int:
        broken: list[str] = []
        for name, jid in self.jobs.items():
            j = final.get(name)
            if j is None:
                with contextlib.suppress(grpc.RpcError):
                    j = self.c.job(jid)
                broken.append(f"{name} ({jid}) did not end: {common_pb2.JobState.Name(j.state) if j else '?'} "
                              f"{j.message if j else ''}")
                continue
            states = [common_pb2.JobState.Name(t.to_state).removeprefix("JOB_STATE_") for t in j.history]
            ends = [s for s in states if s in ("SUCCEEDED", "FAILED", "KILLED")]
            log(f"{name}: {common_pb2.JobState.Name(j.state)} steps {j.steps} history {states} msg {j.message!r}")
            if j.state != common_pb2.JOB_STATE_SUCCEEDED or ends != ["SUCCEEDED"]:
                broken.append(f"{name} ended {ends} ({j.message})")
            if j.steps != self.args.steps:
                broken.append(f"{name} steps {j.steps} != {self.args.steps}")
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
        broken += [f"two copies: {v}" for v in s.violations]
        broken += [f"GPU in DB: {v}" for v in self.gpu_shared[:20]]
        log(f"(info) GPUs seen with two RUNNING jobs (packs): {sorted(self.gpu_running2)}; db read errors {len(self.db_errors)}")
        try:
            with contextlib.closing(sqlite3.connect(f"file:{self.tmp / 'state.db'}?mode=ro", uri=True)) as db:
                left = db.execute("SELECT job_id, server_name, gpu_index FROM placements").fetchall()
                migs = db.execute("SELECT job_id, phase FROM migrations").fetchall()
            if left:
                broken.append(f"placements left after every job ended: {left}")
            if migs:
                broken.append(f"migrations left: {migs}")
        except sqlite3.Error as e:
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
        if self.args.keep:
            print(f"logs kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def print_schedule(a: argparse.Namespace) -> list[dict]:
    schedule = make_schedule(a.seed, a.minutes, a.jobs, a.pace)
    print(f"seed {a.seed} minutes {a.minutes} jobs {a.jobs} steps {a.steps} pace {a.pace} schedule:")
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
