"""A multi-host cluster on one machine: the scheduler and each helper in its own
Linux network namespace, each with its own address on a private bridge that lives
in a namespace of its own (no traffic touches the machine's own network).

Faults: a host's link cut and restored (its veth on the bridge set down/up), a
process killed with -9. A sampler thread reads every job process's CPU time from
/proc throughout the test and records each moment two copies of one job trained at
once. Needs root (CI runs as root); elsewhere the tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .. import asking
from ..leases import remove_lease_folders
from ..tf_runtime.conftest import load_variables

# Every name this harness creates starts with this (namespaces, links, the bridge).
PREFIX = os.environ.get("GANDIVA_NETNS_PREFIX", "i9sched")
MAX_PREFIX = 9  # link names are PREFIX, a 4-digit token and 2 more characters; Linux allows 15
SUBNET = "10.77.0"
SUBNET6 = "fd00:77::"  # a unique local (ULA) prefix, for a cluster on IPv6 addresses only
SCHED_PORT = 50051
CHECKPOINT_INTERVAL_S = 2.0
DONE = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)


def _skip_reason() -> str | None:
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs these as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}-probe-{uuid.uuid4().hex[:4]}"
    made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def hostport(addr: str, port: int | str) -> str:
    """``addr:port``, an IPv6 address in brackets (``[fd00:77::1]:50051``)."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


class Net:
    """A bridge in its own namespace and one namespace per host, each on a veth pair.
    ``ipv6``: each host has an IPv6 address only (SUBNET6), no IPv4 one. ``names``: each
    host also has a name (``name_of``) that every host resolves through its own
    /etc/netns/NAMESPACE/hosts (`ip netns exec` mounts it over /etc/hosts)."""

    def __init__(self, ipv6: bool = False, names: bool = False) -> None:
        if len(PREFIX) > MAX_PREFIX:  # (`ip link add`: "... is not a valid ifname", in a CalledProcessError)
            raise ValueError(
                f"GANDIVA_NETNS_PREFIX={PREFIX!r} is {len(PREFIX)} characters, at most {MAX_PREFIX}: the harness's "
                f"link names (the prefix, a 4-digit token and 'br') must fit Linux's 15; give a shorter one, e.g. "
                f"{PREFIX[:MAX_PREFIX]!r}")
        self.ipv6, self.names = ipv6, names
        self.hosts: dict[str, tuple[str, str, str]] = {}  # name -> (netns, address, bridge-side link)
        self.made: list[str] = []  # namespaces to delete, made or not
        # Namespaces `ip netns add` has finished: their path is the namespace itself. While
        # it runs the path is first an empty file (its own inode), then mounted over.
        self.ready: list[str] = []
        self._inodes: set[int] = set()
        try:
            self._take_token()
            _ip("-n", self.bridge_ns, "link", "add", self.bridge, "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", self.bridge, "up")
        except BaseException:
            self.close()  # the fixture gets no Net to close: its namespace stayed for good
            raise

    def _take_token(self) -> None:
        """Draw the token every name of this Net holds, and make the bridge's namespace. Two
        tests of one prefix at the same time may draw the same 4 digits: `ip netns add` of a
        name that exists fails, and that namespace is the other test's (deleting it, with its
        close, cut that test's hosts off mid-test); another token is drawn. The bridge's
        namespace made holds the token for every other name of this Net."""
        for _ in range(32):
            self.tok = uuid.uuid4().hex[:4]
            self.bridge_ns = f"{PREFIX}-{self.tok}-br"
            self.bridge = f"{PREFIX}{self.tok}br"
            self.made.append(self.bridge_ns)
            try:
                _ip("netns", "add", self.bridge_ns)
            except subprocess.CalledProcessError as exc:
                if "File exists" not in (exc.stderr or ""):
                    raise
                self.made.remove(self.bridge_ns)  # another Net's: never this one's to delete
                continue
            self.ready.append(self.bridge_ns)
            return
        raise RuntimeError(f"no free namespace token of the prefix {PREFIX!r} in 32 draws: /run/netns is "
                           f"full of {PREFIX}-* namespaces (left by killed runs? `ip netns del` them)")

    def add_host(self, name: str) -> tuple[str, str]:
        """A host on the bridge: (its namespace, its address)."""
        i = len(self.hosts) + 1
        ns, addr = f"{PREFIX}-{self.tok}-{name}", f"{SUBNET6}{i}" if self.ipv6 else f"{SUBNET}.{i}"
        inside, outside = f"{PREFIX}{self.tok}{i}h", f"{PREFIX}{self.tok}{i}b"
        self.made.append(ns)
        _ip("netns", "add", ns)
        self.ready.append(ns)
        self.hosts[name] = (ns, addr, outside)
        _ip("link", "add", inside, "netns", ns, "type", "veth", "peer", "name", outside, "netns", self.bridge_ns)
        if self.ipv6:  # nodad: usable at once, not after duplicate address detection
            _ip("-n", ns, "addr", "add", f"{addr}/64", "dev", inside, "nodad")
        else:
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inside)
        _ip("-n", ns, "link", "set", inside, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.bridge_ns, "link", "set", outside, "master", self.bridge)
        _ip("-n", self.bridge_ns, "link", "set", outside, "up")
        if self.names:
            lines = "".join(f"{a} {self.name_of(h)}\n" for h, (_, a, _) in self.hosts.items())
            for host_ns, _, _ in self.hosts.values():  # every host knows the new one
                folder = Path("/etc/netns") / host_ns
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{lines}")
        return ns, addr

    def name_of(self, name: str) -> str:
        """The host's name, as the other hosts resolve it (with ``names``)."""
        return f"{name}-{self.tok}.gandiva.test"

    def reach(self, name: str) -> str:
        """How the others are told to reach the host: its name (``names``), else its address."""
        return self.name_of(name) if self.names else self.hosts[name][1]

    def link(self, name: str) -> str:
        """The host's own end of its veth pair (inside its namespace)."""
        return self.hosts[name][2][:-1] + "h"

    def cut(self, name: str) -> None:
        _ip("-n", self.bridge_ns, "link", "set", self.hosts[name][2], "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.bridge_ns, "link", "set", self.hosts[name][2], "up")

    def owns(self, pid: int) -> bool:
        """Whether the process lives in one of this test's namespaces (other tests, and
        other people's, may run the same harness on this machine at the same time)."""
        try:
            inode = int(os.readlink(f"/proc/{pid}/ns/net").split("[")[1].rstrip("]"))
        except (OSError, IndexError, ValueError):
            return False
        return inode in self.inodes

    @property
    def inodes(self) -> set[int]:
        # Only finished namespaces: a look while `ip netns add` ran took the inode of the
        # empty file it mounts over for good, and every process on that host went unseen
        # (CI: "the warm process was not seen within 60s"; 5 adds in 20 show that file).
        ready = list(self.ready)
        if len(self._inodes) < len(ready):
            self._inodes = {os.stat(f"/run/netns/{ns}").st_ino for ns in ready}
        return self._inodes

    def pids(self) -> list[int]:
        out: list[int] = []
        for ns in self.made:
            got = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True)
            out += [int(p) for p in got.stdout.split()]
        return out

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


PG_BIN = "/usr/lib/postgresql/15/bin"


class PgHost:
    """A PostgreSQL 15 server of the test's own on a host of its own ("db"): initdb in a
    temporary folder owned by postgres, listening on the host's address only (the
    machine's shared cluster, which the other tests use, is left alone). The scheduler's
    and the database's hosts know each other's link address for good (static neighbour
    entries), so a cut of the db host's link drops packets silently, as a partition or a
    host cut off behind a router does: connections hang, none is refused."""

    def __init__(self, net: Net, sched: str = "sched") -> None:
        if not Path(PG_BIN, "postgres").exists():
            pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN})")
        self.ns, self.addr = net.add_host("db")
        self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-pg-"))
        self.data = self.dir / "data"
        try:
            self._start(net, sched)
        except BaseException:
            # The fixture gets no PgHost to close: the server left running, its folder too.
            self.close()
            raise

    def _start(self, net: Net, sched: str) -> None:
        shutil.chown(self.dir, "postgres", "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "gandiva", "-E", "UTF8", "--no-sync")
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60", "-o",
                 f"-k {self.dir} -c listen_addresses={self.addr} -c fsync=off", "start", ns=self.ns)
        self.url = f"postgresql+asyncpg://gandiva@{self.addr}/postgres"
        for a, b in ((sched, "db"), ("db", sched)):
            (ns, _, _), (_, addr, _) = net.hosts[a], net.hosts[b]
            mac = subprocess.run(["ip", "-n", net.hosts[b][0], "-br", "link", "show", net.link(b)], check=True,
                                 capture_output=True, text=True).stdout.split()[2]
            _ip("-n", ns, "neigh", "replace", addr, "lladdr", mac, "dev", net.link(a), "nud", "permanent")

    def _pg(self, *argv: str, ns: str | None = None) -> None:
        cmd = " ".join(shlex.quote(a) for a in [f"{PG_BIN}/{argv[0]}", *argv[1:]])
        pre = ["ip", "netns", "exec", ns] if ns else []
        subprocess.run([*pre, "su", "postgres", "-c", cmd], check=True, capture_output=True, timeout=120, cwd="/")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


# Python 3.11's time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which
# libfaketime 0.9.10 breaks (EINVAL) when it leaves the monotonic clock alone
# (wolfcw/libfaketime#426). This waits with select()'s relative timeout instead; nothing
# else about the clocks is touched. Loaded by the helper and, through the sitecustomize
# chain of tf_runtime.autoload, by its jobs.
SLEEP_FIX = """
import os, select, time
if "faketime" in os.environ.get("LD_PRELOAD", ""):
    def _sleep(secs, _monotonic=time.monotonic, _select=select.select):
        if secs < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = _monotonic() + secs
        while (left := deadline - _monotonic()) > 0:
            _select([], [], [], left)
    time.sleep = _sleep
"""


def faketime_library() -> str | None:
    """libfaketime's multi-threaded variant (Debian package libfaketime), or None."""
    for pattern in ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                    "/usr/local/lib/faketime/libfaketimeMT.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


class WallClock:
    """One host's wall clock (CLOCK_REALTIME) moved for real by libfaketime, for every
    process that host runs (the helper, its jobs, gRPC's C core, TensorFlow), while its
    monotonic clock runs on untouched, as on a real jump (NTP stepping the clock, an
    operator's `date -s`). `set(offset)` moves it at any moment: the offset file is
    re-read every second (FAKETIME_CACHE_DURATION)."""

    def __init__(self, directory: Path) -> None:
        lib = faketime_library()
        if lib is None:
            why = ("libfaketime is not installed (Debian: apt-get install faketime libfaketime; "
                   "CI installs it): a helper's wall clock cannot be jumped")
            if os.environ.get("GANDIVA_REQUIRE_FAKETIME") == "1":
                pytest.fail(why)
            pytest.skip(why)
        self.lib = lib
        self.file = directory / "faketime.rc"
        self.site = directory / "faketime-site"
        self.site.mkdir(exist_ok=True)
        (self.site / "sitecustomize.py").write_text(SLEEP_FIX)
        self.set(0)

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.site), os.environ.get("PYTHONPATH", "")) if p)
        return {"LD_PRELOAD": self.lib, "FAKETIME_TIMESTAMP_FILE": str(self.file),
                "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "FAKETIME_DISABLE_SHM": "1", "PYTHONPATH": path}

    def set(self, offset_s: int) -> None:
        tmp = self.file.with_name(self.file.name + ".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, self.file)

    def offset_seen(self) -> float:
        """The wall clock's offset from the real one, as a process of that host sees it now."""
        before = time.time()
        out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                             env={**os.environ, **self.env()}, capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return float(out) - (before + time.time()) / 2

    @staticmethod
    def remove_shared_memory(pids: Sequence[int]) -> None:
        """libfaketime (0.9.10, FAKETIME_DISABLE_SHM or not) makes /dev/shm/faketime_shm_PID
        and sem.faketime_sem_PID in the first process it is loaded into (`ip netns exec`,
        which becomes the helper), for its children to share, and leaves them there when
        they end: one pair more in /dev/shm per host started under a WallClock, run after
        run. Remove those of these processes, once they and their children are gone."""
        for pid in pids:
            for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
                Path("/dev/shm", name).unlink(missing_ok=True)

    @staticmethod
    def loaded_in(pid: int) -> bool:
        """Whether libfaketime is mapped into that process."""
        try:
            return "libfaketime" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False


@dataclass
class Copy:
    """One process of a job, as /proc shows it."""

    job_id: str
    incarnation: str
    warm: bool
    cpu: int = 0             # utime + stime, clock ticks
    busy_runs: int = 0       # consecutive samples with CPU growth
    idle_runs: int = 0
    held: bool = False       # a warm process seen idle (holding before its first step)


@dataclass
class Sampler:
    """Samples every job process's CPU time; a copy is training when its CPU time grew
    over two consecutive samples (a pre-warmed process only once it held asleep first:
    warming up is not training). Records each sample where two copies trained."""

    interval_s: float = 0.2
    copies: dict[int, Copy] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    training_seen: dict[str, set[str]] = field(default_factory=dict)
    samples: int = 0
    owns: Callable[[int], bool] = lambda pid: True  # only processes of this test's hosts
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    @staticmethod
    def _read(pid: int) -> tuple[dict[str, str], int, str, str] | None:
        try:
            env = dict(
                kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in kv
            )
            if "GANDIVA_JOB_ID" not in env:
                return None
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        try:  # where its main thread sleeps ("" where the kernel does not say)
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        fields = stat.rsplit(")", 1)[1].split()
        return env, int(fields[11]) + int(fields[12]), fields[0], "" if wchan == "0" else wchan

    def sample(self) -> None:
        seen: set[int] = set()
        training: dict[str, list[str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid not in self.copies and not self.owns(pid):
                continue
            got = self._read(pid)
            if got is None:
                continue
            env, cpu, state, wchan = got
            if state == "Z":
                continue
            seen.add(pid)
            copy = self.copies.get(pid)
            if copy is None:
                copy = self.copies[pid] = Copy(env["GANDIVA_JOB_ID"], env.get("GANDIVA_INCARNATION", ""),
                                               env.get("GANDIVA_WARM") == "1", cpu)
                continue
            grew, copy.cpu = cpu > copy.cpu, cpu
            # Idle means asleep (a held copy blocks reading its control pipe: state S); a copy
            # that did not run because the loaded machine gave it no CPU is runnable (R) and
            # has not held, and its warm-up going on after is not training. Where the kernel
            # says where the main thread sleeps, a warm copy asleep elsewhere (waiting for the
            # scheduler's answer to its hello on a loaded machine) has not held either: such a
            # wait of 0.6 s, then its rehearsal, read as two copies training beside the source
            # (CI of 8273537, test_degraded_links.py -k 1_mbit).
            holding = state == "S" and (not wchan or "pipe" in wchan)
            copy.busy_runs, copy.idle_runs = ((copy.busy_runs + 1, 0) if grew
                                              else (0, copy.idle_runs + 1 if holding else 0))
            if copy.warm and copy.idle_runs >= 3:
                copy.held = True
            if copy.busy_runs >= 2 and (not copy.warm or copy.held):
                training.setdefault(copy.job_id, []).append(copy.incarnation)
                self.training_seen.setdefault(copy.job_id, set()).add(copy.incarnation)
        for pid in set(self.copies) - seen:
            del self.copies[pid]
        self.samples += 1
        for job_id, incs in training.items():
            if len(incs) > 1:
                self.violations.append(f"{time.strftime('%H:%M:%S')} job {job_id}: {len(incs)} copies training ({', '.join(incs)})")

    def cpu_of(self, job_id: str) -> dict[str, int]:
        """incarnation -> CPU ticks, for the job's live processes."""
        return {c.incarnation: c.cpu for c in list(self.copies.values()) if c.job_id == job_id}


class Cluster:
    """The scheduler on host "sched" and helpers on their own hosts, all real processes.
    The helpers' ramdisks sit side by side under one directory, each helper's shared
    root (as over NFS): a checkpoint written on one host is readable on the others."""

    def __init__(self, net: Net, tmp: Path, wait_for: Callable[..., object]) -> None:
        self.net, self.tmp, self._wait_for = net, tmp, wait_for
        self.sched_ns, self.sched_addr = net.add_host("sched")
        self.sock = tmp / "sched.sock"
        self.procs: dict[str, subprocess.Popen] = {}
        self.sampler = Sampler(owns=net.owns)
        self.channel: grpc.Channel | None = None
        self.heartbeat_timeout = 5.0
        self.db_url = f"sqlite+aiosqlite:///{tmp / 'state.db'}"  # benchmarks/chaos.py --db postgres sets another
        self.sched_args: list[str] = []  # more scheduler flags (chaos.py --more: --policy-option ...)
        self.pg: PgHost | None = None  # the database's host, if on one of its own
        self.faketime_pids: list[int] = []  # processes started under a WallClock

    # ---- processes -----------------------------------------------------------

    def _spawn(self, name: str, ns: str, argv: list[str], wrapper: Sequence[str] = (),
               env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *wrapper, sys.executable, "-m", "gandiva_cli.main", *argv],
                                stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
                                env={**os.environ, **(env or {})})
        log.close()
        self.procs[name] = proc
        if "faketime" in (env or {}).get("LD_PRELOAD", ""):
            self.faketime_pids.append(proc.pid)
        return proc

    def start_scheduler(self, heartbeat_timeout: float | None = None) -> None:
        heartbeat_timeout = self.heartbeat_timeout = heartbeat_timeout or self.heartbeat_timeout
        port_file = self.tmp / "sched.port"
        port_file.unlink(missing_ok=True)
        self.sock.unlink(missing_ok=True)
        self._spawn("scheduler", self.sched_ns, [
            "scheduler", "--listen", hostport(self.net.reach("sched"), SCHED_PORT), "--also-listen", f"unix:{self.sock}",
            "--db", self.db_url, "--tick", "0.2", "--quantum", "1000",
            "--heartbeat-interval", "0.5", "--heartbeat-timeout", str(heartbeat_timeout),
            "--checkpoint-interval", str(CHECKPOINT_INTERVAL_S),
            "--insecure",  # plaintext on the test's private bridge: no traffic leaves its namespaces
            "--port-file", str(port_file), *self.sched_args])
        self._wait_for(port_file.exists, 60)
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"unix:{self.sock}")
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def add_helper(self, name: str, gpus: int = 1, shared: bool = True, wrapper: Sequence[str] = (),
                   env: dict[str, str] | None = None, scheduler: str | None = None) -> None:
        """A helper on its own host. ``shared=False``: no shared root (checkpoints move by
        the gRPC stream); ``wrapper``: a command the helper runs under (unshare ...);
        ``env``: extra environment (its jobs inherit it); ``scheduler``: the address it
        (and its jobs) reach the scheduler at, if not the scheduler's own (a relay)."""
        ns = self.net.add_host(name)[0] if name not in self.net.hosts else self.net.hosts[name][0]
        self._spawn(name, ns, [
            "helper", "--server-name", name, "--gpus", str(gpus),
            "--scheduler", scheduler or hostport(self.net.reach("sched"), SCHED_PORT),
            "--listen", hostport(self.net.reach(name), 0), "--ramdisk", str(self.tmp / "rd" / name),
            *(["--shared-root", str(self.tmp / "rd")] if shared else []),
            "--log-dir", str(self.tmp / "logs"), "--insecure"], wrapper=wrapper, env=env)
        self._wait_for(lambda: self.server_up(name), 60)

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    # ---- the scheduler's view ---------------------------------------------------

    def servers(self) -> dict[str, bool]:
        return {s.name: s.up for s in self.stub.ListServers(scheduler_pb2.ListServersRequest()).servers}

    def server_up(self, name: str) -> bool:
        try:
            return self.servers().get(name, False)
        except grpc.RpcError:
            return False

    def job(self, job_id: str) -> common_pb2.Job:
        return self.stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=10)

    def submit(self, name: str, command: list[str], gpus: int = 1) -> str:
        spec = common_pb2.JobSpec(name=name, command=command, gpus=gpus, workdir=str(self.tmp), priority=1)
        return self.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id

    def where(self, job_id: str) -> str:
        job = self.job(job_id)
        return job.placement[0].server if job.placement and job.state == common_pb2.JOB_STATE_RUNNING else ""

    def migration_row(self, job_id: str) -> tuple[str, int] | None:
        """(phase, confirmed checkpoint step) of the job's migration as the scheduler's
        database holds it (read-only, straight from SQLite: also while the scheduler is
        stopped); None when there is none."""
        with contextlib.closing(sqlite3.connect(f"file:{self.tmp / 'state.db'}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT phase, step FROM migrations WHERE job_id = ?", (job_id,)).fetchone()
        return (str(row[0]), int(row[1])) if row else None

    def pids_of(self, job_id: str, warm: bool | None = None) -> list[int]:
        """The job's live processes the sampler knows (``warm``: only pre-warmed ones, or none)."""
        return [pid for pid, c in list(self.sampler.copies.items())
                if c.job_id == job_id and (warm is None or c.warm == warm)]

    def events(self, job_id: str) -> list[scheduler_pb2.Event]:
        return list(self.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events)

    def migrate(self, job_id: str, dest: str, within_s: float = 60,
                also: Callable[[grpc.RpcError], bool] = lambda err: False) -> float:
        """MigrateJob, asked again while the job is busy (a periodic checkpoint in flight)
        or ``also`` says so, as its user would; seconds it took to be taken (tests/asking.py)."""
        return asking.migrate(self.stub, job_id, dest, within_s, also)

    def wait(self, predicate: Callable[[], object], timeout: float) -> object:
        def safe() -> object:
            try:
                return predicate()
            except grpc.RpcError:  # the scheduler is restarting
                return None
        return self._wait_for(safe, timeout)

    def close(self) -> None:
        self.sampler.stop()
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                # A helper under a wrapper (unshare --fork) is the wrapper's child: stop it too.
                for pid in [proc.pid, *child_pids(proc.pid)]:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGTERM)
                        # One the test held (SIGSTOP) and failed before letting go handles its
                        # SIGTERM only once continued: it was waited for 15 s, then killed.
                        os.kill(pid, signal.SIGCONT)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        remove_lease_folders(self.tmp / "rd" / name for name in self.procs if name != "scheduler")
        # Job processes left behind (a helper killed with -9 takes its jobs with it by
        # the parent-death signal): whatever still runs in this test's namespaces, only.
        for pid in self.net.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        WallClock.remove_shared_memory(self.faketime_pids)  # (its jobs, which share them, gone too)
        if self.channel is not None:
            self.channel.close()


def child_pids(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# Set on a test's item when its setup or call failed: the multihost fixture keeps its logs.
_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


def _keep_if_failed(request, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """GANDIVA_KEEP_MULTIHOST_LOGS=DIR: a failed test's cluster folder (the scheduler's,
    helpers' and jobs' logs, state.db, ramdisks) is copied to DIR/TEST before it is removed.
    A flake under CI's load is rarely seen twice; its logs were gone with the folder."""
    keep = os.environ.get("GANDIVA_KEEP_MULTIHOST_LOGS", "")
    if keep in ("", "1") or not request.node.stash.get(_FAILED, False):
        return
    dest = Path(keep) / "".join(ch if ch.isalnum() or ch in "-_.[]" else "_" for ch in request.node.name)[:120]
    with contextlib.suppress(OSError):  # (sockets are not copied: only folders and files)
        shutil.copytree(tmp, dest, symlinks=True, dirs_exist_ok=True, ignore=lambda d, names: [
            n for n in names if not (os.path.isdir(os.path.join(d, n)) or os.path.isfile(os.path.join(d, n)))])
        print(f"multihost logs of this failed test copied to {dest}")


@pytest.fixture
def multihost(request, wait_for) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """The cluster; parametrize indirectly with {"heartbeat_timeout": S} to change the
    scheduler's heartbeat timeout (default 5 s, lease 3 s), {"postgres": True} for its
    database on a host of its own (`PgHost`, as ``cluster.pg``), {"ipv6": True} for hosts
    with IPv6 addresses only, {"names": True} for hosts given by name (`Net`), {"sched_args":
    [...]} for more scheduler flags."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # Short: unix socket paths are limited to 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    net: Net | None = None
    cluster = None
    pg: PgHost | None = None
    param = getattr(request, "param", {})
    try:
        net = Net(ipv6=param.get("ipv6", False), names=param.get("names", False))
        cluster = Cluster(net, tmp, wait_for)
        if param.get("postgres"):
            pg = cluster.pg = PgHost(net)
            cluster.db_url = pg.url
        cluster.sched_args = list(param.get("sched_args", []))
        cluster.start_scheduler(param.get("heartbeat_timeout", 5.0))
        cluster.sampler.start()
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        if pg is not None:
            pg.close()
        if net is not None:
            net.close()
        if os.environ.get("GANDIVA_KEEP_MULTIHOST_LOGS") != "1":
            _keep_if_failed(request, tmp)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"multihost logs kept in {tmp}")


@pytest.fixture
def mlp_command() -> Callable[..., list[str]]:
    import importlib.util

    origin = importlib.util.find_spec("tf_runtime.examples.mlp").origin  # type: ignore[union-attr]

    def command(steps: int, sleep: float = 0.03) -> list[str]:
        return ["python", str(origin), "--steps", str(steps), "--step-sleep", str(sleep), "--threads", "1"]

    return command


# ---- the feed_step family: final variables against an uninterrupted run -------------

FEED_ARGS = ["--loop", "session", "--optimizer", "momentum", "--replicas", "2", "--seed", "9"]


def feed_step_origin() -> str:
    import importlib.util

    return str(importlib.util.find_spec("tf_runtime.examples.feed_step").origin)  # type: ignore[union-attr]


def feed_command(steps: int, dump: Path, sleep: float = 0.03) -> list[str]:
    """A feed_step job (every mini-batch fed from the global step it read; momentum, two
    towers) that writes its final variables to `dump`."""
    return ["python", feed_step_origin(), *FEED_ARGS, "--steps", str(steps), "--step-sleep", str(sleep),
            "--dump", str(dump)]


_BASELINES: dict[int, dict[str, bytes]] = {}


def _baselines_dir(tmp: Path) -> Path:
    """Where this run's uninterrupted runs are kept, beside the test's own temporary
    folders (removed with them, 3 runs later): one folder for all of a run's pytest-xdist
    workers (pytest-N/popen-gwK/TEST; the multihost files go to different workers, and 8
    of them run 400 steps), else pytest-N/TEST."""
    run = tmp.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else tmp.parent
    path = run / "uninterrupted-runs"
    path.mkdir(exist_ok=True)
    return path


def uninterrupted_variables(steps: int, tmp: Path) -> dict[str, bytes]:
    """The final variables of the same program run once without any interruption (and
    without the shim: plain python), computed once per step count and run (the program is
    deterministic: that is what the tests check)."""
    if steps not in _BASELINES:
        import fcntl

        folder = _baselines_dir(tmp)
        dump = folder / f"baseline-{steps}.npz"
        with open(folder / f"baseline-{steps}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker computing it: wait for its file
            if not dump.exists():
                part = tmp / f"baseline-{steps}.npz"
                env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
                subprocess.run([sys.executable, feed_step_origin(), *FEED_ARGS, "--steps", str(steps),
                                "--dump", str(part)],
                               env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=True, capture_output=True,
                               timeout=300)
                shutil.copyfile(part, dump.with_suffix(".tmp"))
                os.replace(dump.with_suffix(".tmp"), dump)
        _BASELINES[steps] = load_variables(dump)
    return _BASELINES[steps]


def assert_bit_identical(dump: Path, steps: int, tmp: Path) -> None:
    got, base = load_variables(dump), uninterrupted_variables(steps, tmp)
    assert got.keys() == base.keys()
    differ = [k for k in base if got[k] != base[k]]
    assert differ == [], f"final variables differ from the uninterrupted run: {differ}"
