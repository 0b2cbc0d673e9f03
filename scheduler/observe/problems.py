"""What needs a person: one list of the cluster's problems, each with the command to run next.

`gandiva get problems` (the ``ListProblems`` call) and the dashboard's "Needs attention" list
show it. Everything is worked out from what the scheduler already keeps: its database's health
and its rounds (in memory), the servers' heartbeats, the launch quarantines, the hang watch,
each waiting job's expected turn, and the last hour's events and state changes. ``find`` is
the pure part (facts in, problems out); ``gather`` reads the facts.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scheduler.health import clock_text
from scheduler.unmoved import ENDED_UNMOVED, unmoved_end

# What counts as "again and again", and over how long.
WINDOW_S = 3600.0
REPEATED = 2
# A job whose next turn was said is late by this much past it (docs/observability.md: the
# turns said in `gandiva demo` were within 3 s for half, packing trials making a few 120 s early).
OVERDUE_S = 120.0
# A command to a job's runtime (suspend, resume, checkpoint, stop to move) waiting for its ack
# longer than this and UNANSWERED_STEPS of the job's mini-batches (it is obeyed at the next
# boundary; the engine gives up on it after the command timeout, 60 s by default).
UNANSWERED_S = 15.0
UNANSWERED_STEPS = 10
# The queue's first job waits this long while a server has room for it.
ROOM_WAIT_S = 60.0
# The latest events and state changes looked at for what repeats (see _read).
LOOKED_AT = 20000
# A database that could not write is shown for this long after its last refused write.
WRITE_FAILED_SHOWN_S = 300.0

# A re-queue that is the scheduler's own doing, not a failure: a park (probe slices, drain:
# "... (step 401, checkpoint /dev/shm/...)"), a stop with a checkpoint, a scheduler restart;
# or an operator's: a helper stopped cleanly (SIGTERM, `systemctl restart`: core.py's "not the
# job's failure"), whose jobs a rolling restart of the helpers re-queued once per server.
_NOT_A_FAILURE = re.compile(r"\(step -?\d+, checkpoint |^stopped with a checkpoint|^scheduler restarted"
                            r"|^its helper on \S+ stopped \(shutting down\)|^its server \S+ stopped its helper"
                            r"|^its process on \S+ was stopped mid-migration")


@dataclass(frozen=True)
class Problem:
    """``kind`` (a word scripts may match: server.down, job.stuck, ...), ``subject`` (a server's
    name or a job's id; "" for the scheduler itself), ``since`` (unix time it began, 0: unknown),
    ``what`` for people and ``next``: the command to run next."""

    kind: str
    subject: str
    since: float
    what: str
    next: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ServerFact:
    name: str
    up: bool
    last_heartbeat: float
    cordoned: bool
    gpus: int
    free: int  # GPUs with no job placed


@dataclass(frozen=True)
class JobFact:
    id: str
    name: str
    state: str
    gpus: int
    state_changed_at: float
    message: str = ""
    held: bool = False


@dataclass(frozen=True)
class WaitFact:
    """What the scheduler said of a waiting job at its last round (observe/waits.py)."""

    state: str
    place: int
    at: float | None
    text: str


@dataclass
class Facts:
    now: float
    database: Mapping[str, Any]  # DatabaseHealth.as_dict(), with round_age
    database_read: bool = True  # False: the database could not be read for the rest
    heartbeat_interval_s: float = 2.0
    down_after_s: float = 10.0
    command_timeout_s: float = 60.0
    servers: Sequence[ServerFact] = ()
    quarantined: Mapping[str, tuple[float, str]] = field(default_factory=dict)  # name -> (s left, why)
    jobs: Mapping[str, JobFact] = field(default_factory=dict)  # the jobs named below, by id
    hung: Mapping[str, float] = field(default_factory=dict)  # job id -> seconds without a mini-batch
    # Commands to runtimes waiting for their ack: (job id, kind, seconds, mini-batch time).
    unanswered: Sequence[tuple[str, str, float, float]] = ()
    waits: Mapping[str, WaitFact] = field(default_factory=dict)
    requeues: Sequence[tuple[str, float, str]] = ()  # (job id, at, reason), last hour
    pack_verdicts: Sequence[tuple[str, float, str]] = ()  # job.pack events (job id, at, message)
    migration_ends: Sequence[tuple[str, float, str]] = ()  # job.migration events


def _ago(now: float, at: float) -> str:
    from scheduler.cli.output import duration

    return duration(now - at)


def find(f: Facts) -> list[Problem]:
    """The problems these facts show, the scheduler's own first, then servers, then jobs."""
    out = _scheduler_problems(f) + _server_problems(f) + _stuck_jobs(f)
    return out + _repeated(f) if f.database_read else out


def _scheduler_problems(f: Facts) -> list[Problem]:
    db, out = f.database, []
    if not db.get("up", True):
        out.append(Problem("database.down", "", float(db.get("since") or 0.0), str(db.get("text") or ""),
                           "check that the database server answers (gandiva db current --db URL on the "
                           "scheduler's host); the scheduler retries by itself and catches up"))
    failed_at = float(db.get("write_failed_at") or 0.0)
    if failed_at and f.now - failed_at <= WRITE_FAILED_SHOWN_S:
        out.append(Problem("database.cannot_write", "", failed_at,
                           f"a write was refused at {clock_text(failed_at)}: {db.get('write_failed', '')}",
                           "free space on the database's disk, or fix its permissions or mount; "
                           "nothing is written meanwhile"))
    age = float(db.get("round_age") or 0.0)
    if db.get("up", True) and age > max(60.0, 30 * f.heartbeat_interval_s):
        rounds = db.get("rounds") or {}
        out.append(Problem("scheduler.rounds", "", f.now - age,
                           f"no scheduling round has completed for {_ago(f.now, f.now - age)} (skipped "
                           f"{rounds.get('skipped', 0)}, failed {rounds.get('failed', 0)} since it started)",
                           "read the scheduler's log (a round that failed is logged with its trace); "
                           "restart gandiva scheduler if it stays"))
    return out


def _server_problems(f: Facts) -> list[Problem]:
    out = []
    late_after = max(3 * f.heartbeat_interval_s, f.down_after_s / 2)
    for s in f.servers:
        silent = f.now - s.last_heartbeat
        if not s.up:
            out.append(Problem(
                "server.down", s.name, s.last_heartbeat,
                f"down: no heartbeat for {_ago(f.now, s.last_heartbeat)}" + (" (cordoned)" if s.cordoned else "")
                + "; its jobs went back to the queue",
                f"restart gandiva helper on {s.name}; what happened: gandiva get events --server {s.name} "
                "--kind server"))
        elif silent > late_after:
            out.append(Problem(
                "server.late", s.name, s.last_heartbeat,
                f"suspected: no heartbeat for {silent:.0f}s (it is called down after {f.down_after_s:g}s "
                "and its jobs re-queued)",
                f"check gandiva helper on {s.name} and the network to it; gandiva describe server {s.name}"))
    down = {s.name for s in f.servers if not s.up}
    for name, (left, why) in sorted(f.quarantined.items()):  # (kept in memory: said in an outage too)
        if name not in down:
            out.append(Problem(
                "server.quarantined", name, 0.0, f"{why}; no new job goes there for {left:.0f}s more",
                f"read its helper's log; gandiva get events --server {name} --kind server.launch_failed"))
    return out


def _stuck_jobs(f: Facts) -> list[Problem]:
    out = []
    for job in f.jobs.values():
        if job.state == "MIGRATING" and f.now - job.state_changed_at > f.command_timeout_s:
            out.append(Problem(
                "job.stuck", job.id, job.state_changed_at,
                f"{job.name}: MIGRATING for {_ago(f.now, job.state_changed_at)} (a migration's commands time out "
                f"after {f.command_timeout_s:g}s)" + (f"; {job.message}" if job.message else ""),
                f"gandiva get events --job {job.id} --kind job.migration; gandiva kill {job.id} if it stays"))
    for job_id, silent in sorted(f.hung.items()):
        out.append(Problem(
            "job.hung", job_id, f.now - silent,
            f"{f.jobs[job_id].name if job_id in f.jobs else job_id}: no mini-batch for {silent:.0f}s while its process lives "
            "(restarted from its checkpoint if it stays so)",
            f"gandiva logs {job_id}; gandiva kill {job_id} if it cannot go on"))
    for job_id, kind, waited, step_s in sorted(f.unanswered):
        name = f.jobs[job_id].name if job_id in f.jobs else job_id
        pace = f"its mini-batches took {step_s:.2g}s" if step_s > 0 else "it has timed no mini-batch yet"
        out.append(Problem(
            "job.unanswered", job_id, f.now - waited,
            f"{name}: its {kind.replace('_', ' ')} command has waited {waited:.0f}s for the job's next mini-batch "
            f"boundary ({pace}; given up after {f.command_timeout_s:g}s)",
            f"gandiva logs {job_id} (what it does now); gandiva describe job {job_id}"))
    servers = {s.name: s for s in f.servers}
    for job_id, w in sorted(f.waits.items()):
        if job_id not in f.jobs or f.jobs[job_id].state != w.state:
            continue
        job = f.jobs[job_id]
        if w.state == "SUSPENDED" and not job.held and w.at is not None and f.now - w.at > OVERDUE_S:
            out.append(Problem(
                "job.overdue", job_id, w.at,
                f"{job.name}: its turn was expected at {clock_text(w.at)}, {_ago(f.now, w.at)} ago, and it "
                f"is still suspended ({w.text})",
                f"gandiva describe job {job_id} (History: who ran meanwhile); gandiva resume {job_id} runs it now"))
        if w.state == "QUEUED" and w.place == 1 and f.now - job.state_changed_at > ROOM_WAIT_S:
            room = [s.name for s in servers.values() if s.up and not s.cordoned and s.name not in f.quarantined
                    and s.free >= job.gpus]
            if room:
                out.append(Problem(
                    "job.waiting", job_id, job.state_changed_at,
                    f"{job.name}: first in the queue for {_ago(f.now, job.state_changed_at)} while {room[0]} "
                    f"has {servers[room[0]].free} free GPU(s) for its {job.gpus}; its reason: "
                    f"{job.message or 'none given'}",
                    f"gandiva describe job {job_id}; gandiva get events --job {job_id} (what its launches "
                    f"met); gandiva describe server {room[0]}"))
    return out


def _counted(rows: Iterable[tuple[str, float, str]]) -> dict[str, tuple[int, float, str]]:
    """Job id -> (how many, first at, last message)."""
    seen: dict[str, tuple[int, float, str]] = {}
    for job_id, at, message in sorted(rows, key=lambda r: r[1]):
        n, first, _ = seen.get(job_id, (0, at, ""))
        seen[job_id] = (n + 1, first, message)
    return seen


def _repeated(f: Facts) -> list[Problem]:
    out = []
    name = {j.id: j.name for j in f.jobs.values()}
    failures = _counted(r for r in f.requeues if not _NOT_A_FAILURE.search(r[2]))
    for job_id, (n, first, last) in sorted(failures.items()):
        if n >= REPEATED:
            out.append(Problem(
                "job.failing", job_id, first,
                f"{name.get(job_id, job_id)}: sent back to the queue {n} times in the last hour; lately: {last}",
                f"gandiva logs {job_id}; gandiva describe job {job_id} (History); gandiva kill {job_id} "
                "to stop it"))
    undone = _counted(r for r in f.pack_verdicts if " is no gain" in r[2])
    pairs: set[frozenset[str]] = set()
    for job_id, (n, first, last) in undone.items():
        partner = last.removeprefix("packing trial with ").split(":", 1)[0]
        key = frozenset((job_id, partner))
        if n >= REPEATED and key not in pairs:
            pairs.add(key)
            out.append(Problem(
                "pack.undone", job_id, first,
                f"{name.get(job_id, job_id)}: packed with {partner} and undone {n} times in the last hour "
                f"(each trial cost both jobs its time); lately: {last}",
                f"gandiva describe job {job_id} (each trial's rates in its History)"))
    moved = _counted(r for r in f.migration_ends if unmoved_end(r[2]) in ENDED_UNMOVED and "before it moved" not in r[2])
    for job_id, (n, first, last) in sorted(moved.items()):
        out.append(Problem(
            "migration.failed", job_id, first,
            f"{name.get(job_id, job_id)}: {n} migration(s) failed in the last hour; lately: {last}",
            f"gandiva get events --job {job_id} --kind job.migration"))
    return out


def _why_quarantined(events: Sequence[Any]) -> dict[str, str]:
    latest: dict[str, str] = {}
    for e in events:
        latest[e.server] = e.message.split(": no new job", 1)[0]
    return latest


def in_memory(core: Any, engine: Any | None = None) -> Facts:
    """The facts the scheduler keeps in memory (its database's health and rounds, the hung
    jobs, the quarantines), for an answer that cannot wait for the database."""
    settings = core.settings
    quarantined = engine.quarantine_left() if engine is not None else {}
    return Facts(now=core.clock(), database={**core.db_health.as_dict(), "round_age": core.db_health.round_age()},
                 database_read=False, heartbeat_interval_s=settings.heartbeat_interval_s,
                 down_after_s=settings.down_after_s, command_timeout_s=settings.command_timeout_s,
                 quarantined={name: (left, f"{name} could not start jobs") for name, left in quarantined.items()},
                 hung=core.hangs.silent_for(), unanswered=core.runtimes.unanswered(UNANSWERED_S, UNANSWERED_STEPS))


async def gather(core: Any, engine: Any | None = None) -> Facts:
    """The facts as the scheduler has them now; those in memory only (``database_read``
    False) when the database cannot be read within DB_WAIT_S."""
    import asyncio

    from scheduler.errors import Unavailable
    from scheduler.observe.metrics import DB_WAIT_S

    facts = in_memory(core, engine)
    try:
        await asyncio.wait_for(_read(core, facts), DB_WAIT_S)
        facts.database_read = True
    except (Unavailable, TimeoutError):
        return in_memory(core, engine)  # with the outage as it stands now
    return facts


async def _read(core: Any, facts: Facts) -> None:
    from sqlalchemy import func, select

    from scheduler.state import repo
    from scheduler.state.models import Event, Job, Transition

    now, since = facts.now, facts.now - WINDOW_S
    hung = facts.hung
    waiting = {job_id: WaitFact(w.state, w.place, w.at, w.text) for job_id, w in list(core.waits.items())
               if (w.state == "SUSPENDED" and w.at is not None and now - w.at > OVERDUE_S)
               or (w.state == "QUEUED" and w.place == 1)}
    async with core.tx(read=True) as s:
        loads = await repo.server_loads(s)
        stuck = (await s.scalars(select(Job).where(Job.state == "MIGRATING"))).all()
        named = await repo.jobs_by_id(s, sorted(set(hung) | set(waiting) | {u[0] for u in facts.unanswered}))
        # The latest LOOKED_AT rows by their key (neither table is indexed by time, and the
        # dashboard asks every second): an hour with more is seen in part.
        last_t = await s.scalar(select(func.max(Transition.id))) or 0
        requeues = (await s.execute(
            select(Transition.job_id, Transition.at, Transition.reason)
            .where(Transition.id > last_t - LOOKED_AT, Transition.to_state == "QUEUED",
                   Transition.from_state.in_(("RUNNING", "SUSPENDED", "MIGRATING")),  # not its submission
                   Transition.at >= since))).all()
        last_e = await s.scalar(select(func.max(Event.id))) or 0
        events = (await s.scalars(
            select(Event).where(Event.id > last_e - LOOKED_AT, Event.at >= since,
                                Event.kind.in_(("job.pack", "job.migration", "server.launch_failed")))
            .order_by(Event.id))).all()
        counted = Counter(r.job_id for r in requeues)
        counted.update(e.job_id for e in events if e.job_id)
        more = [j for j, _ in counted.most_common(200) if j]
        named += await repo.jobs_by_id(s, more)
    facts.servers = [ServerFact(ld.server.name, ld.server.up, ld.server.last_heartbeat, ld.server.cordoned,
                                ld.server.num_gpus, ld.server.num_gpus - sum(1 for v in ld.jobs_by_gpu.values() if v))
                     for ld in loads]
    why = _why_quarantined([e for e in events if e.kind == "server.launch_failed"])
    facts.quarantined = {name: (left, why.get(name, said)) for name, (left, said) in facts.quarantined.items()}
    facts.jobs = {j.id: JobFact(j.id, j.name, j.state, j.gpus, j.state_changed_at or j.updated_at, j.message, j.held)
                  for j in [*stuck, *named]}
    facts.waits = waiting
    facts.requeues = [(r.job_id, r.at, r.reason) for r in requeues]
    by_kind: dict[str, list[tuple[str, float, str]]] = defaultdict(list)
    for e in events:
        by_kind[e.kind].append((e.job_id, e.at, e.message))
    facts.pack_verdicts = by_kind["job.pack"]
    facts.migration_ends = by_kind["job.migration"]
