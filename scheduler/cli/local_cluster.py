"""A scheduler and helpers as local processes, as `gandiva demo` and the benchmarks run them.

Each is a separate process talking gRPC over loopback, exactly as on a real cluster; the
helpers use virtual GPUs and a ramdisk under /dev/shm. Logs go to ``run_dir``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]


# What `gandiva scheduler` says when its --listen address is taken (transport.add_port).
IN_USE = "cannot listen there"


def wait_file(path: Path, proc: subprocess.Popen, what: str, timeout: float = 60, log: Path | None = None) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            # Its last line says why (`gandiva demo --http-listen 0.0.0.0:9100`: "refusing
            # --http-listen ... without --auth token ..."); before, only "see its log".
            said = ""
            with contextlib.suppress(OSError):
                said = (log.read_text(errors="replace").strip().splitlines() or [""])[-1] if log else ""
            raise RuntimeError(f"{what} exited with status {proc.returncode}: {said[:500] or 'see its log'}"
                               + (f" ({log})" if log else ""))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout:.0f}s")
        time.sleep(0.1)
    return path.read_text().strip()


@dataclass
class LocalCluster:
    run_dir: Path
    db: str
    servers: Sequence[str]
    gpus: int
    scheduler_args: Sequence[str] = ()
    http_listen: str = "127.0.0.1:0"
    port: int = 0
    # With a `port` taken when the scheduler binds it, a free one instead (said in ``note``).
    # `gandiva demo` checked that 50051 was free, then its scheduler bound it a moment later:
    # anything that took it meanwhile failed the demo. Now the scheduler's own bind decides.
    port_fallback: bool = False
    note: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    address: str = ""
    http: str = ""

    def start_scheduler(self) -> str:
        """Start the scheduler; its gRPC address (``http`` is set too)."""
        port_file, http_file = self.run_dir / "scheduler.addr", self.run_dir / "http.addr"
        log_path = self.run_dir / "scheduler.log"
        try:
            self.address = self._scheduler_at(self.port, port_file, http_file, log_path, "w")
        except RuntimeError as err:
            if not (self.port_fallback and self.port and IN_USE in str(err)):
                raise
            self.procs.pop(0)  # it exited, saying so
            self.note = f"port {self.port} is in use: the scheduler listens on a free port instead"
            self.address = self._scheduler_at(0, port_file, http_file, log_path, "a")
        self.http = wait_file(http_file, self.procs[0], "the scheduler's HTTP server", log=log_path)
        return self.address

    def _scheduler_at(self, port: int, port_file: Path, http_file: Path, log_path: Path, mode: str) -> str:
        """Start the scheduler (the first of ``procs``) listening on `port` (0: a free one);
        its address once bound."""
        # The child keeps its own copy of the log descriptor.
        with open(log_path, mode) as log:
            self.procs.insert(0, subprocess.Popen(
                [*GANDIVA, "scheduler", "--listen", f"127.0.0.1:{port}", "--db", self.db,
                 "--port-file", str(port_file), "--http-listen", self.http_listen,
                 "--http-port-file", str(http_file), *self.scheduler_args],
                stdout=log, stderr=subprocess.STDOUT))
        return wait_file(port_file, self.procs[0], "the scheduler", log=log_path)

    def start_helpers(self, env: dict[str, str] | None = None) -> None:
        env = {**(env or os.environ), "GANDIVA_SCHEDULER": self.address}
        for name in self.servers:
            with open(self.run_dir / f"helper-{name}.log", "w") as log:
                self.procs.append(subprocess.Popen(
                    [*GANDIVA, "helper", "--server-name", name, "--gpus", str(self.gpus), "--virtual",
                     "--ramdisk", str(self.ramdisk(name)),
                     "--log-dir", str(self.run_dir / "logs" / name)],
                    stdout=log, stderr=subprocess.STDOUT, env=env))

    def wait_for_helpers(self, timeout: float = 120) -> None:
        """Until every helper has registered and is up (the scheduler may still be starting)."""
        import grpc

        from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc

        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while time.monotonic() < deadline:
                try:
                    up = {s.name for s in stub.ListServers(scheduler_pb2.ListServersRequest()).servers if s.up}
                except grpc.RpcError:
                    up = set()
                if up.issuperset(self.servers):
                    return
                time.sleep(0.3)
        raise RuntimeError(f"helpers did not register within {timeout:.0f}s; see helper-*.log")

    def ramdisk(self, name: str) -> Path:
        return Path("/dev/shm") / f"gandiva-local-{name}-{os.getpid()}"

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        """Stop the processes it started, then remove its helpers' ramdisks: every `gandiva
        demo` left two behind in /dev/shm (RAM), with the checkpoints in them (40 found after
        a day's runs). Nothing when its processes were left running (``--keep``: procs cleared)."""
        if not self.procs:
            return
        stop_processes(self.procs[::-1])
        self.procs.clear()
        for name in self.servers:
            shutil.rmtree(self.ramdisk(name), ignore_errors=True)


def stop_processes(procs: Sequence[subprocess.Popen], grace_s: float = 15) -> None:
    """SIGTERM each, in order; then wait for each, killing any still there after ``grace_s``."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
