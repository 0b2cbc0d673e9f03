"""Heights, affinity and a working ledger of GPU occupancy for one decide() call.

Height of a server = ceil(M/N) for M GPUs allocated (a GPU shared by two jobs counts
twice) and N GPUs in it; cluster height = max over servers; the cluster is
*overloaded* when its height is above 1 (brief section 3).

The Ledger starts from the snapshot and is updated as the policy makes decisions,
so that two decisions in one call never hand out the same free GPU twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from scheduler.policy.types import ClusterSnapshot, GpuRef, JobView, ServerView

Placement = tuple[GpuRef, ...]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def server_height(snapshot: ClusterSnapshot, server: str) -> int:
    """ceil(M/N): GPU allocations on the server (with multiplicity) over its GPU count."""
    srv = snapshot.server_by_name[server]
    allocated = sum(
        sum(1 for g in job.placement if g.server == server)
        for job in snapshot.jobs_on_server.get(server, ())
    )
    return _ceil_div(allocated, srv.num_gpus)


def cluster_height(snapshot: ClusterSnapshot) -> int:
    """The largest server height; above 1 means the cluster is overloaded."""
    return max((server_height(snapshot, s.name) for s in snapshot.servers if s.up), default=0)


def server_affinity(snapshot: ClusterSnapshot, server: str) -> int | None:
    """The GPU count of the jobs on the server (the most common one), None when empty."""
    sizes = Counter(job.gpus for job in snapshot.jobs_on_server.get(server, ()))
    return _affinity_of(sizes)


def _affinity_of(sizes: Counter[int]) -> int | None:
    if not sizes:
        return None
    # Ties go to the larger size: it is the harder one to place elsewhere.
    return max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0]


class Ledger:
    """Mutable occupancy for one decide() call: which jobs are bound to which GPUs."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.servers: dict[str, ServerView] = {s.name: s for s in snapshot.servers if s.up}
        self.jobs: dict[str, JobView] = {}
        self.placement: dict[str, Placement] = {}
        self.state: dict[str, str] = {}
        self.bound: dict[GpuRef, list[str]] = {}
        self.load: dict[str, int] = dict.fromkeys(self.servers, 0)
        self.sizes: dict[str, Counter[int]] = {name: Counter() for name in self.servers}
        self._groups: dict[Placement, list[str]] = {}
        self._free: dict[str, set[int]] = {
            name: set(range(s.num_gpus)) for name, s in self.servers.items()
        }
        # Bumped on every change; lets callers cache "nothing fits" answers.
        self.version = 0
        # Jobs whose state or placement this decide() call already changed.
        self.changed: set[str] = set()
        for job in snapshot.jobs:
            self.jobs[job.id] = job
            self.state[job.id] = job.state
            if job.placement:
                self._bind(job.id, job.placement)

    # --- mutation -----------------------------------------------------------------

    def _bind(self, job_id: str, gpus: Placement) -> None:
        self.placement[job_id] = gpus
        self._groups.setdefault(gpus, []).append(job_id)
        size = len(gpus)
        self.version += 1
        for gpu in gpus:
            self.bound.setdefault(gpu, []).append(job_id)
            if gpu.server in self.load:
                self.load[gpu.server] += 1
                self._free[gpu.server].discard(gpu.index)
        for name in {g.server for g in gpus}:
            if name in self.sizes:
                self.sizes[name][size] += 1

    def unbind(self, job_id: str) -> None:
        gpus = self.placement.pop(job_id, ())
        if gpus:
            group = self._groups[gpus]
            group.remove(job_id)
            if not group:
                del self._groups[gpus]
        self.version += 1
        for gpu in gpus:
            self.bound[gpu].remove(job_id)
            if gpu.server in self.load:
                self.load[gpu.server] -= 1
                if not self.bound[gpu]:
                    self._free[gpu.server].add(gpu.index)
        for name in {g.server for g in gpus}:
            if name in self.sizes:
                self.sizes[name][len(gpus)] -= 1
                if self.sizes[name][len(gpus)] <= 0:
                    del self.sizes[name][len(gpus)]

    def bind(self, job_id: str, gpus: Placement, state: str) -> None:
        """Move ``job_id`` onto ``gpus`` (unbinding it from wherever it was)."""
        self.unbind(job_id)
        self._bind(job_id, gpus)
        self.state[job_id] = state
        self.changed.add(job_id)

    def set_state(self, job_id: str, state: str) -> None:
        self.state[job_id] = state
        self.changed.add(job_id)

    # --- queries ------------------------------------------------------------------

    def free_gpus(self, server: str) -> list[GpuRef]:
        """GPUs on the server that no job is bound to, by index."""
        return [GpuRef(server, i) for i in sorted(self._free[server])]

    def num_free(self, server: str) -> int:
        return len(self._free[server])

    def total_free(self) -> int:
        return sum(len(f) for f in self._free.values())

    def height(self, server: str) -> int:
        return _ceil_div(self.load[server], self.servers[server].num_gpus)

    def affinity(self, server: str) -> int | None:
        return _affinity_of(self.sizes[server])

    def is_idle(self, server: str) -> bool:
        return self.load[server] == 0

    def members(self, gpus: Placement) -> list[str]:
        """Jobs bound to exactly this placement: one time-slice group."""
        return list(self._groups.get(gpus, ()))

    def groups(self) -> dict[Placement, list[str]]:
        """Every distinct placement with the jobs bound to it (time-slice groups)."""
        return {gpus: list(members) for gpus, members in self._groups.items()}

    def overloaded(self) -> bool:
        return any(self.height(name) > 1 for name in self.servers)

    def running_on(self, gpus: Iterable[GpuRef]) -> set[str]:
        return {j for g in gpus for j in self.bound.get(g, ()) if self.state[j] == "RUNNING"}
