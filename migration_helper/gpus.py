"""GPU discovery and sampling backends: NVML on NVIDIA servers, a CPU stand-in elsewhere.

Both take the jobs running here (job id -> process ids and GPU indices) and return
one device-level sample per GPU plus one per (job, GPU) with the job's memory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_total_bytes: int


@dataclass(frozen=True)
class JobProcesses:
    """What a backend needs to attribute usage to a job."""

    pids: frozenset[int]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Sample:
    gpu_index: int
    at: float
    memory_used_bytes: int
    utilization: float
    job_id: str = ""
    job_memory_bytes: int = 0


class GpuBackend(Protocol):
    """The seam between the helper and the hardware."""

    name: str

    def gpus(self) -> list[GpuInfo]: ...

    def sample(self, jobs: Mapping[str, JobProcesses]) -> list[Sample]: ...

    def close(self) -> None: ...


def process_tree(pid: int) -> frozenset[int]:
    """The pid and its live descendants (a job's launcher may fork workers)."""
    import psutil  # here, not at the top: the NVML check script runs where psutil may be absent

    try:
        proc = psutil.Process(pid)
        return frozenset([pid, *(c.pid for c in proc.children(recursive=True))])
    except psutil.Error:
        return frozenset()


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver (or no GPU) here; the message says why."""


class NvmlBackend:
    """Real GPUs through nvidia-ml-py: device memory and utilization, and each
    job's memory from the driver's per-process accounting."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # the package is a dependency, but be explicit
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not start (no NVIDIA driver?): {exc}") from exc
        self._nvml: Any = pynvml
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable("NVML found no GPU")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._last_util_ts = [0] * count

    def gpus(self) -> list[GpuInfo]:
        nv = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            name = nv.nvmlDeviceGetName(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            out.append(
                GpuInfo(
                    index=i,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    model=name.decode() if isinstance(name, bytes) else str(name),
                    memory_total_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                )
            )
        return out

    def _process_memory(self, handle: Any) -> dict[int, int]:
        nv = self._nvml
        used: dict[int, int] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(nv, getter)(handle)
            except nv.NVMLError:
                continue
            for p in procs:
                # usedGpuMemory is None where the driver cannot account per process (e.g. MIG).
                used[int(p.pid)] = used.get(int(p.pid), 0) + int(p.usedGpuMemory or 0)
        return used

    def sample(self, jobs: Mapping[str, JobProcesses]) -> list[Sample]:
        nv = self._nvml
        now = time.time()
        out: list[Sample] = []
        for i, h in enumerate(self._handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            util = nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
            out.append(Sample(i, now, int(mem.used), util))
            per_pid = self._process_memory(h)
            for job_id, jp in jobs.items():
                job_bytes = sum(b for pid, b in per_pid.items() if pid in jp.pids)
                if job_bytes or i in jp.gpu_indices:
                    out.append(Sample(i, now, int(mem.used), util, job_id, job_bytes))
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down a driver that went away is not worth failing over
            log.debug("nvmlShutdown failed", exc_info=True)


class CpuBackend:
    """Virtual GPUs for machines without NVIDIA hardware: a GPU is a slot; a job's
    'GPU memory' is its processes' RSS and its 'utilization' their CPU share."""

    name = "cpu"

    def __init__(self, count: int, server: str = "local") -> None:
        import psutil

        self._psutil = psutil
        if count < 1:
            raise ValueError(f"virtual GPU count must be at least 1, got {count}")
        self._count = count
        self._server = server
        self._procs: dict[int, Any] = {}  # pid -> psutil.Process

    def gpus(self) -> list[GpuInfo]:
        per_gpu = self._psutil.virtual_memory().total // self._count
        return [
            GpuInfo(i, f"virtual-{self._server}-{i}", "virtual", int(per_gpu))
            for i in range(self._count)
        ]

    def _usage(self, pids: Iterable[int]) -> tuple[int, float]:
        rss, cpu = 0, 0.0
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    # The first cpu_percent() call only primes the counter and reads 0.
                    proc = self._procs[pid] = self._psutil.Process(pid)
                    proc.cpu_percent(None)
                rss += proc.memory_info().rss
                cpu += proc.cpu_percent(None)
            except self._psutil.Error:
                self._procs.pop(pid, None)
        return rss, cpu

    def sample(self, jobs: Mapping[str, JobProcesses]) -> list[Sample]:
        now = time.time()
        by_gpu: dict[int, list[tuple[str, int, float]]] = {i: [] for i in range(self._count)}
        live: set[int] = set()
        for job_id, jp in jobs.items():
            live |= jp.pids
            rss, cpu = self._usage(jp.pids)
            gpus = [g for g in jp.gpu_indices if g in by_gpu] or [0]
            for g in gpus:
                # Split the job's usage evenly over its slots, as data parallelism would.
                by_gpu[g].append((job_id, rss // len(gpus), cpu / 100.0 / len(gpus)))
        for pid in list(self._procs):
            if pid not in live:
                del self._procs[pid]
        out: list[Sample] = []
        for g, entries in by_gpu.items():
            used = sum(e[1] for e in entries)
            util = min(1.0, sum(e[2] for e in entries))
            out.append(Sample(g, now, used, util))
            out.extend(Sample(g, now, used, util, job, rss) for job, rss, _ in entries)
        return out

    def close(self) -> None:
        self._procs.clear()


def open_backend(gpus: int | None, server: str, force_virtual: bool = False) -> GpuBackend:
    """NVML where a driver answers, else ``gpus`` virtual GPUs (default 4).

    ``force_virtual`` (``gandiva helper --virtual``, or GANDIVA_FORCE_VIRTUAL_GPUS=1)
    keeps NVML out even where a driver exists, e.g. to run several helpers on one box.
    """
    from migration_helper.config import DEFAULT_VIRTUAL_GPUS

    count = gpus or DEFAULT_VIRTUAL_GPUS
    if not force_virtual and os.environ.get("GANDIVA_FORCE_VIRTUAL_GPUS") != "1":
        try:
            backend = NvmlBackend()
            log.info("NVML: %d GPU(s); --gpus applies to virtual GPUs only", len(backend.gpus()))
            return backend
        except NvmlUnavailable as exc:
            log.info("no NVML (%s); using %d virtual GPUs", exc, count)
    return CpuBackend(count, server)
