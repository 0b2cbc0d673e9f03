"""Where the GPU-hours go: why one policy's makespan or JCT is longer than another's.

For each policy, replays a trace and adds up, between consecutive simulator events:

- busy: GPU-hours with at least one job running;
- idle while jobs wait: GPU-hours of unallocated GPUs while some job is queued or suspended
  (room that fragmentation or policy kept from the waiting jobs);
- packed beside idle: GPU-hours of unallocated GPUs while jobs run packed (the smaller of the
  two: GPUs a packed job could have run alone on);
- spread loss: GPU-hours a job spread over several servers loses to the spread slowdown,
  GPUs x (1 - spread factor), split into "forced" (the job is larger than any server) and
  "avoidable" (it would have fit on one server);
- the critical job (the one that sets the makespan lower bound, scheduler.sim.load): hours
  queued, suspended and running, and when it finished;
- with ``--tail N``, the same for each of the first policy's last N finishers (the trace's
  tail, where a makespan is lost), under every policy: when it ended, and its hours queued,
  suspended and running, running split into alone and sharing its GPUs with another running
  job (packed); the job's work is its running hours under a policy that never packs;
- where queued jobs wait (job-hours, for gandiva, from its own ledger after every call):
  ``reserved`` another job holds a reservation; ``locality`` enough GPUs are free but no one
  server has them (a job that fits one server is not spread); ``cap`` same-size time-slice
  groups exist on same-affinity servers but all have ``max_jobs_per_gpu`` members;
  ``affinity`` same-size groups exist but only on servers whose affinity is another size;
  ``no group`` no time-slice group of that size anywhere and too few free GPUs; ``large``
  the job is larger than a server and needs whole idle servers. With ``--sample-s S`` the
  queue is classified at most every S virtual seconds (each classification stands until
  the next), and the GPU-hours above are then sampled the same way.

Its cost is proportional to the simulator's decisions, not to the jobs waiting: the
GPU-hours are kept up to date from the jobs each event changed (``Simulator.changed``), and
the queue is classified once per GPU count (a reason depends on nothing else but who holds
the reservation), from the ledger's queue index.

    .venv/bin/python benchmarks/sim_breakdown.py --trace FILE [--compare gandiva,yarn-cs]
        [--cluster 25x4] [--target-load 0.9]

With a Gavel trace the Gavel throughput table next to it is used, as in `gandiva sim`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from sim_traces import load_trace, parse_config  # benchmarks/ is the script's folder

from scheduler.policy import ClusterSnapshot, Decision, Policy, PolicyConfig, get_policy
from scheduler.policy.cluster import Ledger
from scheduler.sim.backend import SimJob
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.load import makespan_bound, scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel, gavel_table_near


def _add(count: dict, gpus: tuple) -> None:
    for g in gpus:
        count[g] = count.get(g, 0) + 1


def _drop(count: dict, gpus: tuple) -> None:
    for g in gpus:
        count[g] -= 1
        if not count[g]:
            del count[g]


class Breakdown:
    """Integrates the cluster's state over time, one interval per simulator event.

    The state is kept up to date from the jobs each event changed (``Simulator.changed``,
    once ``watch`` has been given the simulator), so an event costs time in proportion to
    what it changed, not to the jobs waiting; without a simulator every job is looked at.
    """

    def __init__(self, num_gpus: int, server_gpus: int, model: MechanismModel, critical: str,
                 sample_s: float = 0.0) -> None:
        self.num_gpus, self.server_gpus, self.model, self.critical = num_gpus, server_gpus, model, critical
        self.hours = dict.fromkeys(("busy", "idle_while_waiting", "packed_beside_idle", "spread_forced",
                                    "spread_avoidable", "critical_queued", "critical_suspended", "critical_running"), 0.0)
        self._last: tuple[float, dict[str, float]] | None = None
        self._sim: Simulator | None = None
        # Per job as last seen: its state and GPUs. From them: how many jobs hold (allocated)
        # and run on (running) each GPU, how many wait, the spread loss of each running job
        # spread over servers, and the critical job's state.
        self._seen: dict[str, tuple[str, tuple]] = {}
        self._allocated: dict = {}
        self._running: dict = {}
        self._waiting = 0
        self._spread: dict[str, tuple[str, float]] = {}
        self._critical_state: str | None = None
        # Every job's hours per state (QUEUED, SUSPENDED, RUNNING, and PACKED: running on a
        # GPU another running job also runs on), from the events that changed it: the state
        # it entered and when (``--tail``).
        self.job_hours: dict[str, dict[str, float]] = {}
        self._since: dict[str, tuple[str, float]] = {}
        self._seen_ids: dict[str, tuple] = {}  # the GPUs of each running job, and who runs on each
        self._running_ids: dict = {}
        # As WaitProbe's: the state is read at most every sample_s virtual seconds and
        # stands until the next reading (0: at every event).
        self.sample_s = sample_s
        self._next_sample = -math.inf

    def watch(self, sim: Simulator) -> None:
        """Follow only the jobs each of ``sim``'s events changed."""
        self._sim = sim

    def _forget(self, job_id: str) -> None:
        seen = self._seen.pop(job_id, None)
        if seen is None:
            return
        state, placement = seen
        _drop(self._allocated, placement)
        if state == "RUNNING":
            _drop(self._running, placement)
        elif state in ("QUEUED", "SUSPENDED"):
            self._waiting -= 1
        self._spread.pop(job_id, None)
        if job_id == self.critical:
            self._critical_state = None

    def _note(self, job: SimJob) -> None:
        jid, state, placement = job.spec.id, job.state, job.placement
        self._seen[jid] = (state, placement)
        _add(self._allocated, placement)
        if state == "RUNNING":
            _add(self._running, placement)
            k = len(placement)
            if len({g.server for g in placement}) > 1:
                loss = k * (1.0 - min(1.0, self.model.spread(job.spec.model, k)))
                self._spread[jid] = ("spread_forced" if k > self.server_gpus else "spread_avoidable", loss)
        elif state in ("QUEUED", "SUSPENDED"):
            self._waiting += 1
        if jid == self.critical:
            self._critical_state = state

    def __call__(self, now: float, active: dict) -> None:
        if self._last is not None:
            t, rates = self._last
            for key, gpus in rates.items():
                self.hours[key] += gpus * (now - t) / 3600.0
        if self._sim is not None:
            changed = self._sim.changed
            for jid in changed:
                self._forget(jid)
                job = active.get(jid)
                if job is not None:
                    self._note(job)
            self._account(now, changed, active)
        if self._last is not None and now < self._next_sample:
            self._last = (now, self._last[1])
            return
        self._next_sample = now + self.sample_s
        if self._sim is None:  # no simulator to say what changed: look at every job
            for jid in list(self._seen):
                self._forget(jid)
            for job in active.values():
                self._note(job)
        rates = dict.fromkeys(self.hours, 0.0)
        for key, loss in self._spread.values():
            rates[key] += loss
        if self._critical_state is not None:
            rates[f"critical_{self._critical_state.lower()}"] = 1.0
        rates["busy"] = len(self._running)
        free = self.num_gpus - len(self._allocated)
        if self._waiting:
            rates["idle_while_waiting"] = free
        if free:
            extra = sum(n - 1 for n in self._running.values() if n > 1)
            rates["packed_beside_idle"] = min(free, extra)
        self._last = (now, rates)


    def _account(self, now: float, changed, active: dict) -> None:  # type: ignore[no-untyped-def]
        """Close the state intervals of the jobs this event changed, and of the running jobs
        whose GPUs it changed (alone <-> packed); open their new ones."""
        touched = set(changed)
        for jid in changed:
            job = active.get(jid)
            if job is not None and job.state == "RUNNING":
                touched.update(j for g in job.placement for j in self._running_ids.get(g, ()))
            old = self._seen_ids.pop(jid, None)
            if old is not None:
                for g in old:
                    ids = self._running_ids.get(g)
                    if ids is not None:
                        touched.update(ids)
                        ids.discard(jid)
            if job is not None and job.state == "RUNNING":
                self._seen_ids[jid] = job.placement
                for g in job.placement:
                    self._running_ids.setdefault(g, set()).add(jid)
        for jid in touched:
            since = self._since.pop(jid, None)
            if since is not None:
                state, t = since
                hours = self.job_hours.setdefault(jid, {})
                hours[state] = hours.get(state, 0.0) + (now - t) / 3600.0
            job = active.get(jid)
            if job is None or job.state not in ("QUEUED", "SUSPENDED", "RUNNING"):
                continue
            state = job.state
            if state == "RUNNING" and any(len(self._running_ids.get(g, ())) > 1 for g in job.placement):
                state = "PACKED"
            self._since[jid] = (state, now)


WAIT_KINDS = ("reserved", "locality", "cap", "affinity", "no group", "large")


def wait_kind(ledger: Ledger, job_id: str, config: PolicyConfig, reserved: str | None) -> str:
    """Why a queued job found no place (see the module docstring)."""
    if reserved is not None and reserved != job_id:
        return "reserved"
    return size_kind(ledger, ledger.jobs[job_id].gpus)


def size_kind(ledger: Ledger, k: int) -> str:
    """Why a queued ``k``-GPU job that holds no reservation found no place: the same for
    every such job, so a queue is classified once per GPU count."""
    if k > ledger.max_server_gpus:
        return "large"
    if ledger.total_free() >= k:
        return "locality"
    groups = ledger.groups_by_size.get(k, ())
    if any(all(n in ledger.servers and ledger.affinity(n) == k for n in {x.server for x in g}) for g in groups):
        return "cap"
    return "affinity" if groups else "no group"


class Probe(Policy):
    """Wraps a policy: decides as it does, and lets a subclass read its ledger after a call."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name, self.preemption = inner, inner.name, inner.preemption

    @property  # type: ignore[override]
    def config(self) -> PolicyConfig:
        return self.inner.config

    @config.setter
    def config(self, value: PolicyConfig) -> None:
        self.inner.config = value

    def next_wakeup(self) -> float | None:
        return self.inner.next_wakeup()


class WaitProbe(Probe):
    """Wraps a Gandiva policy and adds up queued job-hours by ``wait_kind``.

    The queued jobs are classified after a call at most every ``sample_s`` virtual seconds
    (each classification stands until the next), so a long queue does not make every call
    visit every queued job; ``sample_s`` 0 classifies after every call.
    """

    def __init__(self, inner: Policy, sample_s: float = 0.0) -> None:
        super().__init__(inner)
        self.hours = dict.fromkeys(WAIT_KINDS, 0.0)
        self.by_size: dict[int, float] = {}  # queued job-hours per GPU count
        self._last: tuple[float, dict[str, int]] | None = None
        self._sizes: dict[int, int] = {}
        self.sample_s = sample_s
        self._next_sample = -math.inf

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        out = self.inner.decide(snapshot)
        if self._last is not None:
            t, counts = self._last
            for kind, n in counts.items():
                self.hours[kind] += n * (snapshot.now - t) / 3600.0
            for size, n in self._sizes.items():
                self.by_size[size] = self.by_size.get(size, 0.0) + n * (snapshot.now - t) / 3600.0
            if snapshot.now < self._next_sample:
                self._last = (snapshot.now, counts)
                return out
        self._next_sample = snapshot.now + self.sample_s
        ledger = self.inner._ledger
        counts = dict.fromkeys(WAIT_KINDS, 0)
        self._sizes = {size: len(keys) for size, keys in ledger.queued_by_size.items()} if ledger else {}
        if ledger is not None:
            # By GPU count (wait_kind depends on nothing else but the reservation), so a
            # call costs time in proportion to the GPU counts waiting, not to the queue.
            reserved = getattr(self.inner, "_reserved", None)
            if reserved is not None:
                queued = len(ledger.by_state.get("QUEUED", ()))
                if ledger.state.get(reserved) == "QUEUED":
                    queued -= 1
                    counts[size_kind(ledger, ledger.jobs[reserved].gpus)] += 1
                counts["reserved"] += queued
            else:
                for size, keys in ledger.queued_by_size.items():
                    counts[size_kind(ledger, size)] += len(keys)
        self._last = (snapshot.now, counts)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--compare", default="gandiva,yarn-cs")
    ap.add_argument("--cluster", default="25x4")
    ap.add_argument("--target-load", type=float, default=0.9)
    ap.add_argument("--throughputs", type=Path, help="Gavel table (default: found next to the trace)")
    ap.add_argument("--spread-factor", type=float, help="as in `gandiva sim`")
    ap.add_argument("--sample-s", type=float, default=0.0, help="read the cluster and classify the queued jobs at most "
                    "every this many virtual seconds (0: after every call; use e.g. 600 for traces with long queues)")
    ap.add_argument("--config", default="", help="gandiva rules, as sim_table.py's --config, e.g. "
                    "las_slices:false+slice_growth:0+max_jobs_per_gpu:4 (the paper's time-slicing)")
    ap.add_argument("--tail", type=int, default=0, metavar="N",
                    help="also show the first policy's last N finishers under every policy: end, hours "
                         "queued, suspended, running alone and packed")
    args = ap.parse_args()
    if not args.trace.is_file():
        print(f"no trace at {args.trace}", file=sys.stderr)
        return 2
    table = args.throughputs or gavel_table_near(args.trace)
    model = MechanismModel.from_gavel(table) if table else MechanismModel.default()
    if args.spread_factor is not None:
        model.fix_spread(args.spread_factor)
    servers = make_cluster(args.cluster)
    jobs, factor = scale_to_load(load_trace(args.trace), servers, model, args.target_load)
    bound, critical = makespan_bound(jobs, servers, model)
    assert critical is not None
    print(f"{args.trace.stem}: {len(jobs)} jobs, arrivals x{factor:.4f}, rates from {model.source}")
    print(f"makespan lower bound {bound / 3600:.0f} h, set by {critical.id} ({critical.num_gpus} GPUs, "
          f"{critical.model}, arrives at {(critical.submit_time - min(j.submit_time for j in jobs)) / 3600:.0f} h)")
    cols = ("policy", "avg JCT h", "makespan h", "busy GPU-h", "idle while waiting", "packed beside idle",
            "spread loss forced",
            "spread loss avoidable", "critical queued h", "critical suspended h", "critical running h")
    print(" | ".join(cols))
    waits = {}
    tails: dict[str, tuple[dict, dict]] = {}
    for name in args.compare.split(","):
        start = time.perf_counter()
        probe = Breakdown(sum(s.num_gpus for s in servers), max(s.num_gpus for s in servers), model, critical.id,
                          args.sample_s)
        policy = get_policy(name, parse_config(args.config) if name == "gandiva" else None)
        if name == "gandiva":
            policy = waits[name] = WaitProbe(policy, args.sample_s)
        sim = Simulator(jobs, servers, policy, model, observer=probe)
        probe.watch(sim)
        result = sim.run()
        m = summarize(result)
        tails[name] = ({j.spec.id: j for j in result.jobs}, probe.job_hours)
        h = probe.hours
        print(f"{name} | {m['avg_jct_s'] / 3600:.1f} | {m['makespan_s'] / 3600:.0f} | {h['busy']:.0f} | "
              f"{h['idle_while_waiting']:.0f} | {h['packed_beside_idle']:.0f} | {h['spread_forced']:.0f} | {h['spread_avoidable']:.0f} | "
              f"{h['critical_queued']:.0f} | {h['critical_suspended']:.0f} | {h['critical_running']:.0f}"
              f"   ({time.perf_counter() - start:.0f} s)", flush=True)
    for name, wait in waits.items():
        total = sum(wait.hours.values()) or 1.0
        print(f"{name}: queued job-hours by reason: " + ", ".join(
            f"{kind} {hours:.0f} ({100 * hours / total:.0f}%)" for kind, hours in wait.hours.items()))
        print(f"{name}: queued job-hours by GPU count: " + ", ".join(
            f"{size} GPUs {hours:.0f} ({100 * hours / total:.0f}%)" for size, hours in sorted(wait.by_size.items())))
    if args.tail:
        print_tail(tails, args.tail, min(j.submit_time for j in jobs))
    return 0


def print_tail(tails: dict[str, tuple[dict, dict]], n: int, start: float) -> None:
    """The first policy's last ``n`` finishers, each under every policy: where the trace's
    end waits."""
    first = next(iter(tails))
    ended = [j for j in tails[first][0].values() if j.finished_at is not None]
    last = sorted(ended, key=lambda j: j.finished_at)[-n:][::-1]
    print(f"{first}'s last {len(last)} finishers (hours; submit and end from the trace's first arrival): "
          "policy: end / queued / suspended / running alone / running packed")
    print("job | GPUs | submit | " + " | ".join(tails))
    for job in last:
        cells = []
        for by_id, hours in tails.values():
            j = by_id.get(job.spec.id)
            h = hours.get(job.spec.id, {})
            end = f"{(j.finished_at - start) / 3600:.0f}" if j is not None and j.finished_at is not None else "-"
            cells.append(f"{end} / {h.get('QUEUED', 0):.0f} / {h.get('SUSPENDED', 0):.0f} / "
                         f"{h.get('RUNNING', 0):.0f} / {h.get('PACKED', 0):.0f}")
        print(f"{job.spec.id} | {job.spec.num_gpus} | {(job.spec.submit_time - start) / 3600:.0f} | " + " | ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
