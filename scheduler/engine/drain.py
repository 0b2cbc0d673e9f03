"""Taking a server out for maintenance: cordon, uncordon and drain (`gandiva cordon`,
`gandiva uncordon`, `gandiva drain`; docs/scheduler.md "Cordon and drain").

A cordoned server takes no job: the policy sees it unschedulable (ServerView.schedulable)
and puts nothing on it that is not there already; its jobs keep running. A draining
server is cordoned, and at every scheduling round the engine moves each job placed on
it off, at a mini-batch boundary: migrated to another server's free GPUs when there are
enough, else parked (checkpointed into its ramdisk and queued again: the policy places
it elsewhere and it resumes from that checkpoint). A queued job whose restore point is a
checkpoint on a draining server (a park's, or any re-queued job's) has that checkpoint
streamed to another up, uncordoned server, which holds it from then on: the server is
drained only once no job is placed there and no job's checkpoint is left there, so it can
be switched off without a job starting over from step 0. The marks
are columns of the server's row (the name's), so they outlive helper restarts and
re-registrations and scheduler restarts; every change is one transaction with its event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from migration_protocol.fast_path import MigrationTimeouts
from protos.gandiva.v1 import helper_pb2
from scheduler.engine.live_migration import vouch_transfer
from scheduler.errors import FailedPrecondition, GandivaError, NotFound
from scheduler.lifecycle import JobState
from scheduler.state import repo
from scheduler.state.models import Job, Server

if TYPE_CHECKING:
    from scheduler.engine.live import LiveEngine

log = logging.getLogger(__name__)

DRAIN_REASON = "draining server"
# A checkpoint that could not be moved off a draining server is tried again after this.
EVACUATE_RETRY_S = 30.0


@dataclass(frozen=True)
class Move:
    """What the drain does with one job on the server: "migrate" (``note``: where to),
    "park" (no other server has room for it now), "wait" (it cannot leave at a mini-batch
    boundary, or is busy with a command: ``note`` says which), "moving" (in flight),
    "checkpoint" (queued, its restore point on the server: streamed to another)."""

    job_id: str
    action: str
    note: str


async def _named(s, name: str) -> Server:  # type: ignore[no-untyped-def]
    """The server row, or NOT_FOUND naming the registered servers."""
    try:
        return await repo.get_server(s, name)
    except NotFound as err:
        known = [n for n, _ in await repo.helper_agents(s)]
        said = f"server {name!r} not found; the registered servers are: {', '.join(known) or 'none'} (gandiva get servers)"
        err.args = (said,)
        raise


async def set_cordon(engine: LiveEngine, name: str, cordon: bool, reason: str, drain: bool = False) -> None:
    """Cordon (``drain``: and drain) or uncordon ``name``, with its event, in one transaction.
    Doing again what is done already changes nothing and writes no event."""
    core = engine.core
    now = core.clock()
    async with core.tx() as s:
        server = await _named(s, name)
        if cordon:
            if server.cordoned and (server.draining or not drain) and not reason:
                return
            kind = "server.drain" if drain and not server.draining else "server.cordon"
            if not server.cordoned:
                server.cordoned_at = now
            server.cordoned = True
            server.cordon_reason = reason or server.cordon_reason
            server.draining = server.draining or drain
            what = ("draining: no job is placed there and its jobs are moved off" if server.draining
                    else "cordoned: no job is placed there; its jobs keep running")
            repo.add_event(s, now, kind, f"{what}{f' ({reason})' if reason else ''}", server=name)
        else:
            if not server.cordoned:
                return
            server.cordoned, server.draining, server.cordoned_at, server.cordon_reason = False, False, 0.0, ""
            repo.add_event(s, now, "server.uncordon", f"uncordoned: jobs are placed there again{f' ({reason})' if reason else ''}",
                           server=name)
    engine.drainer.noted.clear()
    core.poke()


class Drainer:
    """Moves the jobs off draining servers, one scheduling round at a time."""

    def __init__(self, engine: LiveEngine) -> None:
        self.engine = engine
        # (job id, what was said) already written as an event: each is said once.
        self.noted: set[tuple[str, str]] = set()
        # The move the drain started for each job still on it or holding a checkpoint there,
        # for DrainServer's answer: the first (a "wait" gives way to the move that follows).
        # A later pass's ("checkpoint": the parked job's checkpoint moved off) used to replace
        # it: the answer then said nothing of the park, done by a pass that began first.
        self.started: dict[str, Move] = {}
        self._drained: set[str] = set()  # draining servers already said empty
        # Checkpoints that could not be moved off a draining server: job id -> when to try again.
        self._retry_at: dict[str, float] = {}
        self._began = self._ended = 0  # passes begun and ended
        self._passed = asyncio.Condition()

    async def step(self) -> list[Move]:
        """One pass over every draining server: start a move for each job on it that has
        no command in flight. Run by the engine before each round's snapshot (so the GPUs a
        migration takes are held, by its row, before the policy looks) and only there: two
        passes at once would each start a move of the same job (seen: a migration and a
        park of one job, the migration failing)."""
        self._began += 1
        core = self.engine.core
        try:
            async with core.tx(read=True) as s:
                names = list(await s.scalars(select(Server.name).where(Server.draining.is_(True))))
            moves: list[Move] = []
            for name in names:
                moves += await self.drain_once(name)
            self._drained &= set(names)
            seen = {m.job_id for m in moves}
            self.noted = {n for n in self.noted if n[0] in seen}  # bounded: only jobs still there
            self.started = {j: m for j, m in self.started.items() if j in seen}
            return moves
        finally:
            async with self._passed:
                self._ended = self._began
                self._passed.notify_all()

    async def next_pass(self, name: str, timeout_s: float = 10.0) -> list[Move]:
        """Wait (up to ``timeout_s``) for a pass that begins after this call to end, and
        for the passes after it while a job there got no move (a command in flight); what
        they did on ``name``: each job there, with the move started for it."""
        # The jobs there now, and any placed there meanwhile. Read after the pass only, a
        # job whose park had already queued it (its shim quick to answer) was left out:
        # `gandiva drain` said "0 job(s) on it" and nothing of the park it had started.
        async with self.engine.core.tx(read=True) as s:
            jobs = {j.id: j.state for j in await repo.jobs_on_server(s, name)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            want = self._began + 1

            def ended(want: int = want) -> bool:
                return self._ended >= want

            self.engine.core.poke()
            async with self._passed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._passed.wait_for(ended), max(0.0, deadline - loop.time()))
            async with self.engine.core.tx(read=True) as s:
                there = list(await repo.jobs_on_server(s, name))
            jobs |= {j.id: j.state for j in there if j.id not in jobs}
            # A job the pass found with a command in flight (a periodic checkpoint, every
            # few seconds) got no move from it: the answer said "moving (running)" of a job
            # nothing was moving. The passes that follow start its move; waited for here.
            if loop.time() >= deadline or not any(
                    j.id not in self.started and j.state in (JobState.RUNNING.value, JobState.SUSPENDED.value)
                    for j in there):
                break
        return [self.started.get(job_id) or Move(job_id, "moving", state.lower()) for job_id, state in jobs.items()]

    async def drain_once(self, name: str) -> list[Move]:
        engine, core = self.engine, self.engine.core
        async with core.tx(read=True) as s:
            jobs = list(await repo.jobs_on_server(s, name))
            held = self.held(await repo.checkpoints_held_for(s, name))
        if not jobs and not held:
            if name not in self._drained:
                self._drained.add(name)
                async with core.tx() as s:
                    repo.add_event(s, core.clock(), "server.drained",
                                   "drained: no job is placed there and no job's checkpoint is left there", server=name)
            return []
        self._drained.discard(name)
        moves = []
        placed = {job.id for job in jobs}
        for job in [*jobs, *(j for j in held if j.id not in placed)]:
            move = await self._move(name, job) if job.id in placed else await self._evacuate(name, job)
            if move.action != "moving" and ((was := self.started.get(job.id)) is None or was.action == "wait"):
                self.started[job.id] = move
            moves.append(move)
            if (job.id, move.note) not in self.noted and move.action != "moving":
                self.noted.add((job.id, move.note))
                async with core.tx() as s:
                    repo.add_event(s, core.clock(), "job.drain", f"{move.action}: {move.note}", job_id=job.id, server=name)
        engine.core.poke()
        return moves

    async def _move(self, name: str, job: Job) -> Move:
        engine = self.engine
        if job.id in engine.inflight or job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
            return Move(job.id, "moving", f"{job.state.lower()}, a command in flight")
        if not job.suspendable:
            return Move(job.id, "wait", f"it cannot be stopped at a mini-batch boundary ({job.control_note}); "
                                        "it stays until it ends or is killed")
        if not job.migratable:
            return Move(job.id, "wait", "its loop does not resume from a restored step, so it cannot leave "
                                        "without losing its progress; it stays until it ends or is killed")
        target = await self._room_for(name, job)
        why = f"no other server has {job.gpus} free GPU(s)"
        if target:
            try:
                # Not waiting for a runtime reconnecting: the round (and `gandiva drain`'s
                # answer) would wait 10 s per job launched moments ago. Parked instead.
                await engine.operator_migrate(job.id, target, reason=f"{DRAIN_REASON} {name}", connect_wait_s=0.0)
                return Move(job.id, "migrate", f"to {target}")
            except GandivaError as err:
                log.info("drain of %s: job %s not migrated to %s: %s; parking it", name, job.id, target, err)
                # Said as it is: "no other server has 1 free GPU(s)" was the note of a job whose
                # move to a server with them free was refused (its runtime not connected yet).
                why = f"not migrated to {target} ({err})"
        engine._background(job.id, engine._park(job.id, f"{DRAIN_REASON} {name}: checkpointed and queued again"))
        return Move(job.id, "park", f"{why}: checkpointed and queued again; "
                                    "the scheduler resumes it from that checkpoint where it places it next")

    def held(self, jobs: Sequence[Job]) -> list[Job]:
        """Of repo.checkpoints_held_for's jobs, those the drain waits for: the queued ones,
        and those placed elsewhere while their checkpoint is fetched from the server (the
        fetch ends, or fails and queues the job again)."""
        return [j for j in jobs if j.state == JobState.QUEUED.value or j.id in self.engine.fetching]

    async def _evacuate(self, name: str, job: Job) -> Move:
        """Start streaming a queued job's restore point off the draining server ``name``."""
        engine = self.engine
        if job.id in engine.inflight:
            return Move(job.id, "moving", f"its checkpoint is being moved or fetched off {name}")
        if time.monotonic() < self._retry_at.get(job.id, 0.0):
            return Move(job.id, "wait", f"its checkpoint could not be moved off {name} yet; trying again shortly")
        target = await self._keeper_for(name)
        if target is None:
            return Move(job.id, "wait", f"its checkpoint is on {name} and no other up, uncordoned server can take "
                                        "it; it stays until one can")
        engine._background(job.id, self._carry(job.id, name, job.restore_checkpoint, target))
        return Move(job.id, "checkpoint", f"its checkpoint (step {job.restore_step}) is moved to {target.name}")

    async def _carry(self, job_id: str, holder: str, checkpoint: str, target: Server) -> None:
        """Have ``holder``'s helper stream ``checkpoint`` to ``target``; then, if the job is
        still queued with that restore point (compare and set: a job placed, killed or
        checkpointed again meanwhile keeps what it has), ``target``'s copy is its restore
        point and ``holder`` may drop its own (housekeeping)."""
        core = self.engine.core
        transfer = helper_pb2.TransferCheckpoint(job_id=job_id, checkpoint_path=checkpoint, dest_address=target.address,
                                                 checkpoint_name=f"drained-{int(core.clock())}")
        t0 = time.perf_counter()
        try:
            dest = await vouch_transfer(core, transfer)
            limits = MigrationTimeouts()
            result = await core.helpers.call(holder, helper_pb2.HelperCommand(transfer=transfer),
                                             limits.transfer_s + limits.answer_s, watch=dest)
            failure = "" if result.ok else result.message
        except GandivaError as err:
            failure, result = str(err) or err.__class__.__name__, None
        seconds = time.perf_counter() - t0
        now = core.clock()
        async with core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            keeper = await s.get(Server, target.name)
            if (failure or result is None) and keeper is not None and keeper.address != transfer.dest_address:
                # Its helper registered again at another address meanwhile (a machine back on
                # a new IP): the stream went to the old one, which says nothing of the keeper
                # or the link. The next pass streams to the new one; it used to wait 30 s.
                self._retry_at.pop(job_id, None)
                repo.add_event(s, now, "job.drain", f"wait: its checkpoint {checkpoint} could not be moved off "
                               f"{holder} to {target.name}: {target.name}'s helper moved from {transfer.dest_address} "
                               f"to {keeper.address} meanwhile ({failure}); trying again now", job_id=job_id, server=holder)
                return
            if failure or result is None:
                self._retry_at[job_id] = time.monotonic() + EVACUATE_RETRY_S
                repo.add_event(s, now, "job.drain", f"wait: its checkpoint {checkpoint} could not be moved off {holder} "
                               f"to {target.name} ({failure}); trying again in {EVACUATE_RETRY_S:.0f}s",
                               job_id=job_id, server=holder)
                return
            self._retry_at.pop(job_id, None)
            if (job.state != JobState.QUEUED.value or job.restore_server != holder
                    or job.restore_checkpoint != checkpoint):
                return  # placed, ended or checkpointed again meanwhile: the copy is pruned in time
            job.restore_checkpoint, job.restore_server = result.checkpoint_path, target.name
            repo.add_event(s, now, "job.checkpoint",
                           f"moved its checkpoint {checkpoint} off draining server {holder} to {target.name} "
                           f"({result.checkpoint_path}) in {seconds:.2f}s", job_id=job_id, server=holder)

    async def _free_elsewhere(self, name: str) -> list[tuple[Server, int]]:
        """Each up, uncordoned, not quarantined server other than ``name``, with its GPUs
        free now (no job placed, none held by a migration)."""
        async with self.engine.core.tx(read=True) as s:
            loads = await repo.server_loads(s)
            held: dict[str, set[int]] = {}
            for m in await repo.migrations(s):
                held.setdefault(m.dest_server, set()).update(m.dest_gpus)
        return [(ld.server, sum(1 for g in ld.gpus if not ld.jobs_by_gpu.get(g.index)
                                and g.index not in held.get(ld.server.name, ())))
                for ld in loads if ld.server.name != name and ld.server.up and not ld.server.cordoned
                and not self.engine.quarantined(ld.server.name)]

    async def _keeper_for(self, name: str) -> Server | None:
        """Where a checkpoint leaving ``name`` goes: the server with a helper agent and the
        most free GPUs (where a queued job most likely runs next)."""
        fits = [(-free, srv.name, srv) for srv, free in await self._free_elsewhere(name) if srv.address]
        return min(fits, key=lambda f: f[:2])[2] if fits else None

    async def _room_for(self, name: str, job: Job) -> str:
        """A server other than ``name`` with ``job.gpus`` free GPUs: the fullest that fits
        first (best fit)."""
        fits = [(free, srv.name) for srv, free in await self._free_elsewhere(name) if free >= job.gpus]
        return min(fits)[1] if fits else ""


def check_not_cordoned(server: Server) -> None:
    """An operator's migration onto a cordoned server is refused, naming why."""
    if server.cordoned:
        raise FailedPrecondition(f"server {server.name} is cordoned ({server.cordon_reason or 'no reason given'}); "
                                 f"`gandiva uncordon {server.name}` first")
