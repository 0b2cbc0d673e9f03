"""Periodic GPU sampling: feeds each job's memory into its MemoryCycle and builds
the ReportGpuSamples batch (latest sample per GPU and per job, with the cycle, and
each launch's host memory: the resident set of its processes, measured per report)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from migration_helper.cycle import MemoryCycle
from migration_helper.gpus import GpuBackend, JobProcesses, Sample, process_tree
from migration_helper.process import JobProcess
from migration_protocol.host_memory import resident_bytes
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
        # Each launch's host memory as of the last report.
        self.host_latest: list[helper_pb2.JobHostMemory] = []

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

    def host_memory(self) -> list[helper_pb2.JobHostMemory]:
        """The resident set of each live launch's processes: its own, its descendants' and
        those left in its session (the helper starts each job in a session of its own, so
        a worker whose parent exited is still counted). A suspended (or SIGSTOPped)
        process keeps its pages and is counted; a process gone meanwhile counts 0, and a
        launch none of whose processes could be read is left out."""
        procs = [p for p in list(self.processes()) if p.alive and p.pid]
        if not procs:
            return []
        table = proc_table()  # one pass over /proc for every launch
        children: dict[int, list[int]] = {}
        sessions: dict[int, list[int]] = {}
        for pid, (ppid, sid) in table.items():
            children.setdefault(ppid, []).append(pid)
            sessions.setdefault(sid, []).append(pid)
        out = []
        for p in procs:
            pids = {p.pid, *sessions.get(p.pid, ())}
            todo = [p.pid]
            while todo:  # descendants, also those that left the session (setsid)
                kids = [c for c in children.get(todo.pop(), ()) if c not in pids]
                pids.update(kids)
                todo.extend(kids)
            rss = resident_bytes(pids)
            if rss:
                out.append(helper_pb2.JobHostMemory(job_id=p.job_id, incarnation=p.incarnation, rss_bytes=rss))
        return out

    def report(self, server: str) -> helper_pb2.GpuSamplesRequest:
        request = helper_pb2.GpuSamplesRequest(server=server)
        try:
            self.host_latest = self.host_memory()
            request.host_memory.extend(self.host_latest)
        except Exception:  # measuring must not take the helper (or the GPU report) down
            log.warning("host memory sampling failed", exc_info=True)
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


def proc_table(proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process, from /proc/PID/stat (processes
    that vanish meanwhile are skipped)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
            # After the command name (in parentheses, which may itself hold spaces or
            # parentheses): state, ppid, pgrp, session.
            fields = stat[stat.rindex(b")") + 2:].split()
            out[int(name)] = (int(fields[1]), int(fields[3]))
        except (OSError, ValueError, IndexError):
            continue
    return out
