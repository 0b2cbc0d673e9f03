"""The choreography of `gandiva demo`: submit, watch, suspend/resume, migrate, report."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.cli.client import TERMINAL_STATES, state_name


def _example(name: str) -> str:
    """The path of a shipped example program (located without importing TensorFlow)."""
    import importlib.util

    spec = importlib.util.find_spec(f"tf_runtime.examples.{name}")
    if spec is None or not spec.origin:
        raise RuntimeError(f"tf_runtime.examples.{name} is not installed")
    return spec.origin


class DemoRun:
    def __init__(self, address: str, servers: list[str], steps: int, run_dir: Path, console: Console) -> None:
        self.address = address
        self.servers = servers
        self.steps = steps
        self.run_dir = run_dir
        self.console = console
        self.channel = grpc.insecure_channel(address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.ids: list[str] = []

    # ---- helpers ---------------------------------------------------------------

    def _spec(self, name: str, gpus: int, *extra: str) -> common_pb2.JobSpec:
        return common_pb2.JobSpec(
            name=name,
            command=["python", _example("mlp"), "--steps", str(self.steps),
                     "--step-sleep", "0.05", "--replicas", str(gpus), *extra],
            workdir=str(self.run_dir),
            gpus=gpus,
            priority=1,
        )

    def jobs(self) -> list[common_pb2.Job]:
        wanted = set(self.ids)
        return [j for j in self.stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs if j.id in wanted]

    def table(self, note: str) -> Table:
        t = Table(title=note, title_justify="left")
        for col in ("job", "name", "state", "gpus", "servers", "steps", "rate/s"):
            t.add_column(col)
        for j in self.jobs():
            servers = ",".join(sorted({g.server for g in j.placement})) or "-"
            t.add_row(j.id, j.spec.name, state_name(j.state), str(j.spec.gpus), servers, str(j.steps), f"{j.rate:.1f}")
        return t

    def watch(self, live: Live, note: str, until, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs()
            live.update(self.table(note))
            if until(jobs):
                return True
            if any(j.state == common_pb2.JOB_STATE_FAILED for j in jobs):
                return False
            time.sleep(0.5)
        return False

    # ---- the story -------------------------------------------------------------

    def play(self, timeout: float) -> bool:
        c = self.console
        t_end = time.monotonic() + timeout
        deadline = time.monotonic() + 120
        while True:
            try:
                up = [s for s in self.stub.ListServers(scheduler_pb2.ListServersRequest()).servers if s.up and s.name in self.servers]
            except grpc.RpcError:
                up = []
            if len(up) == len(self.servers):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("helpers did not register within 120s; see helper-*.log")
            time.sleep(0.3)

        c.print("[bold]3/6[/] submitting real TensorFlow jobs (an MLP; 1, 2 and a 2-member sweep)")
        for name, gpus in (("mlp-a", 1), ("mlp-b", 1), ("mlp-2gpu", 2)):
            self.ids.append(self.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=self._spec(name, gpus))).job.id)
        sweep = [self._spec("sweep", 1, "--lr", lr) for lr in ("0.01", "0.1")]
        for i, s in enumerate(sweep):
            s.index, s.params["lr"] = i, ("0.01", "0.1")[i]
        resp = self.stub.SubmitMultiJob(scheduler_pb2.SubmitMultiJobRequest(name="sweep", jobs=sweep))
        self.ids.extend(j.id for j in resp.jobs)
        first, second = self.ids[0], self.ids[1]

        with Live(self.table("starting"), console=c, refresh_per_second=4) as live:
            if not self.watch(live, "placed by the Gandiva policy; TensorFlow starting",
                              lambda js: all(j.steps >= 20 for j in js), max(1.0, t_end - time.monotonic())):
                c.print("[red]jobs did not start training in time[/]")
                return False

            c.print(f"[bold]4/6[/] suspending {second} at its next mini-batch boundary, then resuming it")
            self.stub.SuspendJob(scheduler_pb2.JobActionRequest(id=second, reason="demo"))
            frozen = self.stub.GetJob(scheduler_pb2.GetJobRequest(id=second)).steps
            self.watch(live, "suspended (its GPU memory would be released)", lambda js: False, 3.0)
            after = self.stub.GetJob(scheduler_pb2.GetJobRequest(id=second)).steps
            self.stub.ResumeJob(scheduler_pb2.JobActionRequest(id=second, reason="demo"))
            c.print(f"     steps while suspended: {frozen} -> {after}")

            src = {g.server for g in self.stub.GetJob(scheduler_pb2.GetJobRequest(id=first)).placement}
            dest = next((s for s in self.servers if s not in src), None)
            if dest:
                c.print(f"[bold]5/6[/] migrating {first} to {dest} (pre-warmed destination, checkpoint in the ramdisk)")
                self.stub.MigrateJob(scheduler_pb2.MigrateJobRequest(id=first, to_server=dest))
                time.sleep(0.5)
                self.watch(live, f"migrating {first} to {dest}",
                           lambda js: any(j.id == first and j.state != common_pb2.JOB_STATE_MIGRATING for j in js), 180)
                for ev in self.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=first)).events:
                    if ev.kind in ("job.migration", "job.state"):
                        c.print(f"     {ev.kind:<14} {ev.message}")
            ok = self.watch(live, "training to the end", lambda js: all(j.state in TERMINAL_STATES for j in js),
                            max(1.0, t_end - time.monotonic()))

        c.print("[bold]6/6[/] the cluster view (gandiva get servers / gandiva get jobs)")
        env_cmd = [sys.executable, "-m", "scheduler.cli.main"]
        for what in ("servers", "jobs"):
            subprocess.run([*env_cmd, "get", what, "--scheduler", self.address], check=False)
        jobs = self.jobs()
        done = sum(j.state == common_pb2.JOB_STATE_SUCCEEDED for j in jobs)
        c.print(f"{done}/{len(jobs)} jobs succeeded")
        return ok and done == len(jobs)
