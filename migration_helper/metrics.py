"""`gandiva helper --http-listen`: this server's Prometheus metrics.

Per GPU: utilization and memory (NVML, or the CPU backend's virtual GPUs: their jobs'
CPU share and RSS) from the helper's latest samples; the jobs running here; host memory
(reported, and held by the jobs' processes as of the last report). All of it
is read at scrape time from the daemon's sampler and job table, so it is never stale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge

from scheduler.observe.http import Handler, prometheus_route

if TYPE_CHECKING:
    from migration_helper.daemon import HelperDaemon


class HelperMetrics:
    def __init__(self, daemon: HelperDaemon) -> None:
        self.daemon = daemon
        self.registry = r = CollectorRegistry()
        labels = ["server", "gpu", "model"]
        self.util = Gauge("gandiva_helper_gpu_utilization", "GPU utilization, 0..1 (last sample)", labels, registry=r)
        self.mem_used = Gauge("gandiva_helper_gpu_memory_used_bytes", "GPU memory in use (last sample)", labels, registry=r)
        self.mem_total = Gauge("gandiva_helper_gpu_memory_total_bytes", "GPU memory", labels, registry=r)
        self.gpu_jobs = Gauge("gandiva_helper_gpu_jobs", "Job processes on the GPU", labels, registry=r)
        self.jobs = Gauge("gandiva_helper_jobs_running", "Job processes alive on this server", ["server"], registry=r)
        self.backend = Gauge("gandiva_helper_info", "The GPU backend (nvml or cpu)", ["server", "backend"], registry=r)
        self.host_memory = Gauge("gandiva_helper_host_memory_bytes",
                                 "Host memory this server's jobs may hold, as reported at registration (0: not checked)",
                                 ["server"], registry=r)
        # The lease (docs/migration_helper.md): with no heartbeat answered for it, this helper
        # freezes its jobs (SIGSTOP) until the scheduler answers again. What to alert on.
        self.lease_remaining = Gauge("gandiva_helper_lease_remaining_seconds",
                                     "Seconds until this helper's lease runs out without an answered heartbeat "
                                     "(0: ran out, its jobs frozen; before a first registration: 0; +Inf: no lease)",
                                     ["server"], registry=r)
        self.lease_frozen = Gauge("gandiva_helper_lease_frozen",
                                  "1 while the lease has run out and this server's jobs are frozen", ["server"],
                                  registry=r)
        self.jobs_frozen = Gauge("gandiva_helper_jobs_frozen", "Job processes frozen now (by the lease)", ["server"],
                                 registry=r)
        self.jobs_host_memory = Gauge("gandiva_helper_jobs_host_memory_bytes",
                                      "Resident set of this server's job processes together (last report)",
                                      ["server"], registry=r)

    async def refresh(self) -> None:
        d = self.daemon
        server = d.config.server_name
        latest = dict(d.sampler.latest)
        for g in d.backend.gpus():
            key = (server, str(g.index), g.model)
            self.mem_total.labels(*key).set(g.memory_total_bytes)
            sample = latest.get(("", g.index))
            self.util.labels(*key).set(sample.utilization if sample else 0.0)
            self.mem_used.labels(*key).set(sample.memory_used_bytes if sample else 0)
            self.gpu_jobs.labels(*key).set(sum(1 for job, gpu in latest if job and gpu == g.index))
        self.jobs.labels(server).set(len(d.jobs.running_jobs()))
        self.backend.labels(server, d.backend.name).set(1)
        self.host_memory.labels(server).set(d.host_memory_bytes)
        self.jobs_host_memory.labels(server).set(sum(m.rss_bytes for m in d.sampler.host_latest))
        self.lease_remaining.labels(server).set(d.lease_left())  # what the lease file tells the shims
        self.lease_frozen.labels(server).set(1 if d.frozen else 0)
        self.jobs_frozen.labels(server).set(sum(1 for p in d.jobs.processes.values() if p.frozen and p.alive))

    def routes(self) -> dict[str, Handler]:
        return {"/metrics": prometheus_route(self.registry, self.refresh)}
