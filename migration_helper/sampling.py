"""Periodic GPU sampling: feeds each job's memory into its MemoryCycle and builds
the ReportGpuSamples batch (latest sample per GPU and per job, with the cycle)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from migration_helper.cycle import MemoryCycle
from migration_helper.gpus import GpuBackend, JobProcesses, Sample, process_tree
from migration_helper.process import JobProcess
from protos.gandiva.v1 import helper_pb2

log = logging.getLogger(__name__)


class Sampler:
    def __init__(
        self, backend: GpuBackend, processes: Callable[[], Iterable[JobProcess]], interval_s: float
    ) -> None:
        self.backend = backend
        self.processes = processes
        self.window_s = max(30.0, interval_s * 60)
        self.cycles: dict[tuple[str, int], MemoryCycle] = {}
        self.latest: dict[tuple[str, int], Sample] = {}

    def jobs(self) -> dict[str, JobProcesses]:
        out: dict[str, JobProcesses] = {}
        for proc in list(self.processes()):
            if not proc.alive:
                continue
            prev = out.get(proc.job_id)
            pids = process_tree(proc.pid) | (prev.pids if prev else frozenset())
            gpus = tuple(sorted(set(proc.gpu_indices) | set(prev.gpu_indices if prev else ())))
            out[proc.job_id] = JobProcesses(pids, gpus)
        return out

    def take(self) -> list[Sample]:
        try:
            samples = self.backend.sample(self.jobs())
        except Exception:  # a sampling hiccup must not take the helper down
            log.warning("GPU sampling failed", exc_info=True)
            return []
        live = set()
        for s in samples:
            key = (s.job_id, s.gpu_index)
            live.add(key)
            self.latest[key] = s
            if s.job_id:
                self.cycles.setdefault(key, MemoryCycle(self.window_s)).add(s.at, s.job_memory_bytes)
        for key in list(self.latest):
            if key not in live:  # the job ended or moved
                self.latest.pop(key, None)
                self.cycles.pop(key, None)
        return samples

    def report(self, server: str) -> helper_pb2.GpuSamplesRequest:
        request = helper_pb2.GpuSamplesRequest(server=server)
        for key, s in sorted(self.latest.items()):
            msg = helper_pb2.GpuSample(
                gpu_index=s.gpu_index, at=s.at, memory_used_bytes=s.memory_used_bytes,
                utilization=s.utilization, job_id=s.job_id, job_memory_bytes=s.job_memory_bytes,
            )
            cycle = self.cycles.get(key)
            if cycle is not None:
                summary = cycle.summary()
                msg.job_memory_min_bytes = summary.min_bytes
                msg.job_memory_max_bytes = summary.max_bytes
                msg.minibatch_s = summary.minibatch_s
            request.samples.append(msg)
        return request
