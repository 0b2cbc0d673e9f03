"""Heights, affinity and a working ledger of GPU occupancy for one decide() call.

Height of a server = ceil(M/N) for M GPUs allocated (a GPU shared by two jobs counts
twice) and N GPUs in it; cluster height = max over servers; the cluster is
*overloaded* when its height is above 1 (brief section 3).

The Ledger mirrors the snapshot's occupancy and is updated as the policy makes
decisions, so that two decisions in one call never hand out the same free GPU twice.
A policy may keep its ledger between calls and ``sync`` it to the next snapshot:
sync compares every job with the ledger (so decisions the live side did not carry
out are corrected) and only rebinds what differs, which keeps a decide() call cheap
in a large cluster.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from scheduler.policy.types import ClusterSnapshot, GpuRef, JobView, ServerView

Placement = tuple[GpuRef, ...]
# Queue order: higher priority first, then earlier submission, then id.
# (-priority or 0, submitted_at, arrival, job id): the job id is always last (key[-1]).
QueueKey = tuple[int, float, int, str]


# The states balance_sizes counts as waiting for GPUs.
WAITING = frozenset(("QUEUED", "SUSPENDED"))

def queue_key(job: JobView) -> QueueKey:
    """Where a queued job stands in the queue (smaller goes first)."""
    return (-job.priority, job.submitted_at, job.arrival, job.id)


def arrival_key(job: JobView) -> QueueKey:
    """Arrival order only (first come, first served; priorities ignored)."""
    return (0, job.submitted_at, job.arrival, job.id)


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
    return affinity_of(sizes)


# What a running job's periodic report changes; its attained service at any time (what a
# time-slice group's look reads) is the same before and after, extrapolated from either.
PROGRESS_FIELDS = frozenset(("steps", "attained_service_s", "reported_at"))
_others = operator.attrgetter(*(f.name for f in dataclasses.fields(JobView) if f.name not in PROGRESS_FIELDS))


def host_need(job: JobView) -> int:
    """The job's measured host memory (0: not measured)."""
    return job.profile.host_memory_bytes if job.profile is not None else 0


def progress_only(old: JobView, new: JobView) -> bool:
    """``new`` is ``old`` with newer progress of a running job, nothing else changed."""
    return old.state == "RUNNING" and _others(old) == _others(new)


def affinity_of(sizes: Mapping[int, int]) -> int | None:
    """Affinity from a count of jobs per GPU size: the most common size, None when empty."""
    if not sizes:
        return None
    # Ties go to the larger size: it is the harder one to place elsewhere.
    return max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0]


class Ledger:
    """Occupancy of the cluster: which jobs are bound to which GPUs, in which state."""

    def __init__(self, servers: tuple[ServerView, ...],
                 order: Callable[[JobView], QueueKey] = queue_key) -> None:
        self.source_servers = servers
        self.order = order
        self.servers: dict[str, ServerView] = {s.name: s for s in servers if s.up}
        # Cordoned servers (ServerView.schedulable False): their jobs stay bound and take
        # their turns, but no job comes to them: their GPUs never read as free, they are
        # never idle (nothing fills them) and their groups are in no groups_by_size (which
        # every filter that joins a job to a group reads).
        self.cordoned = frozenset(s.name for s in servers if s.up and not s.schedulable)
        self.snapshot = ClusterSnapshot(0.0, servers)
        self.jobs: dict[str, JobView] = {}
        self.placement: dict[str, Placement] = {}
        self.state: dict[str, str] = {}
        self.by_state: dict[str, set[str]] = {}
        self.bound: dict[GpuRef, list[str]] = {}
        self.load: dict[str, int] = dict.fromkeys(self.servers, 0)
        # Up servers no job is bound to (cordoned ones left out).
        self.idle_servers: set[str] = set(self.servers) - self.cordoned
        # Per server: GPU count -> how many jobs of that size touch it (for affinity).
        self.sizes: dict[str, dict[int, int]] = {name: {} for name in self.servers}
        self.jobs_on: dict[str, set[str]] = {name: set() for name in self.servers}
        self.servers_of: dict[str, tuple[str, ...]] = {}
        self._groups: dict[Placement, list[str]] = {}
        self.groups_by_size: dict[int, set[Placement]] = {}
        # Placements shared by two or more jobs (time-slice groups or packs).
        self.shared: set[Placement] = set()
        # Jobs whose GPUs span more than one server; jobs holding more than they asked.
        self.spread: set[str] = set()
        self.grown: set[str] = set()
        self._free: dict[str, set[int]] = {
            name: set(s.registered_indices) if name not in self.cordoned else set()
            for name, s in self.servers.items()
        }
        self._n_free = sum(len(f) for f in self._free.values())
        self.max_server_gpus = max((s.num_gpus for s in self.servers.values()), default=1)
        # The servers by their number of free GPUs (0 to max_server_gpus), kept as GPUs
        # are bound and freed: best fit and "the most free GPUs" without visiting every server.
        self._by_free: list[set[str]] = [set() for _ in range(self.max_server_gpus + 1)]
        for name, free in self._free.items():
            self._by_free[len(free)].add(name)
        # Servers held for one GPU count larger than a server (``hold``): their free GPUs
        # are kept apart in _held_free (no filter sees them; the holder reads held_free) and
        # their affinity reads as that count, so no job of another count joins them.
        self.held: dict[str, int] = {}
        self._held_free: dict[str, set[int]] = {}
        self._over: set[str] = set()
        # GPUs of the up servers.
        self.num_gpus = sum(s.num_gpus for s in self.servers.values())
        # Bumped on every change the placement filters can see (a bind or unbind, a job
        # entering or leaving MIGRATING, a view's ``suspendable`` changing); lets callers
        # cache "nothing fits" answers, within a call and across calls.
        self.version = 0
        # Jobs whose state or placement this decide() call already changed.
        self.changed: set[str] = set()
        # QUEUED jobs per GPU count, sorted by queue_key; _qkey says where each one is.
        self.queued_by_size: dict[int, list[QueueKey]] = {}
        self._qkey: dict[str, tuple[int, QueueKey]] = {}
        # Jobs per requested GPU count, all of them and those waiting (QUEUED or SUSPENDED),
        # kept as states change (balance_sizes reads them at every look); _request says
        # which count each job is filed under.
        self.jobs_by_request: dict[int, int] = {}
        self.waiting_by_request: dict[int, int] = {}
        self._request: dict[str, int] = {}
        # When a set (a policy turns it on): every placement whose group changed - a job
        # bound to or unbound from it, a member's state or view replaced - collected until
        # the policy takes them (Gandiva looks again only at groups that changed or are due).
        self.touched_groups: set[Placement] | None = None
        # When a list (a policy turns it on): the last views of the jobs that left the
        # snapshot (finished or killed), collected until the policy takes them.
        self.departed: list[JobView] | None = None
        # When a dict (a policy turns it on, ``start_eldest``): per requested GPU count, a heap
        # of (submitted_at, arrival, id) of the jobs bound to GPUs, pushed at each bind and
        # cleaned lazily (``eldest_of``); the earliest-submitted job holding GPUs per count.
        self.eldest: dict[int, list[tuple[float, int, str]]] | None = None
        # eldest_second_group: the eldest counts only while its GPU count holds another group.
        self.eldest_second_group = False
        # Host memory (ServerView.host_memory_bytes; 0: not checked). Every job bound to a
        # server holds its host memory there (its processes on that server), running or
        # suspended: measured bytes in host_bytes, the number of jobs not measured yet in
        # host_unmeasured (priced at the config's assumption when asked).
        self.host_limit = {name: s.host_memory_bytes for name, s in self.servers.items() if s.host_memory_bytes > 0}
        self.host_bytes: dict[str, float] = dict.fromkeys(self.host_limit, 0.0)
        self.host_unmeasured: dict[str, float] = dict.fromkeys(self.host_limit, 0.0)
        self._host_charge: dict[str, list[tuple[str, float, float]]] = {}

    @classmethod
    def of(cls, snapshot: ClusterSnapshot, holds: Callable[[JobView], bool] | None = None,
           order: Callable[[JobView], QueueKey] = queue_key) -> Ledger:
        """A fresh ledger for ``snapshot``; ``holds`` says which jobs occupy their GPUs and
        ``order`` sorts the queue (``queued_in_order``)."""
        ledger = cls(snapshot.servers, order)
        ledger.sync(snapshot, holds)
        return ledger

    def _note_change(self, was: JobView | None, fresh: JobView, progressed: list[str]) -> None:
        """A job's view changed from ``was`` (None: new job) to ``fresh``: a change of
        ``suspendable`` moves the version (the placement filters read it); a view that only
        reports progress goes to ``progressed`` (read only when groups are tracked)."""
        if was is None:
            return
        size = self._request.get(fresh.id)
        if size is not None and fresh.requested_gpus != size:
            self._file_request(fresh.id, size, -1)
            self._request[fresh.id] = fresh.requested_gpus
            self._file_request(fresh.id, fresh.requested_gpus, 1)
        if self.host_limit and host_need(was) != host_need(fresh) and fresh.id in self._host_charge:
            self._uncharge_host(fresh.id)
            self._charge_host(fresh.id, fresh)
            self.version += 1
        if was.suspendable != fresh.suspendable:
            self.version += 1
        elif self.touched_groups is not None and progress_only(was, fresh):
            progressed.append(fresh.id)

    def sync(self, snapshot: ClusterSnapshot,
             holds: Callable[[JobView], bool] | None = None) -> Ledger:
        """Bring the ledger to ``snapshot``; returns a fresh ledger if the servers changed.

        When the snapshot says what changed since the one this ledger last saw
        (``snapshot.delta``), only those jobs are looked at; otherwise every job is.
        """
        servers = snapshot.servers
        if servers is not self.source_servers and servers != self.source_servers:
            return Ledger.of(snapshot, holds, self.order)
        delta = snapshot.delta_since(self.snapshot.seq)  # the last snapshot synced to
        self.snapshot = snapshot
        touched = self.changed
        progressed: list[str] = []
        if delta is not None:
            jobs = self.jobs
            departed = self.departed
            for jid in delta.removed:
                gone = jobs.pop(jid, None)
                if gone is not None:
                    self._forget(jid)
                    if departed is not None:
                        departed.append(gone)
            for fresh in delta.changed:
                self._note_change(jobs.get(fresh.id), fresh, progressed)
                jobs[fresh.id] = fresh
            look = [fresh.id for fresh in delta.changed]
        else:
            old = self.jobs
            # Views the caller kept (same object) need no look unless our last decide()
            # changed that job tentatively; everything else is compared in full.
            new = {view.id: view for view in snapshot.jobs}
            for jid in old.keys() - new.keys():
                self._forget(jid)
                if self.departed is not None:
                    self.departed.append(old[jid])
            self.jobs = jobs = new
            look = [j for j, v in new.items() if old.get(j) is not v]
            for jid in look:
                self._note_change(old.get(jid), new[jid], progressed)
        placement, state, groups = self.placement, self.state, self.touched_groups
        # A job whose view only reports progress leaves its group as it was (unless our
        # last decide() changed it): nothing a group's look decides from changed.
        quiet = set(progressed).difference(touched) if groups is not None else ()
        for jid in look + list(touched):
            view = jobs.get(jid)
            if view is None:
                continue
            if groups is not None and jid in placement and jid not in quiet:
                groups.add(placement[jid])  # its view (service, rate, ...) may differ
            if state.get(jid) != view.state:
                self._set(jid, view.state)
            elif view.state == "QUEUED":
                self._index_queued(jid)  # its priority may have changed
            want = view.placement if holds is None or holds(view) else ()
            if placement.get(jid, ()) != want:
                self.unbind(jid)
                if want:
                    self._bind(jid, want)
        self.changed = set()
        return self

    def _forget(self, job_id: str) -> None:
        """Drop a job that left the snapshot."""
        self.unbind(job_id)
        self._unindex_queued(job_id)
        self._file_request(job_id, self._request.pop(job_id), -1)
        self.by_state[self.state.pop(job_id)].discard(job_id)

    def _file_request(self, job_id: str, size: int, sign: int) -> None:
        """Count a job in (``sign`` 1) or out of (-1) its requested GPU count's tallies."""
        self.jobs_by_request[size] = self.jobs_by_request.get(size, 0) + sign
        if self.state.get(job_id) in WAITING:
            self.waiting_by_request[size] = self.waiting_by_request.get(size, 0) + sign

    # --- the queue, in queue order per GPU count ------------------------------------

    def _index_queued(self, job_id: str) -> None:
        view = self.jobs[job_id]
        entry = (view.gpus, self.order(view))
        if self._qkey.get(job_id) == entry:
            return
        self._unindex_queued(job_id)
        self._qkey[job_id] = entry
        insort(self.queued_by_size.setdefault(entry[0], []), entry[1])

    def _unindex_queued(self, job_id: str) -> None:
        entry = self._qkey.pop(job_id, None)
        if entry is None:
            return
        keys = self.queued_by_size[entry[0]]
        del keys[bisect_left(keys, entry[1])]
        if not keys:
            del self.queued_by_size[entry[0]]

    def next_queued(self, size: int, after: QueueKey | None = None) -> QueueKey | None:
        """The first queued ``size``-GPU job in queue order after ``after`` (its key)."""
        keys = self.queued_by_size.get(size)
        if not keys:
            return None
        i = 0 if after is None else bisect_right(keys, after)
        return keys[i] if i < len(keys) else None

    def queued_in_order(self, skip: Callable[[int], bool] | None = None) -> Iterator[JobView]:
        """QUEUED jobs in queue order, leaving out every job whose GPU count ``skip`` says
        cannot be placed now. ``skip`` is asked again at every step (binds change what
        fits), and the caller may bind the jobs it is given as it goes. A step costs
        O(GPU counts x log(queue)), so a walk that stops or skips is cheap however long
        the queue is."""
        pos: QueueKey | None = None
        while True:
            best: QueueKey | None = None
            for size in self.queued_by_size:
                if skip is not None and skip(size):
                    continue
                key = self.next_queued(size, pos)
                if key is not None and (best is None or key < best):
                    best = key
            if best is None:
                return
            pos = best
            yield self.jobs[best[-1]]

    def first_queued(self, max_gpus: int | None = None) -> QueueKey | None:
        """The first queued job in queue order (of at most ``max_gpus`` GPUs), by key."""
        heads = [keys[0] for size, keys in self.queued_by_size.items()
                 if keys and (max_gpus is None or size <= max_gpus)]
        return min(heads) if heads else None

    # --- mutation -----------------------------------------------------------------

    def touch(self, gpus: Placement) -> None:
        """Note that the group on ``gpus`` changed in a way the ledger cannot see."""
        if self.touched_groups is not None:
            self.touched_groups.add(gpus)

    def _set(self, job_id: str, state: str) -> None:
        if self.touched_groups is not None and job_id in self.placement:
            self.touched_groups.add(self.placement[job_id])
        old = self.state.get(job_id)
        if old == "MIGRATING" or state == "MIGRATING":
            self.version += 1
        if old is None:  # a new job: counted among its GPU count's jobs (not yet waiting)
            self._request[job_id] = self.jobs[job_id].requested_gpus
            self._file_request(job_id, self._request[job_id], 1)
        size = self._request[job_id]
        if (old in WAITING) != (state in WAITING):
            self.waiting_by_request[size] = self.waiting_by_request.get(size, 0) + (1 if state in WAITING else -1)
        if old is not None:
            self.by_state[old].discard(job_id)
            if old == "QUEUED":
                self._unindex_queued(job_id)
        self.state[job_id] = state
        self.by_state.setdefault(state, set()).add(job_id)
        if state == "QUEUED":
            self._index_queued(job_id)

    def _bind(self, job_id: str, gpus: Placement) -> None:
        # Hot path (once per changed job per event): no comprehensions here.
        self.placement[job_id] = gpus
        if self.touched_groups is not None:
            self.touched_groups.add(gpus)
        group = self._groups.get(gpus)
        if group is None:
            self._groups[gpus] = [job_id]
            if not (self.cordoned and any(g.server in self.cordoned for g in gpus)):
                self.groups_by_size.setdefault(len(gpus), set()).add(gpus)
        else:
            group.append(job_id)
            self.shared.add(gpus)
        self.version += 1
        bound, load, free = self.bound, self.load, self._free
        for gpu in gpus:
            ids = bound.get(gpu)
            if ids is None:
                bound[gpu] = [job_id]
            else:
                ids.append(job_id)
            if gpu.server in load:
                load[gpu.server] += 1
                self.idle_servers.discard(gpu.server)
                on = free[gpu.server]
                if gpu.index in on:
                    n = len(on)
                    on.discard(gpu.index)
                    self._n_free -= 1
                    self._by_free[n].discard(gpu.server)
                    self._by_free[n - 1].add(gpu.server)
                elif gpu.server in self._held_free:
                    self._held_free[gpu.server].discard(gpu.index)
                if load[gpu.server] > self.servers[gpu.server].num_gpus:
                    self._over.add(gpu.server)
        names = (gpus[0].server,) if len(gpus) == 1 else tuple(dict.fromkeys(g.server for g in gpus))
        self.servers_of[job_id] = names
        if self.eldest is not None:
            self._push_eldest(job_id)
        if self.host_limit:
            self._charge_host(job_id, self.jobs[job_id])
        if len(names) > 1:
            self.spread.add(job_id)
        if len(gpus) > self.jobs[job_id].requested_gpus:
            self.grown.add(job_id)
        size = len(gpus)
        for name in names:
            sizes = self.sizes.get(name)
            if sizes is not None:
                sizes[size] = sizes.get(size, 0) + 1
                self.jobs_on[name].add(job_id)

    def _push_eldest(self, job_id: str) -> None:
        view = self.jobs[job_id]
        heapq.heappush(self.eldest.setdefault(view.requested_gpus, []),  # type: ignore[union-attr]
                       (view.submitted_at, view.arrival, job_id))

    def start_eldest(self, second_group: bool = False) -> None:
        """Keep ``eldest`` from now on (the jobs bound now are filed at once); with
        ``second_group`` (``PolicyConfig.eldest_second_group``) ``eldest_of`` names a job
        only while its GPU count holds at least one other time-slice group."""
        self.eldest_second_group = second_group
        if self.eldest is None:
            self.eldest = {}
            for job_id in sorted(self.placement):
                self._push_eldest(job_id)

    def eldest_of(self, size: int) -> str | None:
        """The job submitted first (then arrival, id) of those asking ``size`` GPUs that are
        bound to GPUs now (running, suspended or moving); None if none is, or if ``eldest``
        is off. Entries of jobs no longer bound are dropped as they reach the top. With
        ``eldest_second_group``, None also while the eldest's group is the only one of its
        size: the count's newcomers would have no group left to take turns in."""
        heap = self.eldest.get(size) if self.eldest is not None else None
        while heap:
            job_id = heap[0][2]
            if job_id in self.placement and self.jobs[job_id].requested_gpus == size:
                if self.eldest_second_group and len(self.groups_by_size.get(len(self.placement[job_id]), ())) < 2:
                    return None
                return job_id
            heapq.heappop(heap)
        return None

    def unbind(self, job_id: str) -> None:
        gpus = self.placement.pop(job_id, ())
        if not gpus:
            return
        if self.touched_groups is not None:
            self.touched_groups.add(gpus)
        group = self._groups[gpus]
        group.remove(job_id)
        if len(group) < 2:
            self.shared.discard(gpus)
        if not group:
            del self._groups[gpus]
            self.groups_by_size.get(len(gpus), set()).discard(gpus)
        self.version += 1
        for gpu in gpus:
            self.bound[gpu].remove(job_id)
            if gpu.server in self.load:
                self.load[gpu.server] -= 1
                held = self._held_free.get(gpu.server) if self.held else None
                cordoned = self.cordoned and gpu.server in self.cordoned
                if not self.load[gpu.server] and held is None and not cordoned:
                    self.idle_servers.add(gpu.server)
                if not self.bound[gpu]:
                    if held is not None:
                        held.add(gpu.index)
                    elif not cordoned:
                        on = self._free[gpu.server]
                        n = len(on)
                        on.add(gpu.index)
                        self._n_free += 1
                        self._by_free[n].discard(gpu.server)
                        self._by_free[n + 1].add(gpu.server)
                if self.load[gpu.server] <= self.servers[gpu.server].num_gpus:
                    self._over.discard(gpu.server)
        self.spread.discard(job_id)
        self.grown.discard(job_id)
        if self.host_limit:
            self._uncharge_host(job_id)
        for name in self.servers_of.pop(job_id):
            sizes = self.sizes.get(name)
            if sizes is not None:
                sizes[len(gpus)] -= 1
                if sizes[len(gpus)] <= 0:
                    del sizes[len(gpus)]
                self.jobs_on[name].discard(job_id)

    def _charge_host(self, job_id: str, view: JobView) -> None:
        need = host_need(view)
        charge = []
        for name in self.servers_of[job_id]:
            if name in self.host_limit:
                charge.append((name, float(need), 0.0 if need else 1.0))
                self.host_bytes[name] += need
                self.host_unmeasured[name] += 0.0 if need else 1.0
        self._host_charge[job_id] = charge

    def _uncharge_host(self, job_id: str) -> None:
        for name, held, unmeasured in self._host_charge.pop(job_id, ()):
            self.host_bytes[name] -= held
            self.host_unmeasured[name] -= unmeasured

    def host_fits(self, job: JobView, gpus: Placement, use: float, assumed: int,
                  planned: Mapping[str, float] | None = None) -> bool:
        """The job's host memory fits on every server of ``gpus`` under ``use`` x the server's
        host memory, beside the jobs bound there (on a server it is bound to already, it
        holds its memory there already): a server no other job is bound to takes any job,
        so a job larger than every server's budget still runs alone. ``assumed``: the host
        memory of a job not measured yet; ``planned``: bytes per server that moves planned
        but not yet bound will add."""
        if not self.host_limit:
            return True
        need = host_need(job) or assumed
        here = self.servers_of.get(job.id, ())
        for name in {g.server for g in gpus}:
            limit = self.host_limit.get(name)
            extra = planned.get(name, 0.0) if planned else 0.0
            if limit is None or name in here or (not extra and not self.jobs_on[name]):
                continue
            if self.host_used(name, assumed) + extra + need > limit * use + 0.5:
                return False
        return True

    def host_used(self, name: str, assumed: int) -> float:
        """Host memory the jobs bound to ``name`` hold (unmeasured ones at ``assumed``)."""
        return self.host_bytes.get(name, 0.0) + self.host_unmeasured.get(name, 0.0) * assumed

    def bind(self, job_id: str, gpus: Placement, state: str) -> None:
        """Move ``job_id`` onto ``gpus`` (unbinding it from wherever it was)."""
        self.unbind(job_id)
        self._bind(job_id, gpus)
        self._set(job_id, state)
        self.changed.add(job_id)

    def set_state(self, job_id: str, state: str) -> None:
        self._set(job_id, state)
        self.changed.add(job_id)

    def hold(self, names: Iterable[str], size: int) -> None:
        """Keep the up servers ``names`` for ``size``-GPU jobs: their free GPUs, now and as
        jobs leave them, are seen by no placement filter (only ``held_free``), and their
        affinity reads ``size`` (no time-slice group there takes a job of another count).
        Idempotent: holding held servers again changes nothing (the version stays, so the
        placement filters' cached answers stand); ``release`` ends it."""
        for name in names:
            if name not in self.servers or name in self.held or name in self.cordoned:
                continue
            self.held[name] = size
            free = self._free[name]
            self._held_free[name] = set(free)
            self._n_free -= len(free)
            self._by_free[len(free)].discard(name)
            self._by_free[0].add(name)
            free.clear()
            self.idle_servers.discard(name)
            self.version += 1

    def release(self) -> None:
        """End every hold: the held servers' free GPUs are free to all again."""
        if not self.held:
            return
        for name, free in self._held_free.items():
            if name in self.servers:
                self._by_free[len(self._free[name])].discard(name)
                self._free[name] |= free
                self._n_free += len(free)
                self._by_free[len(self._free[name])].add(name)
                if not self.load[name]:
                    self.idle_servers.add(name)
        self.held.clear()
        self._held_free.clear()
        self.version += 1

    def held_free(self, server: str) -> list[GpuRef]:
        """The free GPUs of a held server, by index."""
        return [GpuRef(server, i) for i in sorted(self._held_free.get(server, ()))]

    # --- queries ------------------------------------------------------------------

    def free_gpus(self, server: str) -> list[GpuRef]:
        """GPUs on the server that no job is bound to, by index."""
        return [GpuRef(server, i) for i in sorted(self._free[server])]

    def num_free(self, server: str) -> int:
        return len(self._free[server])

    def total_free(self) -> int:
        return self._n_free

    def max_free(self) -> int:
        """The most free GPUs any one server has."""
        for k in range(self.max_server_gpus, 0, -1):
            if self._by_free[k]:
                return k
        return 0

    def servers_with_free(self, at_least: int) -> Iterator[str]:
        """The servers with at least ``at_least`` free GPUs, fewest free first, then by
        name: best fit's order."""
        for k in range(max(at_least, 0), self.max_server_gpus + 1):
            if self._by_free[k]:
                yield from sorted(self._by_free[k])

    def height(self, server: str) -> int:
        return _ceil_div(self.load[server], self.servers[server].num_gpus)

    def affinity(self, server: str) -> int | None:
        if self.held:
            size = self.held.get(server)
            if size is not None:
                return size
        return affinity_of(self.sizes[server])

    def is_idle(self, server: str) -> bool:
        return self.load[server] == 0

    def members(self, gpus: Placement) -> list[str]:
        """Jobs bound to exactly this placement: one time-slice group."""
        return list(self._groups.get(gpus, ()))

    def moving_onto(self, gpus: Placement) -> bool:
        """A MIGRATING job holds one of ``gpus``: one of their group moving off, or one moving
        onto them from outside it (live, a move holds its source and destination GPUs until
        it ends): the group is not to run, or take a newcomer, until the move ends (else
        both run there, with no packing trial)."""
        moving = self.by_state.get("MIGRATING")
        if not moving:
            return False
        bound = self.bound
        return any(j in moving for g in gpus for j in bound.get(g, ()))

    def overloaded(self) -> bool:
        """Some server's height is above 1."""
        return bool(self._over)

    def running_on(self, gpus: Iterable[GpuRef]) -> set[str]:
        return {j for g in gpus for j in self.bound.get(g, ()) if self.state[j] == "RUNNING"}
