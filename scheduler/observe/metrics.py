"""The scheduler's metrics (Prometheus), its decision log and its per-GPU timeline.

``SchedulerMetrics`` is the engine's observer when ``--http-listen`` is given. Counters
and histograms are fed as things happen (decisions, suspend/resume acks, migration
phases, RPCs, database transactions); gauges about the cluster (jobs by state, queue,
GPUs and height per server, per-job rates) are computed from the database at scrape
time, so they are never stale. Each scheduler has its own registry (tests run several
in one process).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import re
import time
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.health import DatabaseHealth
from scheduler.lifecycle import JobState, trains
from scheduler.observe.observer import Observer
from scheduler.policy import types as pt

# How long /metrics and the dashboard's JSON wait for the database before they answer
# without it (Prometheus gives a scrape 10 s; asyncpg's connect times out after 30 s).
DB_WAIT_S = 5.0
# Per-job series are bounded: only this many running jobs (fastest first) get one.
MAX_JOB_SERIES = 50
DECISION_LOG_SIZE = 2000
TIMELINE_S = 3600.0
# Decision kinds as operators name them; Queue decisions repeat every round and are not counted.
KINDS = {pt.Place: "place", pt.Suspend: "suspend", pt.Resume: "resume", pt.Pack: "pack",
         pt.Unpack: "unpack", pt.Migrate: "migrate", pt.Grow: "grow", pt.Shrink: "shrink", pt.Park: "park"}

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# A job's wait for its first start: seconds on an idle cluster, days on a busy one.
_WAITS = (1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0, 259200.0)


@dataclass
class DecisionRecord:
    id: int
    at: float
    # place, suspend, resume, pack, unpack, keep-pack, reject-pack, pack-void, migrate, grow, shrink;
    # not-done: one of them refused before it began (Observer.not_done)
    kind: str
    job: str
    gpus: tuple[str, ...]
    reason: str
    # Whether a change the policy tries was kept, once known (DecisionLog.settle): a pack
    # trial "kept", "undone" (unpacked: no gain), "rejected" or "void"; a move (migrate, grow,
    # shrink) "moved in 1.2s" ("grown in", "shrunk in"), "not done", "aborted", "failed" or
    # "restarted_at_source".
    # "" while not known yet, and for decisions that are not tried (place, suspend, ...).
    outcome: str = ""
    settled_at: float | None = None


# The decisions whose change is tried and then kept or not, and the later records that settle them.
TRIED = {"pack": ("keep-pack", "unpack", "reject-pack", "pack-void"), "migrate": ("not-done",),
         "grow": ("not-done",), "shrink": ("not-done",)}
SETTLES = {"keep-pack": "kept", "unpack": "undone", "reject-pack": "rejected", "pack-void": "void",
           "not-done": "not done"}


def said_of(kind: str, outcome: str) -> str:
    """A move's outcome as its decision says it: a grow or shrink that happened "grown in
    0.2s", "shrunk in 0.2s" (a migrate's "moved in 0.2s")."""
    done = {"grow": "grown", "shrink": "shrunk"}.get(kind)
    return f"{done}{outcome[5:]}" if done and outcome.startswith("moved ") else outcome


def moved_in(paused_s: float) -> str:
    """A move's outcome in the decision log: its pause, to the 0.1 s, read from the figure its
    arrival states ("training paused 0.25s", live_migration): said live from the pause itself,
    the log read back after a restart from that text said "moved in 0.2s" where live had said
    "moved in 0.3s" (a pause of 0.2549 s; 0.046 s: 0.1 read back, 0.0 live)."""
    return f"moved in {float(f'{paused_s:.2f}'):.1f}s"


def gpu_names(gpus: Sequence[pt.GpuRef]) -> tuple[str, ...]:
    return tuple(f"{g.server}/{g.index}" for g in gpus)


class DecisionLog:
    """The scheduler's recent decisions with their reasons, numbered for polling."""

    def __init__(self, size: int = DECISION_LOG_SIZE) -> None:
        self.records: collections.deque[DecisionRecord] = collections.deque(maxlen=size)
        self.last_id = 0
        self.open: dict[int, DecisionRecord] = {}  # tried changes not settled yet, by id

    def add(self, at: float, kind: str, job: str, gpus: tuple[str, ...], reason: str, partner: str = "") -> None:
        """``partner``: the other job of a packing verdict (the trial's pack was logged for
        either of the two)."""
        if kind in SETTLES:
            self.settle(at, job, tuple(k for k, ends in TRIED.items() if kind in ends), SETTLES[kind], partner)
        self.last_id += 1
        self.records.append(record := DecisionRecord(self.last_id, at, kind, job, gpus, reason))
        if kind in TRIED:
            self.open[record.id] = record
            if len(self.open) > len(self.records):  # (those the log no longer holds)
                for gone in [i for i in self.open if i <= self.last_id - len(self.records)]:
                    del self.open[gone]

    def settle_ended(self, at: float, unfinished: Container[str]) -> None:
        """A tried change whose job is no longer unfinished got no verdict or move end: the
        job ended first (a move's job that finished while its copy pre-warmed records no end
        of the move)."""
        for r in list(self.open.values()):
            if r.job not in unfinished:
                r.outcome, r.settled_at = "not kept: the job ended first", at
                del self.open[r.id]

    def settle(self, at: float, job: str, kinds: tuple[str, ...], outcome: str, partner: str = "") -> bool:
        """Give the latest unsettled decision of ``kinds`` about ``job`` (or ``partner``) its
        outcome. A pack is logged for the job placed beside the other (``trial: packed beside
        HOST, ...``): its verdict or unpack may name either."""
        jobs = {j for j in (job, partner) if j}
        for r in reversed(self.records):
            if r.kind not in kinds or r.outcome:
                continue
            pair = {r.job}
            if r.kind == "pack" and (host := re.search(r"beside ([^,\s]+),", r.reason)):
                pair.add(host[1])
            if jobs <= pair if len(pair) > 1 else job == r.job:
                r.outcome = said_of(r.kind, outcome)
                r.settled_at = at
                self.open.pop(r.id, None)
                return True
        return False

    def since(self, since: float, job: str = "") -> list[dict[str, Any]]:
        """The records at or after ``since`` (of ``job`` only, if given), oldest first."""
        return [asdict(r) for r in self.records if r.at >= since and (not job or r.job == job)]

    def after(self, after_id: int, limit: int = 500) -> list[dict[str, Any]]:
        # Ids are consecutive, so the first wanted record's position is known: only the
        # records returned are converted (the dashboard polls this every few seconds).
        skip = max(0, after_id - (self.last_id - len(self.records)))
        return [asdict(r) for r in itertools.islice(self.records, skip, skip + limit)]

    def last_for(self) -> dict[str, DecisionRecord]:
        out: dict[str, DecisionRecord] = {}
        for r in self.records:
            out[r.job] = r
        return out


class Timeline:
    """Per GPU, what ran on it and what waited on it (time-sliced), over the last hour.

    Fed by every scheduling round's snapshot; a segment grows while nothing changes."""

    def __init__(self, keep_s: float = TIMELINE_S) -> None:
        self.keep_s = keep_s
        # "server/index" -> segments [t0, t1, running job ids, waiting job ids, migrating ids]
        self.gpus: dict[str, list[list[Any]]] = {}
        # The first round this scheduler saw (None: none yet): what is before it was drawn
        # again from the GPUs' history, which knows the jobs on GPUs, not which GPUs were up.
        self.live_since: float | None = None
        # Per job training at the last round: the GPUs it trains on. A move of a running job
        # keeps it training at its source until its stop (its copy pre-warms on the others).
        self._trains_on: dict[str, tuple[str, ...]] = {}
        # Per job moved while running: the round its move was first seen. One that ends in the
        # queue is not counted as training (lifecycle.trains): its source GPUs read `moving`.
        self._moving_since: dict[str, float] = {}

    def record(self, snap: pt.ClusterSnapshot) -> None:
        now = snap.now
        if self.live_since is None:
            self.live_since = now
        current: dict[str, tuple[list[str], list[str], list[str]]] = {}
        for s in snap.servers:
            for i in range(s.num_gpus):
                if s.up:
                    current[f"{s.name}/{i}"] = ([], [], [])
                else:  # its row stays, but its time down is no GPU time seen (split: not idle)
                    self.gpus.setdefault(f"{s.name}/{i}", [])
        slot = {JobState.RUNNING.value: 0, JobState.SUSPENDED.value: 1, JobState.MIGRATING.value: 2}
        trains_on: dict[str, tuple[str, ...]] = {}
        for job in snap.jobs:
            k = slot.get(job.state)
            if job.id in self._moving_since and k != 2:
                since = self._moving_since.pop(job.id)
                if not trains(JobState.MIGRATING.value, JobState.RUNNING.value, job.state):
                    self._not_trained(job.id, self._trains_on.get(job.id, ()), since)
            if k is None:
                continue
            names = tuple(dict.fromkeys(gpu_names(job.placement)))
            if k == 0:
                trains_on[job.id] = names
            elif k == 2 and trains(job.state, JobState.RUNNING.value if job.id in self._trains_on else "", ""):
                # A move of a job that was training: it trains on at its source (its GPUs
                # then) until the stop that pauses it for a fraction of a second; the GPUs
                # its copy pre-warms on are the move's. Before session 53 all of them read
                # `moving` (the GPU-time split, the bars), while its log counted mini-batches.
                trains_on[job.id] = tuple(n for n in self._trains_on[job.id] if n in names)
                self._moving_since.setdefault(job.id, now)
            for name in names:
                current.setdefault(name, ([], [], []))[0 if name in trains_on.get(job.id, ()) else k].append(job.id)
        self._trains_on = trains_on
        self._moving_since = {j: at for j, at in self._moving_since.items() if j in trains_on}  # (ended: it trained)
        for name, (running, waiting, moving) in current.items():
            segs = self.gpus.setdefault(name, [])
            state = [sorted(running), sorted(waiting), sorted(moving)]
            # A gap (no rounds for a while) starts a new segment rather than bridging it.
            last = segs[-1] if segs and segs[-1][1] >= now - 30 else None
            if last is not None:
                last[1] = now  # the previous state lasted until now
                if last[2:] == state:
                    continue
            segs.append([now, now, *state])
            while segs and segs[0][1] < now - self.keep_s:
                segs.pop(0)

    def _not_trained(self, job_id: str, names: Sequence[str], since: float) -> None:
        """A move of a running job drawn training at its source (``names``) from ``since`` ended
        in the queue: `moving` there instead, as `gandiva get usage` and the timeline drawn
        again after a restart count it (lifecycle.trains: when its source stopped is not
        known). Before, the split counted such a move training (30 GPU-s of a 30-s move)
        where the busy GPU time of `get usage` did not."""
        for name in names:
            segs = self.gpus.get(name, [])
            for i in range(len(segs) - 1, -1, -1):
                seg = segs[i]
                if seg[1] <= since:
                    break
                if job_id not in seg[2]:
                    continue
                if seg[0] < since:  # (its part before the move stays as it was)
                    segs.insert(i, [seg[0], since, *(list(x) for x in seg[2:])])
                    seg[0] = since
                seg[2] = [j for j in seg[2] if j != job_id]
                seg[4] = sorted([*seg[4], job_id])

    def export(self, since: float = 0.0) -> dict[str, list[dict[str, Any]]]:
        return {
            name: [{"t0": s[0], "t1": s[1], "running": s[2], "waiting": s[3], "migrating": s[4]}
                   for s in segs if s[1] >= since and any(s[2:])]
            for name, segs in sorted(self.gpus.items())
        }

    def split(self, since: float, until: float) -> dict[str, float]:
        """The GPU time of [since, until] the timeline saw (``seen``: GPU-seconds), and how it
        was spent, each GPU's stretch by what was on it: ``training`` (one job running),
        ``packed`` (several running at once), ``moving`` (none running, a move holding it: a
        copy pre-warming or arriving), ``suspended`` (none running, jobs waiting their turn on it,
        or held) and ``idle`` (nothing). Since session 52: "how was the cluster's GPU time spent
        over the last hour?" (`gandiva top`, the page). ``since`` in the answer: the period's
        start, from this scheduler's first round at the earliest (before it, a restarted
        scheduler's timeline knows the jobs on GPUs, not which GPUs were up: a first try counted
        the hour before the demo's servers registered as idle)."""
        since = max(since, self.live_since if self.live_since is not None else until)
        out = dict.fromkeys(("seen", "training", "packed", "suspended", "moving", "idle"), 0.0)
        out["since"] = since
        for segs in self.gpus.values():
            for t0, t1, running, waiting, moving in segs:
                spent = min(t1, until) - max(t0, since)
                if spent <= 0:
                    continue
                kind = ("packed" if len(running) > 1 else "training" if running else "moving" if moving
                        else "suspended" if waiting else "idle")
                out[kind] += spent
                out["seen"] += spent
        return out


# A job's rate is sampled once per RATE_SAMPLE_S, and at each suspend or resume, for the last
# TIMELINE_S: 360 points a job and one per switch (the deque holds 361), about 100 bytes each.
RATE_SAMPLE_S = 10.0


class RateHistory:
    """Per job, its rate over the last hour against its rate alone, from the rounds'
    snapshots: (when, the runtime's rate while it trains, else 0: it makes no progress while
    suspended, queued again or stopped for a move; its rate alone then, or None). A job is
    followed from its first sample running (a round's snapshot holds unfinished jobs only: one
    that ended is in none, and its points age out). The dashboard's one-job view draws it
    (``/api/job``'s ``rates``).

    A MIGRATING job trains on at its source while its copy pre-warms (10-30 s a move in
    `gandiva demo`, until the stop that pauses it for a fraction of a second): a move of a job
    that was training counts as training, and so does one of a job that was not (suspended)
    once its mini-batches go on past those it had when first seen moving. Before session 52
    every MIGRATING sample was 0: the chart showed a job stopped through each move's pre-warm
    while its own log counted a thousand mini-batches."""

    def __init__(self, keep_s: float = TIMELINE_S, every_s: float | None = None) -> None:
        self.keep_s, self.every_s = keep_s, every_s or RATE_SAMPLE_S
        self.jobs: dict[str, collections.deque[tuple[float, float, float | None]]] = {}
        self._trimmed = 0.0
        # Per job MIGRATING now: (when its move began, its mini-batches when first seen moving,
        # whether it was training then).
        self._moving: dict[str, tuple[float, int, bool]] = {}

    def _trains(self, j: pt.JobView, was_training: bool) -> bool:
        if (j.rate or 0) <= 0:
            return False
        if j.state == JobState.RUNNING.value:
            return True
        if j.state != JobState.MIGRATING.value:
            return False
        began, steps, trained = self._moving.get(j.id, (None, 0, False))
        if began != j.last_state_change_at:  # a move seen for the first time: one of a job
            began, steps, trained = j.last_state_change_at, j.steps, was_training  # running
            self._moving[j.id] = (began, steps, trained)  # trains on until its stop
        return trained or j.steps > steps

    def record(self, snap: pt.ClusterSnapshot) -> None:
        now = snap.now
        for j in snap.jobs:
            points = self.jobs.get(j.id)
            running = self._trains(j, points is not None and bool(points) and points[-1][1] > 0)
            if j.state != JobState.MIGRATING.value:
                self._moving.pop(j.id, None)
            if points is None:
                if not running:
                    continue
                points = self.jobs[j.id] = collections.deque(maxlen=int(self.keep_s / self.every_s) + 1)
            elif points[-1][0] > now - self.every_s and (points[-1][1] > 0) == running:
                continue  # (a suspend or resume is sampled at once: a time slice shows whatever its length)
            points.append((now, (j.rate or 0.0) if running else 0.0, j.alone_rate))
        if now - self._trimmed >= self.every_s:  # the ended jobs' points age out
            self._trimmed = now
            for job_id in [k for k, v in self.jobs.items() if v[-1][0] < now - self.keep_s]:
                del self.jobs[job_id]
            alive = {j.id for j in snap.jobs}
            for job_id in [k for k in self._moving if k not in alive]:  # ended while moving
                del self._moving[job_id]

    def export(self, job_id: str) -> list[tuple[float, float, float | None]]:
        return list(self.jobs.get(job_id, ()))


class SchedulerMetrics(Observer):
    """Prometheus metrics, the decision log and the timeline of one scheduler."""

    def __init__(self, policy_state: Callable[[], Any] = lambda: None) -> None:
        self.registry = r = CollectorRegistry()
        self._policy_state = policy_state
        self.log = DecisionLog()
        self.timeline = Timeline()
        self.rates = RateHistory()
        self._verdict_seq = 0
        self.decisions = Counter("gandiva_decisions", "Decisions applied, by kind", ["kind"], registry=r)
        self.decision_seconds = Histogram(
            "gandiva_policy_decision_seconds", "Time the policy takes for one scheduling round",
            buckets=_FAST, registry=r)
        self.switch_seconds = Histogram(
            "gandiva_switch_seconds",
            "Suspend and resume commands, sent until acknowledged at a mini-batch boundary "
            "(command=resume is suspend-to-running)", ["command"], buckets=_SLOW, registry=r)
        self.migration_seconds = Histogram(
            "gandiva_migration_phase_seconds", "Duration of each migration phase", ["phase"],
            buckets=_SLOW, registry=r)
        self.fetch_seconds = Histogram(
            "gandiva_checkpoint_fetch_seconds",
            "A queued job's checkpoint streamed to the server it was placed on, before its launch",
            ["outcome"], buckets=_SLOW, registry=r)
        self.rpc_seconds = Histogram(
            "gandiva_rpc_seconds", "Unary gRPC calls served, by method and status code",
            ["method", "code"], buckets=_FAST, registry=r)
        self.db_seconds = Histogram(
            "gandiva_db_transaction_seconds", "Database transactions, begin to commit or rollback",
            ["mode"], buckets=_FAST, registry=r)
        self.queue_wait = Histogram(
            "gandiva_queue_wait_seconds", "Jobs first placed: from their submission to that first start "
            "(percentiles: histogram_quantile over its rate)", buckets=_WAITS, registry=r)
        self.jobs = Gauge("gandiva_jobs", "Jobs by state", ["state"], registry=r)
        self.queue_length = Gauge("gandiva_queue_length", "Jobs waiting for a placement", registry=r)
        self.longest_wait = Gauge("gandiva_queue_longest_wait_seconds",
                                  "How long the longest-waiting queued job has waited", registry=r)
        self.server_up = Gauge("gandiva_server_up", "1 when the server's helper heartbeats", ["server"], registry=r)
        self.server_cordoned = Gauge(
            "gandiva_server_cordoned", "1 while an operator has the server cordoned (no new job goes there), "
            "2 while it is drained (its jobs are being moved off)", ["server"], registry=r)
        self.server_gpus = Gauge("gandiva_server_gpus", "GPUs in the server", ["server"], registry=r)
        self.gpus_allocated = Gauge("gandiva_server_gpus_allocated", "GPUs with at least one job placed",
                                    ["server"], registry=r)
        self.gpus_oversubscribed = Gauge(
            "gandiva_server_gpus_oversubscribed", "GPUs shared by more than one job (time-sliced or packed)",
            ["server"], registry=r)
        self.height = Gauge("gandiva_server_height", "ceil(GPUs allocated, counting each sharing job / GPUs)",
                            ["server"], registry=r)
        self.job_rate = Gauge(
            "gandiva_job_minibatch_rate",
            f"Mini-batches per second of running jobs (the {MAX_JOB_SERIES} fastest)",
            ["job", "name"], registry=r)
        self.job_alone_rate = Gauge(
            "gandiva_job_alone_minibatch_rate",
            "Mini-batches per second of those running jobs while each was the one job running on its GPUs "
            "(this launch, these GPUs; the baseline of packing: scheduler/alone.py), where measured",
            ["job", "name"], registry=r)
        self.user_gpu_seconds = Gauge(
            "gandiva_user_gpu_seconds", "GPU time each user's jobs have had: seconds training x GPUs "
            "(running, and moved while running; a move under way counts once it ends)",
            ["user"], registry=r)
        self.user_gpus_running = Gauge(
            "gandiva_user_gpus_running", "GPUs each user's running jobs hold", ["user"], registry=r)
        self.hangs = Counter(
            "gandiva_job_hangs", "Verdicts on running jobs that made no progress: flagged (hung), "
            "moved_on (a flagged job's mini-batches end again), restarted (stopped and re-queued "
            "from its checkpoint, or failed after its last restart), not_exited (its program ended "
            "but its process lingers)", ["outcome"], registry=r)
        self.jobs_hung = Gauge("gandiva_jobs_hung", "Running jobs flagged hung now (no mini-batch "
                               "for their bound: docs/scheduler.md)", registry=r)
        self.job_series_dropped = Gauge(
            "gandiva_job_rate_series_dropped", "Running jobs left out of gandiva_job_minibatch_rate",
            registry=r)

    # ---- Observer hooks ---------------------------------------------------------

    def decided(self, snapshot: pt.ClusterSnapshot, decisions: Sequence[pt.Decision], seconds: float) -> None:
        self.decision_seconds.observe(seconds)
        self.timeline.record(snapshot)
        self.rates.record(snapshot)
        # The round's packing verdicts first: the policy judged its trials before it decided (a
        # pack kept, then ended by an unpack onto idle GPUs in the same round read "migrate ...
        # its kept pack ends" above the keep-pack that kept it, which was the job's last word).
        self._note_verdicts(snapshot.now)
        states = {j.id: j.state for j in snapshot.jobs}
        self.log.settle_ended(snapshot.now, states)  # (a round's snapshot: the unfinished jobs)
        for d in decisions:
            kind = KINDS.get(type(d))
            if kind is None:
                continue
            if kind == "place" and states.get(d.job_id) == JobState.SUSPENDED.value:
                kind = "pack"  # a suspended job placed beside a running one
            self.decisions.labels(kind).inc()
            gpus: Sequence[pt.GpuRef] = getattr(d, "gpus", None) or getattr(d, "to_gpus", None) or ()
            self.log.add(snapshot.now, kind, d.job_id, gpu_names(gpus), d.reason)

    def _note_verdicts(self, now: float) -> None:
        """The policy's verdicts on packing trials (GandivaState.verdicts): kept
        (keep-pack), no gain with nothing left to unpack (reject-pack: its partner had
        ended), void (pack-void); an undone pack is the Unpack decision already logged."""
        state = self._policy_state()
        verdicts = getattr(state, "verdicts", None)
        if verdicts is None:
            return
        for v in verdicts:
            if v.seq <= self._verdict_seq:
                continue
            self._verdict_seq = v.seq
            if v.unpacked:
                continue
            kind = {True: "keep-pack", False: "reject-pack", None: "pack-void"}[v.kept]
            self.decisions.labels(kind).inc()
            self.log.add(now, kind, v.job_id, (), f"with {v.partner_id}: {v.reason}", v.partner_id)

    def not_done(self, at: float, job_id: str, why: str) -> None:
        self.log.add(at, "not-done", job_id, (), why)

    def move_ended(self, at: float, job_id: str, phase: str, seconds: float) -> None:
        """A move's last phase: its decision (migrate, grow or shrink) was kept or not."""
        self.log.settle(at, job_id, ("migrate", "grow", "shrink"),
                        moved_in(seconds) if phase == "total" else phase)

    def started(self, waited_s: float) -> None:
        self.queue_wait.observe(max(0.0, waited_s))

    def switched(self, command: str, seconds: float) -> None:
        self.switch_seconds.labels(command).observe(seconds)

    def migration_phase(self, phase: str, seconds: float) -> None:
        self.migration_seconds.labels(phase).observe(seconds)

    def checkpoint_fetched(self, outcome: str, seconds: float) -> None:
        self.fetch_seconds.labels(outcome).observe(seconds)

    def hang(self, outcome: str) -> None:
        self.hangs.labels(outcome).inc()

    # ---- database transactions ------------------------------------------------

    def watch_engine(self, engine: Any, mode: str) -> None:
        """Time every transaction on a SQLAlchemy (async) engine, begin to commit/rollback."""
        from sqlalchemy import event

        sync = getattr(engine, "sync_engine", engine)
        hist = self.db_seconds.labels(mode)

        def begin(conn: Any) -> None:
            conn.info["gandiva_tx_t0"] = time.perf_counter()

        def end(conn: Any) -> None:
            t0 = conn.info.pop("gandiva_tx_t0", None)
            if t0 is not None:
                hist.observe(time.perf_counter() - t0)

        event.listen(sync, "begin", begin)
        event.listen(sync, "commit", end)
        event.listen(sync, "rollback", end)

    # ---- the scheduler's own health --------------------------------------------

    def watch_health(self, health: DatabaseHealth) -> None:
        """Export `health` (scheduler.health) at scrape time: it answers while the
        database does not."""
        self.registry.register(_HealthCollector(health))

    # ---- scrape-time gauges ---------------------------------------------------

    async def refresh(self, core: Any, timeout_s: float = DB_WAIT_S) -> None:
        """Recompute the gauges about the cluster from the database (one read transaction).
        With the database unreachable, or not answering within `timeout_s` (a network
        partition, a hung server: its connect timeout is 30 s, a scrape's 10 s), they are
        left out (no stale values); the rest of the metrics, gandiva_database_up among
        them, are still served."""
        from scheduler.errors import Unavailable

        try:
            await asyncio.wait_for(self._refresh(core), timeout_s)
        except (Unavailable, TimeoutError):
            for metric in (self.jobs, self.server_up, self.server_cordoned, self.server_gpus, self.gpus_allocated,
                           self.gpus_oversubscribed, self.height, self.job_rate, self.job_alone_rate,
                           self.user_gpu_seconds, self.user_gpus_running):
                metric.clear()
            for gauge in (self.queue_length, self.longest_wait, self.job_series_dropped):
                gauge.set(float("nan"))

    async def _refresh(self, core: Any) -> None:
        from sqlalchemy import func, select

        from scheduler.state import repo
        from scheduler.state.models import Job

        now = core.clock()
        async with core.tx(read=True) as s:
            counts = dict((await s.execute(select(Job.state, func.count()).group_by(Job.state))).all())
            oldest = (await s.execute(
                select(func.min(Job.state_changed_at)).where(Job.state == JobState.QUEUED.value))).scalar()
            running = (await s.execute(
                select(Job.id, Job.name, Job.rate).where(Job.state == JobState.RUNNING.value)
                .order_by(Job.rate.desc()).limit(MAX_JOB_SERIES + 1))).all()
            n_running = counts.get(JobState.RUNNING.value, 0)
            attained = (await s.execute(select(Job.user, func.sum(Job.attained_service_s)).group_by(Job.user))).all()
            # The running stretch of each running job is not in attained_service_s yet.
            stretches = (await s.execute(select(Job.user, Job.gpus, Job.state_changed_at)
                                         .where(Job.state == JobState.RUNNING.value))).all()
            loads = await repo.server_loads(s)
        for st in JobState:
            self.jobs.labels(st.value.lower()).set(counts.get(st.value, 0))
        self.jobs_hung.set(len(core.hangs.flagged()))
        self.queue_length.set(counts.get(JobState.QUEUED.value, 0))
        self.longest_wait.set(max(0.0, now - oldest) if oldest else 0.0)
        for metric in (self.server_up, self.server_cordoned, self.server_gpus, self.gpus_allocated, self.gpus_oversubscribed,
                       self.height, self.job_rate, self.job_alone_rate, self.user_gpu_seconds, self.user_gpus_running):
            metric.clear()  # servers and jobs that are gone leave no stale series
        for ld in loads:
            name = ld.server.name
            self.server_up.labels(name).set(1 if ld.server.up else 0)
            self.server_cordoned.labels(name).set(2 if ld.server.draining else 1 if ld.server.cordoned else 0)
            self.server_gpus.labels(name).set(ld.server.num_gpus)
            self.gpus_allocated.labels(name).set(sum(1 for v in ld.jobs_by_gpu.values() if v))
            self.gpus_oversubscribed.labels(name).set(sum(1 for v in ld.jobs_by_gpu.values() if len(v) > 1))
            self.height.labels(name).set(ld.height)
        alone = core.alone_rates.latest
        for job_id, name, rate in running[:MAX_JOB_SERIES]:
            self.job_rate.labels(job_id, name).set(rate or 0.0)
            if alone.get(job_id):
                self.job_alone_rate.labels(job_id, name).set(alone[job_id])
        self.job_series_dropped.set(max(0, n_running - MAX_JOB_SERIES))
        gpu_s = {user: float(total or 0.0) for user, total in attained}
        held: dict[str, int] = {}
        for user, gpus, since in stretches:
            gpu_s[user] = gpu_s.get(user, 0.0) + max(0.0, now - since) * gpus if since else gpu_s.get(user, 0.0)
            held[user] = held.get(user, 0) + gpus
        for user, total in gpu_s.items():
            self.user_gpu_seconds.labels(user).set(total)
            self.user_gpus_running.labels(user).set(held.get(user, 0))


class _HealthCollector:
    """gandiva_database_up, gandiva_database_down_seconds, gandiva_scheduling_rounds_total
    and gandiva_last_round_age_seconds, read from the scheduler's DatabaseHealth."""

    def __init__(self, health: DatabaseHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        h, now = self.health, self.health.clock()
        yield GaugeMetricFamily("gandiva_database_up", "1 while the scheduler's database answers, 0 while it "
                                "is unreachable", value=1.0 if h.up else 0.0)
        yield GaugeMetricFamily("gandiva_database_down_seconds", "How long the database has been unreachable "
                                "(0 while it answers)", value=0.0 if h.up else max(0.0, now - h.down_since))
        rounds = CounterMetricFamily(
            "gandiva_scheduling_rounds", "Scheduling rounds by outcome: ok, skipped (the database could not "
            "be reached: nothing decided), failed (an error, logged)", labels=["outcome"])
        for outcome, n in h.rounds.items():
            rounds.add_metric([outcome], float(n))
        yield rounds
        yield GaugeMetricFamily("gandiva_last_round_age_seconds", "Seconds since the last scheduling round that "
                                "completed (before the first: since the scheduler started)", value=h.round_age())


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every call with one answer by method and status code (streams are
    long-lived; not timed). A call refused for its token is one too: the auth interceptor
    answers it with a stream_unary handler that never reads the request."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        self.hist = metrics.rpc_seconds

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.response_streaming:
            return handler
        inner, method, hist = handler.unary_unary or handler.stream_unary, details.method, self.hist

        async def timed(request: Any, context: Any) -> Any:
            t0 = time.perf_counter()
            code = "OK"
            try:
                result = inner(request, context)
                if inspect.isawaitable(result):
                    result = await result
                return result
            except BaseException:
                code = "ERROR"
                raise
            finally:
                got = context.code()
                if isinstance(got, grpc.StatusCode) and got is not grpc.StatusCode.OK:
                    code = got.name
                hist.labels(method, code).observe(time.perf_counter() - t0)

        make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
        return make(timed, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
