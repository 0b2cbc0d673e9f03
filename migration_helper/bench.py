"""The migration latency benchmark: real TensorFlow jobs on two local helpers,
migrated back and forth by the fast path and by the naive path.

Fast path: migration_protocol.fast_path.migrate() (pre-warmed destination, checkpoint
into its ramdisk through the shared mount, or streamed with --transfer stream).
Naive path: stop-for-migration into a checkpoint in the destination's ramdisk, then a cold start at the
destination (import TensorFlow, rebuild the graph, create the session), restore,
first step. Both are timed from the stop command to the first step done at the
destination; pre-warming is reported apart, since the job trains meanwhile.

The helpers run in this process (the real daemon code, each with its own ramdisk);
the jobs are real processes under the tf_runtime shim; a LocalControl stands in for
the scheduler's Helper and Runtime services.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import tf_runtime.examples
from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl
from migration_protocol.fast_path import MigrationPlan, Outcome, migrate
from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2

log = logging.getLogger(__name__)

MODELS = ("mlp", "resnet50", "vgg16")
REPLICAS = (1, 2, 4, 8)
PATHS = ("fast", "naive")
PHASES = ("wait_boundary", "save", "transfer", "cold_start", "restore", "first_step")


@dataclass(frozen=True)
class BenchConfig:
    models: tuple[str, ...] = MODELS
    replicas: tuple[int, ...] = REPLICAS
    repeats: int = 3
    out_dir: Path = Path("bench-migration")
    transfer: str = "shared"  # or "stream"
    warmup_steps: int = 3     # steps the job runs at its new home before the next move
    job_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [m for m in self.models if m not in MODELS]
        if bad:
            raise ValueError(f"--models: unknown {', '.join(bad)} (choose from {', '.join(MODELS)})")
        if not self.models:  # `--models ""` was blamed on --replicas
            raise ValueError(f"--models: none given; choose from {', '.join(MODELS)}")
        if not self.replicas or any(r < 1 or r & (r - 1) for r in self.replicas):
            raise ValueError("--replicas: powers of two, at least one")
        if self.repeats < 1:
            raise ValueError("--repeats: at least 1")
        if self.transfer not in ("shared", "stream"):
            raise ValueError("--transfer: shared or stream")


@dataclass
class Measurement:
    model: str
    replicas: int
    path: str
    repeat: int
    total_s: float
    phases: dict[str, float] = field(default_factory=dict)
    prewarm_s: float = 0.0
    step: int = 0


class MigrationBench:
    def __init__(self, config: BenchConfig, on_result: Callable[[Measurement], None]) -> None:
        self.config = config
        self.on_result = on_result
        self.control = LocalControl(heartbeat_interval_s=1.0)
        self.helpers: list[HelperDaemon] = []
        self.run_id = uuid.uuid4().hex[:6]

    async def __aenter__(self) -> Self:
        await self.control.start()
        out = self.config.out_dir.resolve()
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else out
        self.ramdisks = shm / f"gandiva-bench-{self.run_id}"
        for name in ("bench-a", "bench-b"):
            daemon = HelperDaemon(HelperConfig(
                server_name=name, scheduler=self.control.address, ramdisk=self.ramdisks / name,
                shared_root=self.ramdisks if self.config.transfer == "shared" else None,
                log_dir=out / "logs", sample_interval_s=5.0, report_interval_s=30.0),
                CpuBackend(8, name))
            await daemon.start()
            self.helpers.append(daemon)
        await self.control.wait_for(lambda: len(self.control.servers) == 2, 30, "the helpers to register")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for daemon in self.helpers:
            await daemon.stop()
        await self.control.stop()
        shutil.rmtree(self.ramdisks, ignore_errors=True)

    def spec(self, model: str, replicas: int) -> common_pb2.JobSpec:
        script = Path(tf_runtime.examples.__file__).parent / f"{model}.py"
        return common_pb2.JobSpec(
            name=f"bench-{model}", gpus=replicas, workdir=str(self.config.out_dir.resolve()),
            command=["python", str(script), "--replicas", str(replicas), "--steps", str(10**9),
                     *self.config.job_args])

    async def run_model(self, model: str, replicas: int) -> None:
        """One job, moved back and forth: each repeat is one fast and one naive move."""
        job = f"{model}-r{replicas}-{self.run_id}"
        spec = self.spec(model, replicas)
        servers = ["bench-a", "bench-b"]
        incarnation = uuid.uuid4().hex[:8]
        gpus = list(range(replicas))
        first = await self.control.helper_command(servers[0], helper_pb2.HelperCommand(
            launch=helper_pb2.LaunchJob(job_id=job, incarnation=incarnation, spec=spec,
                                        gpu_indices=gpus, wait_first_step=True)), 900)
        if not first.ok:
            raise RuntimeError(f"{model} x{replicas} did not start: {first.message}")
        here = 0
        try:
            for repeat in range(self.config.repeats):
                for path in PATHS:
                    await self._let_it_train(job, incarnation)
                    src, dst = servers[here], servers[1 - here]
                    if path == "fast":
                        m, incarnation = await self._fast(job, spec, incarnation, src, dst, gpus)
                    else:
                        m, incarnation = await self._naive(job, spec, incarnation, src, dst, gpus)
                    here = 1 - here
                    m.model, m.replicas, m.repeat = model, replicas, repeat
                    self.on_result(m)
        finally:
            await self.control.helper_command(servers[here], helper_pb2.HelperCommand(
                stop=helper_pb2.StopJob(job_id=job, reason="benchmark done")), 120)

    async def _let_it_train(self, job: str, incarnation: str) -> None:
        # A migration right after a start would measure a process still settling.
        await self.control.wait_for(lambda: self.control.connected(job, incarnation), 300,
                                    f"{job} to connect")
        start = max(0, self.control.steps(job, incarnation))
        await self.control.wait_for(
            lambda: self.control.steps(job, incarnation) >= start + self.config.warmup_steps, 300,
            f"{job} to train")

    async def _fast(self, job: str, spec: common_pb2.JobSpec, incarnation: str, src: str, dst: str,
                    gpus: list[int]) -> tuple[Measurement, str]:
        plan = MigrationPlan(job_id=job, spec=spec, source=self.control.endpoint(src),
                             source_incarnation=incarnation, source_gpus=tuple(gpus),
                             dest=self.control.endpoint(dst), dest_gpus=tuple(gpus),
                             warm_signature=self.control.train_signature(job, incarnation))
        result = await migrate(plan, self.control)
        if result.outcome is not Outcome.MIGRATED:
            raise RuntimeError(f"fast migration of {job} failed: {result.outcome.value}: {result.reason}")
        d = result.durations_s
        phases = {p: d.get(p, 0.0) for p in PHASES}
        return Measurement("", 0, "fast", 0, d["total"], phases, d.get("prewarm", 0.0), result.step), \
            result.incarnation

    async def _naive(self, job: str, spec: common_pb2.JobSpec, incarnation: str, src: str, dst: str,
                     gpus: list[int]) -> tuple[Measurement, str]:
        # In the destination helper's ramdisk: a helper restores only from its ramdisk or
        # shared root (the fast path's checkpoint lies there too, so the paths compare).
        ckpt = self.ramdisks / dst / job / f"naive-{uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        ack = await self.control.runtime_command(job, incarnation, runtime_pb2.RuntimeCommand(
            command_id=uuid.uuid4().hex, kind=runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION,
            checkpoint_dir=str(ckpt), reason="naive migration"), 300)
        if not ack.ok:
            raise RuntimeError(f"naive stop of {job} failed: {ack.message}")
        new = uuid.uuid4().hex[:8]
        started = await self.control.helper_command(dst, helper_pb2.HelperCommand(
            launch=helper_pb2.LaunchJob(job_id=job, incarnation=new, spec=spec, gpu_indices=gpus,
                                        restore_checkpoint=ack.checkpoint_path or str(ckpt),
                                        wait_first_step=True)), 900)
        total = time.monotonic() - t0
        if not started.ok:
            raise RuntimeError(f"naive restart of {job} failed: {started.message}")
        if started.step != ack.step:
            raise RuntimeError(f"naive restart of {job} restored step {started.step}, saved {ack.step}")
        shutil.rmtree(ckpt, ignore_errors=True)  # restored; VGG16 checkpoints are 0.5 GB each
        d = started.durations_s
        phases = {p: 0.0 for p in PHASES}
        phases["wait_boundary"] = ack.durations_s.get("wait_boundary", 0.0)
        phases["save"] = ack.durations_s.get("save", 0.0)
        phases["cold_start"] = d.get("startup", 0.0)
        phases["restore"] = d.get("restore", 0.0)
        phases["first_step"] = max(0.0, d.get("first_step_total", 0.0) - phases["cold_start"] - phases["restore"])
        return Measurement("", 0, "naive", 0, total, phases, 0.0, ack.step), new


async def run_bench(config: BenchConfig, on_result: Callable[[Measurement], None],
                    on_config: Callable[[str, int], None] | None = None) -> None:
    async with MigrationBench(config, on_result) as bench:
        for model in config.models:
            for replicas in config.replicas:
                if on_config is not None:
                    on_config(model, replicas)
                await bench.run_model(model, replicas)
