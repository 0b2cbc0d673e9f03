"""The live engine: snapshot the cluster from SQL, ask the policy, apply its
decisions through the helpers and the job shims.

The policy is the same pure code the simulator drives (scheduler/policy). This
module is the live side of the seam: it turns decisions into transactions,
helper commands (launch, stop) and runtime commands (suspend, resume).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from migration_protocol.fast_path import MigrationResult, MigrationTimeouts, Outcome
from protos.gandiva.v1 import helper_pb2, runtime_pb2
from scheduler.alone import JobRow
from scheduler.core import JobDetail, SchedulerCore, new_incarnation, spec_of
from scheduler.engine.drain import Drainer, check_not_cordoned
from scheduler.engine.live_migration import (
    OPERATOR_CONNECT_WAIT_S,
    begin_migration,
    not_connected,
    recover_migrations,
    vouch_transfer,
)
from scheduler.errors import (
    Busy,
    FailedPrecondition,
    GandivaError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from scheduler.hangs import HUNG, HUNG_RESTARTS, Verdict
from scheduler.hubs import command_word, remember
from scheduler.lifecycle import ACTIVE, JobState
from scheduler.observe.observer import Observer
from scheduler.observe.waits import TurnCache, waits
from scheduler.policy import types as pt
from scheduler.policy.migration import HAND_OVER
from scheduler.state import repo
from scheduler.state.models import Job, JobProfile, Server
from scheduler.unmoved import NOT_STARTED

log = logging.getLogger(__name__)

# A job whose progress reports brought new mini-batches this many times while a suspend went
# unanswered trained on through it (an obeying shim stops at its next boundary: one or two).
DISOBEYED_RISES = 5
# Mini-batches a job may report past the step at which it acked a suspend (a report in flight).
SUSPENDED_STEPS_SLACK = 2
# Entries of LiveEngine._suspended kept before those of jobs no longer suspended are pruned.
SUSPENDED_KEPT = 100_000

# Refused moves remembered (LiveEngine._moves_refused), the oldest out beyond: jobs long ended
# among them. (All were cleared at once: each job still refused had its refusal said again.)
MOVES_REFUSED_KEPT = 10_000
# Fetches of a checkpoint that may fail in a row before the job starts from step 0 instead.
MAX_FETCH_TRIES = 3
# A server whose helper failed a launch for a reason of its own (its disk full, no process
# could be started) gets no new job for this long; then a launch tries it again.
LAUNCH_QUARANTINE_S = 60.0
# After this many refusals in a row by a fetch's destination (TRANSFER_FAULT_DEST_REFUSED)
# the job starts from step 0 (as after MAX_FETCH_TRIES other failures): the policy may have
# had nowhere else to place it.
MAX_DEST_REFUSALS = 10
# How a helper older than HelperCommandResult.transfer_fault words the two faults (its
# transfer command): read only when the field is unset, so that such a helper still works
# during an upgrade. A helper that sets the field may word its message as it likes.
_OLD_DEST_REFUSED = "could not send the checkpoint to the helper at"
_OLD_HOLDER_LACKS = re.compile(r"^transfer: checkpoint directory .* (does not exist|is empty)$")


def transfer_fault(fault: int, message: str) -> int:
    """Why a transfer failed (helper_pb2.TransferFault): the field its holder's helper
    set, else (a helper older than the field) what its words say."""
    if fault:
        return fault
    if _OLD_DEST_REFUSED in message:
        return helper_pb2.TRANSFER_FAULT_DEST_REFUSED
    if _OLD_HOLDER_LACKS.search(message):
        return helper_pb2.TRANSFER_FAULT_CHECKPOINT_MISSING
    return helper_pb2.TRANSFER_FAULT_UNSPECIFIED


def _unusual(indices: tuple[int, ...], num_gpus: int) -> tuple[int, ...]:
    """A server's registered GPU indices for the policy's view when they are not
    0..num_gpus-1 (a helper registered again without a GPU that failed), else () (the usual
    case, so that the view stays what it was). Placing by count only put new jobs on GPU 0
    of a server whose helper had registered index 1 alone: the GPU that had failed."""
    return () if indices == tuple(range(num_gpus)) else indices


# How often an operator's migration waiting for a runtime (OPERATOR_CONNECT_WAIT_S) reads its
# job again: a job killed or ended meanwhile is answered within this.
CONNECT_WAIT_SLICE_S = 0.5


class LiveEngine:
    def __init__(
        self,
        core: SchedulerCore,
        policy_name: str = "gandiva",
        config: pt.PolicyConfig | None = None,
        tick_s: float = 1.0,
        scheduler_address: str = "",
    ) -> None:
        from scheduler.policy import get_policy

        self.core = core
        self.policy_name = policy_name
        self.policy = get_policy(policy_name, config)
        cfg = self.policy.config
        core.host_memory_budget = (cfg.host_memory_use, cfg.job_host_memory_bytes)
        self.tick_s = tick_s
        # At most this often a round, however many wake-ups arrive in between.
        self.min_gap_s = 0.2
        # After a round that took T seconds, the next waits at least round_pause * T.
        self.round_pause = 1.0
        # How long a round waits for suspensions before placing onto the same GPUs.
        self.vacate_timeout_s = 10.0
        self.scheduler_address = scheduler_address
        # Jobs with a command in flight: the policy's next decisions about them wait.
        self.inflight: set[str] = set()
        # Jobs being parked (checkpointing, then exiting): no hand-over is decided meanwhile.
        self._parking: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._watches: set[asyncio.Task] = set()  # runtime-connect deadlines of launches
        # Failed fetches of a job's checkpoint from the server that holds it, in a row.
        self._fetch_failures: dict[str, int] = {}
        # Jobs placed whose checkpoint is being fetched from another server: job -> that server
        # (a drain of that server waits for the fetch to end).
        self.fetching: dict[str, str] = {}
        self._dest_refusals: dict[str, int] = {}  # fetches refused by their destination, in a row
        # The policy's last move of each job refused before it began, as said (_policy_move):
        # the same refusal again (a move decided each round) is not said again.
        self._moves_refused: dict[str, str] = {}
        # job id -> (the down server holding its checkpoint, the fence `place` set for it):
        # once that server is up again the job is looked at in the next round, not when
        # the fence (a heartbeat timeout) ends. Only that very fence is lifted.
        self._holder_waits: dict[str, tuple[str, float]] = {}
        # job id -> its restore point, once a launch could not read it through a shared root
        # while the server holding it was down: from then on it is fetched from that server,
        # or waited for as a fetch is (_restore_plan's `shared`), not read there again.
        self._shared_unreadable: dict[str, str] = {}
        self._stopping = False
        # job id -> (when its server's helper first reported it missing, that server):
        # lost processes are requeued. Pruned on every heartbeat of that server.
        self.missing_since: dict[str, tuple[float, str]] = {}
        # job id -> the queueing reason last written, so unchanged reasons cost nothing.
        self._queue_reason: dict[str, str] = {}
        self._held: set[str] = set()
        self._turns: TurnCache = {}  # each time-slice group's turns, worked out (observe/waits.py)
        # job id -> (launch, when its last periodic checkpoint started, or when that launch
        # was first seen running): kept while the launch is suspended (time slices).
        self._checkpointed: dict[str, tuple[str, float]] = {}
        # Jobs whose command in flight is a periodic checkpoint: it moves nothing, so unlike
        # a launch or a migration it is no reason to think a helper's silence is not a loss.
        self._checkpointing: set[str] = set()
        self._checkpoints_checked = float("-inf")  # when checkpoint_due last looked
        self._hangs_checked = float("-inf")  # when watch_hangs last looked (monotonic)
        # Jobs recorded suspended by their shim's ack: (that launch, the highest step it had
        # reported then). One that reports higher steps before its resume did not suspend.
        # A job that leaves SUSPENDED other than by _resume (killed, re-queued, moved) leaves
        # its entry: past SUSPENDED_KEPT entries, those are pruned (_prune_suspended).
        self._suspended: dict[str, tuple[str, int]] = {}
        self._prune_suspended_at = SUSPENDED_KEPT
        # Server -> until when (monotonic) no job is placed there: its helper failed a launch
        # for a reason of its own (its disk full, no process could be started).
        self._quarantined: dict[str, float] = {}
        # job id -> (the row it was built from, its JobView), reused while unchanged.
        self._views: dict[str, tuple[tuple, pt.JobView]] = {}
        # The last packing verdict (GandivaState.verdicts' seq) written to the event history.
        self._verdict_seq = 0
        # Moves the jobs off draining servers (gandiva drain), before each round's snapshot.
        self.drainer = Drainer(self)

    @property
    def observer(self) -> Observer:
        """Metrics, the decision log and the timeline (gandiva scheduler --http-listen):
        the core's, so the engine, its migrations and the core report to one observer."""
        return self.core.observer

    @observer.setter
    def observer(self, observer: Observer) -> None:
        self.core.observer = observer

    # ---- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        stalls = asyncio.create_task(self.core.watch_stalls())
        try:
            await self._run()
        finally:
            stalls.cancel()

    async def _run(self) -> None:
        try:
            await self.recover()
        except GandivaError as err:
            log.warning("recovery after start skipped: %s", err)
        while not self._stopping:
            began = time.monotonic()
            health = self.core.db_health
            try:
                await self.core.mark_stale_servers_down()
                await self.tick()
                await self.checkpoint_due()
                await self.watch_hangs()
            except GandivaError as err:
                log.warning("scheduling round skipped: %s", err)
                health.round_ended("skipped")
            except Exception:  # a bug in one round must not stop scheduling for good
                log.exception("scheduling round failed")
                health.round_ended("failed")
            else:
                health.round_ended("ok")
            took = time.monotonic() - began
            try:
                await asyncio.wait_for(self.core.wake.wait(), self.tick_s)
            except asyncio.TimeoutError:
                pass
            # A short pause batches a burst of submissions into one round instead of
            # one round per submission; after a long round, a pause as long as it (at
            # most a tick), so that under load rounds take no more than about half of
            # the event loop from the calls it serves (a round is mostly work on the loop).
            await asyncio.sleep(min(self.tick_s, max(self.min_gap_s, self.round_pause * took)))
            self.core.wake.clear()

    def _note_waits(self, snap: pt.ClusterSnapshot, decided: Sequence[pt.Decision]) -> None:
        """Where each waiting job stands, from the state the policy just decided from
        (scheduler/observe/waits.py): GetJob, ListJobs and the page show it. What this
        round decided is left out until a round whose snapshot shows it carried out."""
        try:
            # Its rounds come every tick: on average half a tick after the time a switch is due.
            self.core.waits = waits(self.policy, snap, self._held, decided, self._turns, self.tick_s / 2)
        except Exception:  # a bug in what is shown must not stop scheduling
            log.exception("computing the waiting jobs' places failed")
            self.core.waits = {}

    async def stop(self, grace_s: float = 5.0) -> None:
        """Finish: no new rounds; commands in flight get up to ``grace_s`` to complete."""
        self._stopping = True
        self.core.poke()
        for watch in self._watches:
            watch.cancel()
        if self._tasks and grace_s > 0:
            await asyncio.wait(self._tasks, timeout=grace_s)

    async def tick(self) -> list[pt.Decision]:
        await self.drainer.step()
        snap = await self.snapshot()
        # Jobs with a command in flight, and jobs an operator suspended, are left alone.
        skip = self.inflight | self._held
        t0 = time.perf_counter()
        raw = self.policy.decide(snap)
        decisions = [d for d in raw if d.job_id not in skip
                     # A job grows only once its runtime reported its first training step:
                     # the pre-warmed destination needs its tower count (to refuse a
                     # one-tower-per-device program before the source stops) and its
                     # first run (to rehearse). Until then the policy asks again each round.
                     and not (isinstance(d, pt.Grow) and not self.core.runtimes.towers(d.job_id))
                     # A server handed over by parking its jobs (balance_park) is handed
                     # over once they have left: until then the snapshot shows them where
                     # they were, and a hand-over decided from it could take the other
                     # count's last server too (CI saw it under load). The policy looks
                     # again after defrag_interval_s.
                     and not (self._parking and (d.reason or "").startswith(HAND_OVER))]
        # A queued job placed onto GPUs whose job has not left them yet is not started
        # this round; it is told why (job -> its queue message), as a queued job is.
        deferred: dict[str, str] = {}
        decisions = self._not_onto_leaving_gpus(snap, raw, decisions, deferred)
        self.observer.decided(snap, decisions, time.perf_counter() - t0)
        self._note_waits(snap, raw)
        await self._note_verdicts()
        queued = [d for d in decisions if isinstance(d, pt.Queue)]
        queued += [pt.Queue(job_id, why) for job_id, why in deferred.items()]
        # Only jobs still queued keep a remembered reason: the map stays bounded. (Only
        # those told to queue this round, before: a deferred start's note was forgotten
        # and written again every round it stayed deferred.)
        waiting = {j.id for j in snap.jobs if j.state == JobState.QUEUED.value}
        self._queue_reason = {j: r for j, r in self._queue_reason.items() if j in waiting}
        if queued:
            await self._note_queued(queued)
        # Suspensions first, and waited for (briefly): a job placed or resumed on the
        # same GPUs must find their memory released, not share it for a moment.
        # A parked job leaves its GPUs too (it checkpoints and exits).
        vacate = (pt.Suspend, pt.Unpack, pt.Park)

        def vacated(d: pt.Decision) -> asyncio.Task:
            return self._background(d.job_id, self._park(d.job_id, d.reason or "parked") if isinstance(d, pt.Park)
                                    else self._suspend(d.job_id, d.reason or "time slice over"))

        # A job placed in this very round and suspended at once (time-sliced with a
        # newcomer placed beside it) holds no GPU yet: nothing to wait for. Its suspend
        # follows its launch, reading that launch's incarnation and waiting for its shim.
        # Before, it was sent first and waited for a shim not launched yet: every placement
        # of the round waited vacate_timeout_s (10 s of idle GPUs), and the suspend of a job
        # re-queued from an earlier launch waited for that launch's shim, which never came.
        placed = {d.job_id for d in decisions if isinstance(d, (pt.Place, pt.Pack))}
        views = {j.id: j for j in snap.jobs}
        leaving = [(d, vacated(d)) for d in decisions if isinstance(d, vacate) and d.job_id not in placed]
        vacating = {task: {g.server for g in views[d.job_id].placement} if d.job_id in views else set()
                    for d, task in leaving}
        if vacating:
            await self._wait_vacated(vacating)
            deferred.clear()
            decisions = self._not_onto_unvacated_gpus(views, leaving, decisions, deferred)
            if deferred:
                await self._note_queued([pt.Queue(job_id, why) for job_id, why in deferred.items()])
        for d in decisions:
            if not isinstance(d, (pt.Queue, *vacate)):
                await self.apply(d)
        for d in decisions:
            if isinstance(d, vacate) and d.job_id in placed:
                vacated(d)
        return decisions

    @staticmethod
    def _not_onto_unvacated_gpus(views: dict[str, pt.JobView], leaving: Sequence[tuple[pt.Decision, asyncio.Task]],
                                 decisions: list[pt.Decision], deferred: dict[str, str]) -> list[pt.Decision]:
        """Leave out a Place/Pack/Resume onto the GPUs of a job whose suspend, unpack or
        park of this round failed (refused, its shim gone) or is still unanswered: that
        job's process still holds them. Before, its time-slice partner was started all the
        same once the wait ended, and both ran on one GPU, unknown to the policy, which
        decides the switch again next round."""
        held: dict[pt.GpuRef, str] = {}
        for d, task in leaving:
            done = task.done() and not task.cancelled() and task.result()
            if not done and d.job_id in views:
                held.update((g, d.job_id) for g in views[d.job_id].placement)
        return LiveEngine._starts_not_onto(held, decisions, "has not left it (its suspension failed or is unanswered)",
                                           deferred)

    async def _wait_vacated(self, vacating: dict[asyncio.Task, set[str]]) -> None:
        """Wait for the round's suspensions and parks (each task: its job's servers), up to
        vacate_timeout_s; no longer once every one still unanswered is on a server silent
        past the heartbeat timeout (its link cut just as it was told: nothing answers). The
        round then goes on and the next one calls that server down. Before, the round, and
        so the down check (run between rounds) and every other placement, waited the whole
        vacate_timeout_s: a cut-off server was called down that much after its timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.vacate_timeout_s
        pending = set(vacating)
        while pending and (left := deadline - loop.time()) > 0:
            _, pending = await asyncio.wait(pending, timeout=min(left, 0.25))
            if pending and all(vacating[task] and all(map(self.core.silent, vacating[task])) for task in pending):
                cut = {server for task in pending for server in vacating[task]}
                log.warning("not waiting any longer for %d suspension(s) on %s, silent past the heartbeat timeout",
                            len(pending), ", ".join(sorted(cut)))
                return

    @staticmethod
    def _not_onto_leaving_gpus(snap: pt.ClusterSnapshot, raw: Sequence[pt.Decision],
                               decisions: list[pt.Decision], deferred: dict[str, str]) -> list[pt.Decision]:
        """Leave out this round's starts (Place, Pack, Resume, and a Migrate or Grow onto
        them) onto GPUs that a migration, grow or shrink the policy decided in the same
        round (`raw`) is leaving: its process holds them until the move has checkpointed and
        restarted it (seconds; a server's link cut mid-move, until the server is called
        down), or for good when the move is not applied (its job has a command in flight...)
        or fails (restarted at its source). The policy sees a migrating job on its source
        GPUs until the move has ended, and places (or moves) a job there then. Likewise
        onto the GPUs of a job whose suspend, unpack or park of this round is not applied
        (left out of `decisions`): the policy decides the switch again next round."""
        views = {j.id: j for j in snap.jobs}
        applied = {id(d) for d in decisions}
        leaving: dict[pt.GpuRef, str] = {}
        for d in raw:
            if isinstance(d, (pt.Migrate, pt.Grow, pt.Shrink)) and d.job_id in views:
                target = set(d.to_gpus if isinstance(d, pt.Migrate) else d.gpus)
                leaving.update((g, d.job_id) for g in views[d.job_id].placement if g not in target)
            elif isinstance(d, (pt.Suspend, pt.Unpack, pt.Park)) and id(d) not in applied and d.job_id in views:
                # Not applied (its job has a command in flight: a periodic checkpoint at a
                # time slice's end): the job stays on its GPUs. Its partner's resume used to
                # be applied all the same, both then running on one GPU until the end.
                leaving.update((g, d.job_id) for g in views[d.job_id].placement)
        return LiveEngine._starts_not_onto(leaving, decisions, "is leaving it, or was to", deferred)

    @staticmethod
    def _starts_not_onto(held: dict[pt.GpuRef, str], decisions: list[pt.Decision], why: str,
                         deferred: dict[str, str]) -> list[pt.Decision]:
        """`decisions` without the starts (Place, Pack, Resume; a Migrate or Grow: a move
        lands there) onto a GPU of `held` (GPU -> the job whose process still holds it; a
        balance_sizes hand-over moves suspended jobs onto the server it frees in the same
        round, and those used to land beside the leaving job, or stay beside it for good
        when its move failed: two jobs on each GPU, in no time-slice group the policy
        rotates), each left out said in the log with `why`, and
        a queued job's (Place) also in `deferred` (job -> what its user is told: before, it
        showed QUEUED for up to a time slice with the reason it had waited for before, or
        none, while the dashboard said it had been placed)."""
        if not held:
            return decisions
        kept: list[pt.Decision] = []
        for d in decisions:
            lands = (d.gpus if isinstance(d, (pt.Place, pt.Pack, pt.Resume, pt.Grow))
                     else d.to_gpus if isinstance(d, pt.Migrate) else ())
            if onto := [g for g in lands if g in held and held[g] != d.job_id]:
                where = ", ".join(f"{g.server}/{g.index}" for g in onto)
                log.info("job %s: not %s %s yet: job %s %s (%s)", d.job_id,
                         "moved onto" if isinstance(d, (pt.Migrate, pt.Grow)) else "started on", where,
                         held[onto[0]], why, d.reason or "")
                if isinstance(d, pt.Place):
                    deferred[d.job_id] = (f"placed on {where} ({d.reason or 'the policy'}), not started yet: "
                                          f"job {held[onto[0]]} {why}")
                continue
            kept.append(d)
        return kept

    async def snapshot(self) -> pt.ClusterSnapshot:
        now = self.core.clock()
        # Built off the event loop: with thousands of queued jobs building the views took
        # tens of milliseconds, which every call arriving meanwhile waited for (on a
        # thread the loop waits at most the interpreter's switch interval at a time).
        rows = await self.core.read_sync(repo.snapshot_rows)
        hung = self.core.hangs.flagged()  # on the loop: the watch changes there
        mono = self.core.monotonic()
        self._quarantined = {name: until for name, until in self._quarantined.items() if until > mono}
        # Kept while their fences hold (on the monotonic clock): dropped at a wall clock's step
        # forward, a job whose checkpoint's server came back sat out its whole fence.
        self._holder_waits = {j: w for j, w in self._holder_waits.items()
                              if self.core.fence_holds(j, w[1], now, mono)}
        return await asyncio.get_running_loop().run_in_executor(
            None, self._build_snapshot, rows, now, hung, frozenset(self._quarantined), mono)

    def _build_snapshot(self, rows: repo.SnapshotRows, now: float,
                        hung: frozenset[str] | set[str] = frozenset(),
                        quarantined: frozenset[str] = frozenset(), mono: float | None = None) -> pt.ClusterSnapshot:
        """The policy's view of the rows (on a worker thread; only this engine's rounds,
        one at a time, touch the view cache). A job flagged hung (`hung`) cannot reach a
        mini-batch boundary: the policy sees it as not suspendable, so it sends it no
        suspend, pack, move or grow it could not obey (scheduler/hangs.py)."""
        server_rows, jobs, profiles = rows.servers, rows.jobs, rows.profiles
        self._held = {j.id for j in jobs if j.held}
        placements: dict[str, list[pt.GpuRef]] = {}
        for p in rows.placements:
            placements.setdefault(p.job_id, []).append(pt.GpuRef(p.server_name, p.gpu_index))
        # A migration holds its destination GPUs from its first phase on: the policy
        # sees them as the migrating job's, so no other job is placed on them.
        for m in rows.migrations:
            held = placements.setdefault(m.job_id, [])
            held.extend(g for g in (pt.GpuRef(m.dest_server, i) for i in m.dest_gpus) if g not in held)
        # A fenced job waits until an older copy of it has surely stopped (lease expiry), or
        # for the down server holding its checkpoint: until it is up again.
        up = {name for name, _, is_up, _, _, _ in server_rows if is_up}
        mono = self.core.monotonic() if mono is None else mono
        jobs = [j for j in jobs if not (j.state == JobState.QUEUED.value
                                        and self.core.fence_holds(j.id, j.fenced_until, now, mono)
                                        and not self._holder_back(j.id, j.fenced_until, up))]
        # A server whose helper could not start a job (its disk full...) or take a checkpoint
        # gets no new job for a while (LAUNCH_QUARANTINE_S): the policy sees it down while
        # nothing is placed there, else unschedulable, as if cordoned (its jobs run on, keep
        # their turns, and nothing new goes there). Only "down" used to be said, so a server
        # running a job took every other: one whose agent no peer could reach (a one-way
        # partition) was given a job to fetch ten times, then the job started over from step 0.
        holding = {g.server for held in placements.values() for g in held} if quarantined else set()
        servers = tuple(
            pt.ServerView(name=name, num_gpus=num_gpus, up=up and (name not in quarantined or name in holding),
                          gpu_memory_bytes=memory or 16 * pt.GIB, host_memory_bytes=host_memory or 0,
                          schedulable=not cordoned and name not in quarantined,
                          gpu_indices=_unusual(rows.gpu_indices.get(name, ()), num_gpus))
            for name, num_gpus, up, memory, host_memory, cordoned in server_rows
        )
        placed = {j.id: tuple(sorted(placements.get(j.id, ()))) for j in jobs}
        alone = self.core.alone_rates.observe(now, (
            JobRow(j.id, j.incarnation, j.state, j.state_changed_at, tuple((g.server, g.index) for g in placed[j.id]))
            for j in jobs))
        views: dict[str, tuple[tuple, pt.JobView]] = {}
        for j in jobs:
            gpus = placed[j.id]
            prof = profiles.get(j.id)
            key = (tuple(j), gpus,
                   prof and (prof.memory_max, prof.utilization, prof.step_time_s, prof.host_memory_bytes),
                   j.id in hung, alone.get(j.id))
            cached = self._views.get(j.id)
            # An unchanged job keeps its very JobView object: cheaper here, and the
            # policy skips re-syncing views it has already seen.
            view = cached[1] if cached is not None and cached[0] == key else \
                _job_view(j, gpus, prof, j.id in hung, alone.get(j.id))
            views[j.id] = (key, view)
        self._views = views
        return pt.ClusterSnapshot(now=now, servers=servers, jobs=tuple(v for _, v in views.values()))

    async def checkpoint_due(self) -> None:
        """Start a checkpoint of every running, migratable job whose last one (or whose
        start) is older than the checkpoint interval; each runs in the background."""
        interval = self.core.settings.checkpoint_interval_s
        if interval <= 0:
            return
        now = self.core.clock()
        # Looked for at most once a second (or interval), not every round: it reads every running job.
        if now - self._checkpoints_checked < min(1.0, interval):
            return
        self._checkpoints_checked = now
        jobs = await self.core.read_sync(repo.running_job_rows)
        live = {j.id for j in jobs}
        # A launch not running now (suspended, or gone) is forgotten only after a while.
        keep = max(10 * interval, 3600.0)
        self._checkpointed = {j: v for j, v in self._checkpointed.items() if j in live or now - v[1] < keep}
        hung = self.core.hangs.flagged()  # a command would wait for a boundary that never comes
        for job in jobs:
            launch, since = self._checkpointed.get(job.id, ("", 0.0))
            # One launch keeps its clock across its suspensions: before, every resume
            # restarted it, so a job time-sliced in slices shorter than the interval (the
            # 60 s quantum, 300 s interval) was never checkpointed, and lost every step
            # since its start with its server. A new launch starts it.
            last = since if launch == job.incarnation else job.state_changed_at
            if job.migratable and job.id not in self.inflight and job.id not in hung and now - last >= interval:
                self._checkpointed[job.id] = (job.incarnation, now)
                self._background(job.id, self._checkpoint(job.id, job.incarnation))
            elif launch != job.incarnation:
                self._checkpointed[job.id] = (job.incarnation, last)

    async def watch_hangs(self) -> None:
        """At most once a second: judge the running jobs' progress (scheduler/hangs.py)
        and act on each verdict: flag a job hung, note that a flagged one moved on, or
        stop a job hung for long and re-queue it from its restore point."""
        hangs = self.core.hangs
        if not hangs.watches:
            return
        mono = self.core.monotonic()
        if mono - self._hangs_checked < 1.0:
            return
        self._hangs_checked = mono
        rows = await self.core.read_sync(repo.running_job_rows)
        running = {row.id: row.incarnation for row in rows}
        for verdict in hangs.judge(running, self._views.keys() | running.keys()):
            try:
                await self._on_hang(verdict)
            except GandivaError as err:
                log.warning("job %s: hang verdict %s not recorded: %s", verdict.job_id, verdict.action, err)

    async def _on_hang(self, v: Verdict) -> None:
        settings = self.core.settings
        now = self.core.clock()
        took = f"its mini-batches take {v.interval_s:.3g}s" if v.interval_s else "its mini-batch time not measured"
        stops: list[str] = []
        async with self.core.tx() as s:
            job = await repo.get_job(s, v.job_id, for_update=True)
            if job.incarnation != v.incarnation or job.state != JobState.RUNNING.value:
                return
            server = await repo.last_server(s, job.id)
            if v.action == "moved_on":
                note = f"moves on: a mini-batch ended after {v.silent_s:.0f}s without one (it was flagged hung)"
            elif v.action == "not_exited":
                note = (f"its program ended {v.silent_s:.0f}s ago (it closed its Gandiva runtime) but its "
                        "process has not exited (a thread that is not a daemon? its wrapper script going "
                        f"on?): it keeps its GPUs until it exits (gandiva kill {job.id} stops it)")
            elif v.action == "flag":
                then = (f"it is stopped and restarted from its checkpoint if none ends within "
                        f"{settings.hang_restart_after_s:.0f}s more" if settings.hang_restart_after_s > 0
                        else "it is only flagged (--hang-restart-after 0)")
                note = (f"hung? no mini-batch for {v.silent_s:.0f}s ({took}; judged hung after {v.bound_s:.0f}s): "
                        f"its process lives and holds its GPUs, and cannot be suspended or moved; {then}")
            else:
                restarts = await repo.transitions_with_reason(s, job.id, HUNG)
                what = f"{HUNG}no mini-batch for {v.silent_s:.0f}s ({took}; judged hung after {v.bound_s:.0f}s)"
                stops = [server] if server else []
                if restarts < HUNG_RESTARTS:
                    where = (f"resumes from its checkpoint {job.restore_checkpoint}" if job.restore_checkpoint
                             else "starts again from step 0 (no checkpoint)")
                    note = f"{what}: stopped; it {where} (restart {restarts + 1} of {HUNG_RESTARTS}; then it fails)"
                    await self.core.requeue_fenced(s, job, now, note, now + settings.down_after_s)
                else:
                    note = f"{what}, {HUNG_RESTARTS + 1} times: stopped (its output: gandiva logs {job.id})"
                    await repo.finish(s, job, JobState.FAILED, now, note)
            if v.action != "restart":
                job.message = note
            repo.add_event(s, now, "job.hung", note, job_id=job.id, server=server)
        (log.info if v.action == "moved_on" else log.warning)("job %s: %s", v.job_id, note)
        self.observer.hang({"flag": "flagged", "moved_on": "moved_on", "restart": "restarted",
                            "not_exited": "not_exited"}[v.action])
        if v.action == "restart":
            self.core.hangs.forget(v.job_id)
            # Commands still waiting for its boundary (a suspend sent before the flag) end now.
            self.core.runtimes.fail_pending(v.job_id, v.incarnation, "its launch was stopped: hung")
            for server in stops:
                self.core.stop_on(server, v.job_id, v.incarnation, "hung: no mini-batch")
        self.core.poke()

    async def _where(self, job_id: str) -> tuple[Job, Server | None]:
        """The job's row and the server it runs on (its first GPU's), None if it holds none."""
        async with self.core.tx(read=True) as s:
            job = await repo.get_job(s, job_id)
            placement = (await repo.placements_of(s, [job_id])).get(job_id, [])
            server = await repo.get_server(s, placement[0].server_name) if placement else None
        return job, server

    async def _checkpoint(self, job_id: str, incarnation: str) -> None:
        """One periodic checkpoint, into the job's server's ramdisk under a name that
        carries the launch's incarnation (swapped atomically by the shim each time);
        recorded as the job's restore point only if that launch is still current."""
        job, server = await self._where(job_id)
        if server is None:
            return
        directory = posixpath.join(server.ramdisk, job_id, f"periodic-{incarnation}")
        self._checkpointing.add(job_id)
        try:
            ack = await self.core.runtimes.call(
                job_id, runtime_pb2.COMMAND_KIND_CHECKPOINT, self.core.settings.command_timeout_s,
                checkpoint_dir=directory, reason="periodic checkpoint", incarnation=incarnation)
        finally:
            self._checkpointing.discard(job_id)
        self._checkpointed[job_id] = (incarnation, self.core.clock())  # the next one an interval after this one
        if not ack.ok:
            log.warning("periodic checkpoint of %s failed: %s", job_id, ack.message)
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state != JobState.RUNNING.value:
                return  # moved or ended meanwhile: this checkpoint is not its latest
            if not ack.ok:
                # Said where users look (a full ramdisk failed every one, in the scheduler's
                # log only: a job lost later redid everything since its last good one).
                kept = (f"its restore point stays step {job.restore_step} ({job.restore_checkpoint})"
                        if job.restore_checkpoint else "it has no checkpoint to resume from")
                repo.add_event(s, self.core.clock(), "job.checkpoint_failed",
                               f"periodic checkpoint at step {ack.step} failed: {ack.message}; {kept}",
                               job_id=job_id, server=server.name)
                return
            if not job.migratable:
                return  # found not migratable meanwhile: it cannot resume from it (core.record_migratability)
            job.restore_checkpoint, job.restore_server = ack.checkpoint_path or directory, server.name
            job.restore_step = max(0, ack.step)
            job.steps = max(job.steps, ack.step)
            repo.add_event(s, self.core.clock(), "job.checkpoint", f"step {ack.step} at {job.restore_checkpoint}",
                           job_id=job_id, server=server.name)

    async def recover(self) -> None:
        """On start: give every server a full heartbeat timeout to reach this scheduler,
        and finish every migration a previous scheduler left unfinished."""
        async with self.core.tx() as s:
            await repo.reset_heartbeats(s, self.core.clock())
        await recover_migrations(self.core)

    # ---- applying decisions -----------------------------------------------------

    async def apply(self, d: pt.Decision) -> None:
        """Start, resume or move a job. Queue and Suspend/Unpack decisions are handled
        by tick() itself (batched, and awaited before GPUs are reused); jobs in flight
        or held by an operator never get here."""
        if isinstance(d, (pt.Place, pt.Pack)):
            job = await self._job(d.job_id)
            if job.state == JobState.QUEUED.value:
                await self.place(d.job_id, d.gpus, d.reason or "placed")
            elif job.state == JobState.SUSPENDED.value:
                self._background(d.job_id, self._resume(d.job_id, d.reason or "packed"))
        elif isinstance(d, pt.Resume):
            self._background(d.job_id, self._resume(d.job_id, d.reason or "time slice"))
        elif isinstance(d, (pt.Migrate, pt.Grow, pt.Shrink)):
            gpus = d.to_gpus if isinstance(d, pt.Migrate) else d.gpus
            self._background(d.job_id, self.migrate(d.job_id, gpus, d.reason or type(d).__name__.lower()))

    def _background(self, job_id: str, coro: Awaitable[object]) -> asyncio.Task:
        self.inflight.add(job_id)

        async def run() -> bool:
            """Whether the command was carried out (False: it failed, and said why)."""
            try:
                await coro
                return True
            except GandivaError as err:
                log.warning("job %s: %s", job_id, err)
            except Exception:
                log.exception("job %s: command failed", job_id)
            finally:
                self.inflight.discard(job_id)
                self.core.poke()
            return False

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _job(self, job_id: str) -> Job:
        async with self.core.tx(read=True) as s:
            return await repo.get_job(s, job_id)

    async def _note_verdicts(self) -> None:
        """Write the policy's new verdicts on packing trials to the event history (kind
        ``job.pack``, one event on each job of the pair), so that `gandiva describe job`
        and `gandiva get events` say whether a pack helped, with the measured rates, also
        after a restart has emptied the dashboard's in-memory decision log."""
        verdicts = getattr(getattr(self.policy, "state", None), "verdicts", None)
        new = [v for v in verdicts or () if v.seq > self._verdict_seq]
        if not new:
            return
        async with self.core.tx() as s:
            for v in new:
                for job_id, other in ((v.job_id, v.partner_id), (v.partner_id, v.job_id)):
                    repo.add_event(s, v.at, "job.pack", f"packing trial with {other}: {v.reason}", job_id=job_id,
                                   server=await repo.last_server(s, job_id))
        self._verdict_seq = new[-1].seq

    async def _note_queued(self, decisions: Sequence[pt.Queue]) -> None:
        """Tell users why their jobs wait. Only reasons that changed since the last
        round are written: one UPDATE per distinct reason, in one transaction."""
        changed: dict[str, list[str]] = {}
        for d in decisions:
            if self._queue_reason.get(d.job_id) != d.reason:
                changed.setdefault(d.reason, []).append(d.job_id)
        if not changed:
            return
        await self.core.write_sync(lambda conn: repo.set_queued_messages(conn, changed))
        for reason, ids in changed.items():
            for job_id in ids:
                self._queue_reason[job_id] = reason

    def _holder_back(self, job_id: str, fenced_until: float, up: set[str]) -> bool:
        """The job's fence is the one `place` set to wait for its checkpoint's server, and
        that server is up again (`up`: the servers up)."""
        holder, fence = self._holder_waits.get(job_id, ("", 0.0))
        return holder in up and fence == fenced_until

    async def place(self, job_id: str, gpus: Sequence[pt.GpuRef], reason: str) -> None:
        """Bind a queued job to `gpus` and have the primary server's helper launch it."""
        now = self.core.clock()
        incarnation = new_incarnation()
        waiting = self.core.old_copy_wait(job_id)
        if waiting:
            await self._note_queued([pt.Queue(job_id, waiting)])
            return
        if len({g.server for g in gpus}) > 1:
            # No launch spans servers yet: never start a job on part of its GPUs.
            await self._note_queued([pt.Queue(job_id, "needs GPUs on more than one server; "
                                              "multi-server launches are not supported")])
            return
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.state != JobState.QUEUED.value:
                return
            if self.core.fence_holds(job_id, job.fenced_until, now):
                holder, _ = self._holder_waits.get(job_id, ("", 0.0))
                srv = await s.get(Server, holder) if holder else None
                if srv is None or not srv.up or not self._holder_back(job_id, job.fenced_until, {srv.name}):
                    return
                job.fenced_until = 0.0  # the server holding its checkpoint is back: no more waiting
            self._holder_waits.pop(job_id, None)
            self._queue_reason.pop(job_id, None)
            where = ", ".join(f"{g.server}/{g.index}" for g in gpus)
            restore = await _restore_plan(s, job, gpus[0].server, now, self.core.settings.checkpoint_wait_s,
                                          heard_ago=self.core.heard_ago,
                                          shared=self._shared_unreadable.get(job_id) != job.restore_checkpoint)
            if restore.wait_until:
                # Not placed: not to be looked at again until its checkpoint's server is back
                # (the next round after it is up; else rechecked every heartbeat timeout, as
                # after a scheduler restart), then at most until the wait ends.
                job.fenced_until = min(restore.wait_until, now + self.core.settings.down_after_s)
                self.core.note_fence(job_id, job.fenced_until, now)
                job.message = restore.note
                self._holder_waits[job_id] = (job.restore_server, job.fenced_until)
                return
            if (restore.path or restore.fetch_from) and 0 < job.restore_step < job.steps:
                # It counts from its checkpoint's step, not from where its lost process was
                # (progress reports never lower the count: it showed the old one until passed).
                where += f"; from its checkpoint's step {job.restore_step} (it was at {job.steps})"
                job.steps = job.restore_step
                job.metrics = {}  # (the lost process's, of a later step: a loss beside the step it restarts at)
            if restore.path:
                where += f", resuming from {restore.path}"
            elif restore.fetch_from:
                where += f", fetching its checkpoint from {restore.fetch_from} first"
            elif restore.note:
                where += f"; {restore.note}"
            if not restore.fetch_from and not restore.path:
                # Starts from step 0. A job that resumes keeps its restore point until its
                # next checkpoint (the holder keeps it; a job lost before then resumes there).
                job.restore_checkpoint, job.restore_server, job.restore_step = "", "", 0
                if job.steps:
                    # Its step count starts over with it (progress reports never lower it:
                    # it showed the lost process's count until the new one passed it).
                    where += f"; no checkpoint: it starts over, its step count with it (it was at {job.steps})"
                    job.steps = 0
                    job.metrics = {}  # (its loss with it: "step 0 / 4,000" read beside the loss of step 291)
            first_wait = now - job.submitted_at if not job.started_at else None  # its first start
            await repo.place(s, job, [(g.server, g.index) for g in gpus], incarnation, now, f"{reason} on {where}")
        if first_wait is not None:
            self.observer.started(first_wait)
        if restore.fetch_from:
            self.fetching[job_id] = restore.fetch_from
            self._background(job_id, self._fetch_and_launch(
                job_id, tuple(gpus), incarnation, restore.fetch_from, job.restore_checkpoint, restore.dest_address))
        else:
            self._forget_fetches(job_id)
            self.launch(job, gpus, incarnation, restore_checkpoint=restore.path)

    async def _fetch_and_launch(self, job_id: str, gpus: tuple[pt.GpuRef, ...], incarnation: str, holder: str,
                                checkpoint: str, dest_address: str) -> None:
        try:
            await self._fetch_then_launch(job_id, gpus, incarnation, holder, checkpoint, dest_address)
        finally:
            if self.fetching.get(job_id) == holder:
                del self.fetching[job_id]

    async def _fetch_then_launch(self, job_id: str, gpus: tuple[pt.GpuRef, ...], incarnation: str, holder: str,
                                 checkpoint: str, dest_address: str) -> None:
        """Have `holder`'s helper stream the job's checkpoint (its restore point, in that
        server's ramdisk) to the server the job was just placed on, then launch it from the
        copy: a parked or re-queued job resumes at its step wherever it is placed, as a
        migration would carry it. The job stays in flight meanwhile. A fetch that fails
        re-queues the job, its restore point kept, for another try once `holder` had time
        to come back or be found down; after MAX_FETCH_TRIES in a row it starts from step 0."""
        transfer = helper_pb2.TransferCheckpoint(
            job_id=job_id, checkpoint_path=checkpoint, dest_address=dest_address,
            checkpoint_name=f"resume-{incarnation}")
        t0 = time.perf_counter()
        try:
            dest = await vouch_transfer(self.core, transfer)
            limits = MigrationTimeouts()  # the holder's answer after its stream's own limit counts
            result = await self.core.helpers.call(
                holder, helper_pb2.HelperCommand(transfer=transfer), limits.transfer_s + limits.answer_s, watch=dest)
            failure = "" if result.ok else result.message
            fault = transfer_fault(result.transfer_fault, failure) if failure else 0
        except GandivaError as err:  # the holder down, its stream gone, no answer in time
            failure = str(err) or err.__class__.__name__
            fault = 0
        seconds = time.perf_counter() - t0
        self.observer.checkpoint_fetched("failed" if failure else "fetched", seconds)
        now = self.core.clock()
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state != JobState.RUNNING.value:
                return  # killed or moved meanwhile: the copy is pruned in time
            dest_name = gpus[0].server
            if fault == helper_pb2.TRANSFER_FAULT_DEST_REFUSED and (
                    (dest_now := await s.get(Server, dest_name)) is not None and dest_now.address != dest_address):
                # The destination's helper registered again at another address meanwhile (a
                # machine back on a new IP): the stream went to the old one. Not that server's
                # fault, nor the checkpoint's: it used to be quarantined for a minute and the
                # job resumed elsewhere. Placed again now, the next stream goes to the new one.
                why = (f"could not fetch its checkpoint {job.restore_checkpoint} from {holder}: {dest_name}'s helper "
                       f"moved from {dest_address} to {dest_now.address} meanwhile ({failure}); trying again")
                await repo.requeue(s, job, now, why)
                log.warning("job %s: %s", job_id, why)
                return
            refusals = (self._dest_refusals.get(job_id, 0) + 1
                        if fault == helper_pb2.TRANSFER_FAULT_DEST_REFUSED else 0)
            if 0 < refusals < MAX_DEST_REFUSALS:
                # The holder read the checkpoint; the destination could not take it (its
                # ramdisk full, unreachable from the holder). Not the checkpoint's fault: it
                # is kept (three such refusals used to start the job over from step 0, the
                # policy placing it on the same full server each time), and that server gets
                # no new job for a while, so the job resumes elsewhere. Bounded all the same,
                # in case the policy has nowhere else to put it.
                self._dest_refusals[job_id] = refusals
                self._quarantine(s, now, dest_name, f"{dest_name} could not take a checkpoint ({failure})")
                why = (f"could not fetch its checkpoint {job.restore_checkpoint} from {holder}: {dest_name} could not "
                       f"take it ({failure}); its checkpoint is kept, and no new job is placed there for "
                       f"{LAUNCH_QUARANTINE_S:.0f}s")
                await self.core.requeue_fenced(s, job, now, why, now + self.core.settings.down_after_s)
                log.warning("job %s: %s", job_id, why)
                return
            self._dest_refusals.pop(job_id, None)
            if failure:
                # The holder says it has no such checkpoint (its helper restarted with an
                # empty ramdisk): asking again cannot help (as a launch from a checkpoint
                # not found on its own server starts from 0 at once). It used to be asked
                # three times, the job waiting a heartbeat timeout after each.
                gone = fault == helper_pb2.TRANSFER_FAULT_CHECKPOINT_MISSING
                tries = MAX_FETCH_TRIES if refusals or gone else self._fetch_failures.get(job_id, 0) + 1
                self._fetch_failures[job_id] = tries
                why = f"could not fetch its checkpoint {job.restore_checkpoint} from {holder}: {failure}"
                if tries >= MAX_FETCH_TRIES:
                    self._fetch_failures.pop(job_id, None)
                    job.restore_checkpoint, job.restore_server, job.restore_step = "", "", 0
                    why += (f" ({holder} no longer has it)" if gone else f" ({refusals or tries} tries)") + \
                        "; it starts from step 0 when placed next"
                    fence = 0.0
                else:
                    fence = now + self.core.settings.down_after_s
                    why += f" (try {tries} of {MAX_FETCH_TRIES}); trying again in {fence - now:.0f}s"
                await self.core.requeue_fenced(s, job, now, why, fence)
                log.warning("job %s: %s", job_id, why)
                return
            self._forget_fetches(job_id)
            repo.add_event(s, now, "job.checkpoint",
                           f"fetched {job.restore_checkpoint} from {holder} to {result.checkpoint_path} "
                           f"in {seconds:.2f}s ({result.message})", job_id=job_id, server=gpus[0].server)
            # The copy is the restore point now, until the job's next checkpoint: its new
            # server keeps it, and a job lost before then resumes from it again.
            job.restore_checkpoint, job.restore_server = result.checkpoint_path, gpus[0].server
        self.launch(job, gpus, incarnation, restore_checkpoint=result.checkpoint_path)

    def launch(
        self,
        job: Job,
        gpus: Sequence[pt.GpuRef],
        incarnation: str,
        restore_checkpoint: str = "",
    ) -> None:
        primary = gpus[0].server
        cmd = helper_pb2.HelperCommand(
            launch=helper_pb2.LaunchJob(
                job_id=job.id,
                incarnation=incarnation,
                spec=spec_of(job),
                gpu_indices=[g.index for g in gpus if g.server == primary],
                restore_checkpoint=restore_checkpoint,
            )
        )
        self.core.runtimes.watch(job.id, incarnation)
        # It runs from now on: the jobs alone on its GPUs are no longer, before a snapshot shows it.
        self.core.alone_rates.launching(job.id, gpus)
        fut = self.core.helpers.send(primary, cmd)
        # Watched, but not "in flight": the job can be suspended or killed meanwhile.
        task = asyncio.create_task(self._launch_result(job.id, incarnation, fut, primary, restore_checkpoint))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _launch_result(self, job_id: str, incarnation: str, fut: Awaitable, server: str,
                             restore: str = "") -> None:
        try:
            result = await asyncio.wait_for(fut, self.core.settings.command_timeout_s)
        except asyncio.TimeoutError:
            self.core.runtimes.unwatch(job_id, incarnation)
            await self._withdraw(job_id, incarnation, server)
            return
        except GandivaError:
            self.core.runtimes.unwatch(job_id, incarnation)
            return  # the server went down: its jobs were re-queued with it
        if result.ok:
            # Not one of self._tasks: stopping the engine cancels it rather than waiting.
            watch = asyncio.create_task(self._watch_runtime(job_id, incarnation))
            self._watches.add(watch)
            watch.add_done_callback(self._watches.discard)
            return
        self.core.runtimes.unwatch(job_id, incarnation)
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or JobState(job.state) not in ACTIVE:
                return
            now = self.core.clock()
            if result.server_fault:
                # Not the job's fault: it is placed again, elsewhere (its restore point kept),
                # and the server gets no new job for a while. Before, the job failed, and so
                # did every job placed after it on that server (the one with free GPUs).
                log.warning("%s", self._quarantine(s, now, server, f"{server} could not start jobs ({result.message})"))
                await self.core.requeue_fenced(s, job, now, f"launch on {server} failed for a reason of the server's, "
                                               f"not the job's ({result.message}): placed again elsewhere",
                                               now + self.core.settings.heartbeat_interval_s)
            elif restore and (holder := await self._holder_to_fetch_from(s, job, restore, server)) is not None:
                # Read through the shared root from a server that is down: where each host
                # exports its own ramdisk, the checkpoint went with it, maybe for a while only.
                # It waits for that server as a fetch does (`--checkpoint-wait`), then is
                # fetched from it; before, it started again from step 0 at once. From a server
                # that is up (this one's mount of it missing or stale), it is fetched from it
                # at once; before, it started again from step 0, its checkpoint still there.
                self._shared_unreadable[job_id] = job.restore_checkpoint
                how = "is up: it is streamed from there instead" if holder.up else \
                    "is down: it waits for it as for a fetch"
                await repo.requeue(s, job, now, f"launch from checkpoint {restore} on {server} failed: "
                                   f"{result.message}; {job.restore_server}, which holds it, {how}")
            elif restore:
                # The checkpoint is gone (its server restarted with an empty ramdisk, say) or
                # unreadable: the job is not lost with it, it starts again from step 0. A
                # launch that fails for another reason fails again then, and the job with it.
                job.restore_checkpoint, job.restore_server, job.restore_step = "", "", 0
                await repo.requeue(s, job, self.core.clock(), f"launch from checkpoint {restore} on {server} "
                                   f"failed: {result.message}; it starts from step 0 when placed next")
            else:
                await repo.finish(s, job, JobState.FAILED, self.core.clock(), f"launch failed: {result.message}")
        self.core.poke()

    async def _holder_to_fetch_from(self, s: AsyncSession, job: Job, restore: str, server: str) -> Server | None:
        """The server holding the job's checkpoint, where ``restore`` (not the path recorded)
        could not be read on ``server`` and was not tried that way before: that server is
        down, or ``restore`` was its ramdisk read through ``server``'s shared root."""
        if restore == job.restore_checkpoint or not job.restore_server:
            return None
        if self._shared_unreadable.get(job.id) == job.restore_checkpoint:
            return None
        holder = await s.get(Server, job.restore_server)
        if holder is None or not holder.up:
            return holder
        target = await s.get(Server, server)
        shared = target is not None and target.shared_root and holder.address and target.address and \
            restore.startswith(posixpath.join(target.shared_root, holder.name) + "/")
        return holder if shared else None  # (no agent to stream it: from step 0, as before)

    async def _watch_runtime(self, job_id: str, incarnation: str) -> None:
        """A launch none of whose processes connects a runtime within the deadline is
        uncontrollable: no suspend, pack, migration or time slice can stop it."""
        deadline = self.core.settings.runtime_connect_deadline_s
        await asyncio.sleep(deadline)
        runtimes = self.core.runtimes
        if runtimes.ever_connected(job_id, incarnation):
            return
        runtimes.give_up(job_id, incarnation)  # (no await between: a later hello sees it)
        reason = (f"no process of it connected the Gandiva runtime within {deadline:g}s of its "
                  "launch (is it a TensorFlow 1-style program run by a python that has "
                  "tf_runtime installed?); it runs to its end on its GPUs and cannot be "
                  "suspended, packed or migrated")
        try:
            if await self.core.record_uncontrollable(job_id, incarnation, reason):
                log.warning("job %s: %s", job_id, reason)
                if runtimes.connected(job_id, incarnation):
                    # Its hello came while the mark was being written (the database busy);
                    # its own undo may have run first. Before, the job stayed marked for
                    # good, its runtime connected: never suspended, parked or migrated.
                    await self.core.record_runtime_connected(job_id, incarnation)
                self.core.poke()
        except GandivaError as err:
            log.warning("could not mark job %s uncontrollable: %s", job_id, err)

    def _rises(self, job_id: str, incarnation: str) -> int | None:
        """How many of that launch's progress reports so far had new mini-batches (None:
        not watched: hang detection off, or no report yet)."""
        w = self.core.hangs.watches.get(job_id)
        return w.rises if w is not None and w.incarnation == incarnation else None

    async def _evict(self, job_id: str, incarnation: str, went_on: int, state: JobState = JobState.RUNNING,
                     why: str = "") -> None:
        """That launch trained on through a suspend without answering it: its runtime lives
        in the user's own process, and one that ignored every suspend kept its GPU while the
        jobs time-sliced with it never ran (probed: 0 of their mini-batches in 90 s). It is
        stopped through its helper (not through itself) and the job is queued again, fenced
        as a withdrawn launch is; it restarts from its restore point when placed next."""
        _, server = await self._where(job_id)
        now = self.core.clock()
        timeout = self.core.settings.command_timeout_s
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state != state.value:
                return
            why = why or (f"{went_on} progress reports with new mini-batches came in the {timeout:.0f}s after "
                          "the command, none answering it")
            await self.core.requeue_fenced(s, job, now, f"did not suspend when told: {why}; its process is stopped and "
                                           "it is queued again (from its last checkpoint)",
                                           now + self.core.settings.down_after_s)
        if server is not None:
            self.core.stop_on(server.name, job_id, incarnation, "trained on without suspending")
        log.warning("job %s: launch %s trained on without suspending; stopped and queued again", job_id, incarnation)
        self.core.poke()

    async def _withdraw(self, job_id: str, incarnation: str, server: str) -> None:
        """A launch with no answer in time is withdrawn: the job goes back to the queue,
        fenced until `server`'s lease has surely run out, and that launch is told to stop
        (the heartbeat fencing stops it too should it start after all)."""
        now = self.core.clock()
        timeout = self.core.settings.command_timeout_s
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
                return
            await self.core.requeue_fenced(s, job, now, f"launch on {server} not confirmed within {timeout:.0f}s; withdrawn",
                                           now + self.core.settings.down_after_s)
        self.core.stop_on(server, job_id, incarnation, "launch withdrawn")
        self.core.poke()

    async def _suspend(self, job_id: str, reason: str, hold: bool = False) -> None:
        """`hold`: an operator's suspension, which the policy leaves alone until resumed."""
        await self._obey(job_id, runtime_pb2.COMMAND_KIND_SUSPEND, JobState.SUSPENDED, reason, hold)

    async def _park(self, job_id: str, reason: str) -> None:
        """Checkpoint the job into its server's ramdisk and let its process exit (the shim's
        stop-for-migration, at its next boundary or while suspended); then it is queued
        again, its restore point that checkpoint, with no GPUs and no host memory held.
        Its next launch resumes from the checkpoint's step (docs/policy.md, probe_slices)."""
        self._parking.add(job_id)
        try:
            await self._park_now(job_id, reason)
        finally:
            self._parking.discard(job_id)

    async def _park_now(self, job_id: str, reason: str) -> None:
        job, server = await self._where(job_id)
        if server is None or job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
            return
        incarnation = job.incarnation
        directory = posixpath.join(server.ramdisk, job_id, f"park-{incarnation}")
        timeout = self.core.settings.command_timeout_s
        await self.core.runtimes.wait_connected(job_id, timeout, incarnation)
        ack = await self.core.runtimes.call(
            job_id, runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION, timeout,
            checkpoint_dir=directory, reason=reason, incarnation=incarnation)
        if not ack.ok:
            raise FailedPrecondition(f"job {job_id} could not be parked: {ack.message}")
        holder = server.name

        async def record(s: AsyncSession) -> None:
            job = await repo.get_job(s, job_id, for_update=True)
            if job.incarnation != incarnation or job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
                return  # ended or moved meanwhile; its exit report decides
            job.steps = max(job.steps, ack.step)
            job.restore_checkpoint, job.restore_server = ack.checkpoint_path or directory, holder
            job.restore_step = max(0, ack.step)
            await repo.requeue(s, job, self.core.clock(), f"{reason} (step {ack.step}, checkpoint {job.restore_checkpoint})")

        # Its process has stopped with that checkpoint: never lost to a database outage.
        await self.core.record_when_reachable(f"{job_id}'s park", record)

    async def _resume(self, job_id: str, reason: str) -> None:
        await self._obey(job_id, runtime_pb2.COMMAND_KIND_RESUME, JobState.RUNNING, reason)

    async def _obey(
        self,
        job_id: str,
        kind: runtime_pb2.CommandKind.ValueType,
        target: JobState,
        reason: str,
        hold: bool = False,
    ) -> None:
        """Send suspend/resume to the job's shim; record the new state once it acks at a boundary."""
        incarnation = (await self._job(job_id)).incarnation
        # A job launched moments ago (e.g. time-sliced with a newcomer in the same round)
        # is still starting TensorFlow: its shim connects when its session exists. Wait for
        # it, or the suspend fails and both jobs run at once, unknown to the policy.
        await self.core.runtimes.wait_connected(job_id, self.core.settings.command_timeout_s, incarnation)
        t0 = time.perf_counter()
        rises = self._rises(job_id, incarnation) or 0  # none yet: it has not reported (a launch just made)
        was = self._suspended.pop(job_id, None) if kind == runtime_pb2.COMMAND_KIND_RESUME else None
        if was is not None and was[0] == incarnation and \
                (went_on := self.core.steps_seen(job_id, incarnation) - was[1]) > SUSPENDED_STEPS_SLACK:
            # It acked its suspend and trained on: recorded SUSPENDED, the job time-sliced with
            # it was resumed beside it (probed: at half its rate, the liar all the time).
            why = f"it said it had suspended, then reported {went_on} more mini-batches before its resume"
            await self._evict(job_id, incarnation, went_on, JobState.SUSPENDED, why)
            raise FailedPrecondition(f"job {job_id} trained on while suspended: stopped and queued again")
        if kind == runtime_pb2.COMMAND_KIND_RESUME:
            self.core.alone_rates.resuming(job_id)  # the jobs beside it no longer run alone
        try:
            ack = await self.core.runtimes.call(
                job_id, kind, self.core.settings.command_timeout_s, reason=reason, incarnation=incarnation
            )
        except Unavailable:
            # Timed out (a stream that dropped fails the command at once) with the same
            # launch connected and training all the while: it is not obeying.
            if kind == runtime_pb2.COMMAND_KIND_SUSPEND and \
                    time.perf_counter() - t0 >= self.core.settings.command_timeout_s and \
                    (went_on := (self._rises(job_id, incarnation) or 0) - rises) >= DISOBEYED_RISES and \
                    self.core.runtimes.connected(job_id, incarnation):
                await self._evict(job_id, incarnation, went_on)
                raise FailedPrecondition(f"job {job_id} trained on without suspending: stopped and queued again") \
                    from None
            if kind == runtime_pb2.COMMAND_KIND_SUSPEND:
                # No answer in time (a long mini-batch), or the stream dropped: the suspend
                # may still take effect at the shim, its ack lost, and the job would stay
                # recorded RUNNING while its process sits suspended for good. A resume
                # right behind it keeps the process as recorded.
                self.core.runtimes.resume_after(job_id, incarnation, "undoing a suspend not answered in time")
            raise
        if ack.ok:
            self.observer.switched("resume" if target is JobState.RUNNING else "suspend", time.perf_counter() - t0)
            self.core.alone_rates.acked(job_id, incarnation, target is JobState.RUNNING, ack.step, self.core.clock(),
                                        ack.step_at)
        if not ack.ok:
            if kind == runtime_pb2.COMMAND_KIND_RESUME:
                # Refused: it never ran, and no state changes. (No answer at all: it may run.)
                self.core.alone_rates.settled(job_id, self.core.clock())
            raise FailedPrecondition(f"job {job_id} could not {command_word(kind)}: {ack.message}")
        tries = 0

        async def record(s: AsyncSession) -> None:
            nonlocal tries
            tries += 1
            job = await repo.get_job(s, job_id, for_update=True)
            if tries > 1 and job.state == target.value:
                return  # written by a try whose commit was answered by a lost connection
            # The ack carries the exact step; batched progress may not have caught up yet.
            job.steps = max(job.steps, ack.step)
            if target is JobState.RUNNING:
                job.held = False
            elif hold:
                job.held = True
            await repo.transition(s, job, target, self.core.clock(), f"{reason} (step {ack.step})")

        # The process obeyed: recorded whatever it takes (a database outage right after the
        # ack left a job RUNNING in the database and suspended in its process, for good).
        # Meanwhile a stream of it that reconnects is not told to resume (it reads RUNNING).
        suspending = target is JobState.SUSPENDED
        if suspending:
            self.core.runtimes.suspend_unrecorded(job_id, incarnation, True)
        try:
            await self.core.record_when_reachable(f"{job_id}'s {target.value.lower()} state", record)
        finally:
            if suspending:
                self.core.runtimes.suspend_unrecorded(job_id, incarnation, False)
        if target is JobState.SUSPENDED:
            self._suspended[job_id] = (incarnation, max(ack.step, self.core.steps_seen(job_id, incarnation)))
            if len(self._suspended) > self._prune_suspended_at:
                await self._prune_suspended()
                # (So many suspended at once: the next read waits until there are twice as many.)
                self._prune_suspended_at = max(SUSPENDED_KEPT, 2 * len(self._suspended))

    async def _prune_suspended(self) -> None:
        """Forget the entries of `_suspended` whose launch is not recorded SUSPENDED now.
        Before, all were dropped at 100,000: the jobs suspended then were resumed unchecked
        (one that had trained on through its suspend, with its partner, went on)."""
        before = dict(self._suspended)
        try:
            async with self.core.tx(read=True) as s:
                rows = (await s.execute(select(Job.id, Job.incarnation)
                                        .where(Job.state == JobState.SUSPENDED.value))).all()
            now = {(job_id, incarnation) for job_id, incarnation in rows}
        except GandivaError as err:
            log.warning("suspended jobs not read (%s): %d entries kept until the next suspend", err, len(before))
            return
        for job_id, entry in before.items():
            # (An entry written while the read ran is newer than the read: kept.)
            if (job_id, entry[0]) not in now and self._suspended.get(job_id) is entry:
                del self._suspended[job_id]

    async def migrate(self, job_id: str, to_gpus: Sequence[pt.GpuRef], reason: str) -> None:
        was, source = await self._where(job_id)
        # Restored at the destination, it runs there before it is recorded there: the jobs
        # alone on those GPUs are no longer. If it does not get there (refused, failed),
        # they start over; if it does, the snapshot shows it there.
        self.core.alone_rates.launching(job_id, to_gpus)
        try:
            await self._settle_move(job_id, self._policy_move(job_id, to_gpus, reason),
                                    to_gpus[0].server, was.state, was.incarnation, source.name if source else "")
        finally:
            self.core.alone_rates.settled(job_id, self.core.clock())

    async def _policy_move(self, job_id: str, to_gpus: Sequence[pt.GpuRef], reason: str) -> MigrationResult | None:
        """The policy's move (a migration, grow or shrink), carried out. One refused before it
        began (its runtime gone: the job just finished, or not connected yet; found not
        migratable) is said where people look: a ``job.migration`` event and the decision
        log, after the move the log showed. It was in the scheduler's log only: the
        dashboard and `gandiva demo` showed "migrate ... on node-3/1", and nothing said the
        job never moved."""
        try:
            carry_out = await begin_migration(self.core, job_id, list(to_gpus), reason)
        except GandivaError as err:
            gpus = ",".join(f"{g.server}/{g.index}" for g in to_gpus)
            said = f"{NOT_STARTED} ({reason}; to {gpus}): {err}"
            if self._moves_refused.get(job_id) == said:
                # Said already (the log line below says it again); this round's decision of it
                # is not done either (it read "not known yet" for as long as the job lived).
                self.observer.move_ended(self.core.clock(), job_id, "not done", 0.0)
                raise
            remember(self._moves_refused, job_id, said, MOVES_REFUSED_KEPT)
            now = self.core.clock()
            self.observer.not_done(now, job_id, said)
            try:
                async with self.core.tx() as s:
                    repo.add_event(s, now, "job.migration", said, job_id=job_id)
            except GandivaError as unwritten:  # the database away: the log line below says it
                log.warning("job %s: the refusal of its move not recorded: %s", job_id, unwritten)
            raise
        self._moves_refused.pop(job_id, None)
        return await carry_out

    async def _settle_move(self, job_id: str, migration: Coroutine[Any, Any, MigrationResult | None], dest: str,
                           was_state: str, incarnation: str, source: str) -> None:
        """Carry out a migration, then what its failure calls for (the policy's and an
        operator's alike)."""
        # Started first, and kept: this task cancelled during the read below (the
        # scheduler stopping) left it never run ("coroutine ... was never awaited"), an
        # operator's migration, already begun, its job MIGRATING until a restart. Now it
        # goes on to its outcome; stop() grants it its grace like any command in flight.
        running = asyncio.create_task(migration)
        self._tasks.add(running)
        running.add_done_callback(self._tasks.discard)
        try:  # where its checkpoint will be streamed
            async with self.core.tx(read=True) as s:
                address: str | None = (await repo.get_server(s, dest)).address
        except GandivaError:
            # Not known (the database unreachable for a moment): a refusal is then taken as
            # the destination's. Before, this read's error left `migration` never run: an
            # operator's migration, already begun, left its job MIGRATING until a restart.
            address = None
        result = await running
        job = await self._job(job_id)
        if result is not None and transfer_fault(result.transfer_fault, result.reason) \
                == helper_pb2.TRANSFER_FAULT_DEST_REFUSED:
            async with self.core.tx() as s:
                now_at = await s.get(Server, dest)
                if now_at is not None and address is not None and now_at.address != address:
                    # Its helper registered again at another address mid-stream (a machine
                    # back on a new IP): the stream went to the old one. Not a server that
                    # cannot take checkpoints: it used to get no new job for a minute.
                    repo.add_event(s, self.core.clock(), "job.migration",
                                   f"{dest}'s helper moved from {address} to {now_at.address} meanwhile: the "
                                   f"checkpoint went to its old address ({result.reason})", job_id=job_id, server=dest)
                else:
                    # Its destination could not take the checkpoint (its ramdisk full): the
                    # policy, which knows nothing of ramdisks, would move the job there again
                    # every round, each try a restart. That server gets no new job for a while.
                    self._quarantine(s, self.core.clock(), dest, f"{dest} could not take {job_id}'s migration checkpoint")
        if was_state == JobState.SUSPENDED.value and source:
            await self._suspended_again(job, incarnation, source)

    def _forget_fetches(self, job_id: str) -> None:
        """The job's checkpoint was fetched, or is not fetched: its failed tries start over
        (and a restore point unreadable through a shared root is no longer its own)."""
        self._fetch_failures.pop(job_id, None)
        self._dest_refusals.pop(job_id, None)
        self._shared_unreadable.pop(job_id, None)

    def _quarantine(self, s: AsyncSession, now: float, server: str, what: str) -> str:
        """``server`` gets no new job for LAUNCH_QUARANTINE_S (``what`` went wrong there),
        written as a ``server.launch_failed`` event in ``s``; returns the event's text."""
        self._quarantined[server] = self.core.monotonic() + LAUNCH_QUARANTINE_S
        note = f"{what}: no new job is placed there for {LAUNCH_QUARANTINE_S:.0f}s"
        repo.add_event(s, now, "server.launch_failed", note, server=server)
        return note

    async def _suspended_again(self, job: Job, incarnation: str, source: str) -> None:
        """A job suspended for a time slice whose migration failed after its checkpoint is
        restarted at its source from it (restarted_at_source): a new launch, training on
        the GPUs its time slice had given to another job. Before, it ran there beside that
        job (two jobs on one GPU, never profiled for it: packing by accident) until the
        quantum's end; now it is suspended again as soon as its runtime connects."""
        # Told by its outcome's transition, not its server: a move between GPUs of one
        # server that succeeded lands there too, and runs as the policy meant.
        if (job.state != JobState.RUNNING.value or job.incarnation == incarnation
                or not job.message.startswith(f"{Outcome.RESTARTED_AT_SOURCE.value}:")):
            return  # migrated, stayed (still suspended), re-queued or ended
        await self._suspend(job.id, f"still suspended: its migration failed and it was restarted at {source}")

    # ---- operator actions -----------------------------------------------------

    async def operator_suspend(self, job_id: str, reason: str) -> JobDetail:
        job = await self._job(job_id)
        if not job.suspendable:
            raise FailedPrecondition(f"job {job_id} cannot be suspended: {job.control_note}")
        return await self._by_operator(
            job_id, JobState.RUNNING, "suspended",
            lambda: self._suspend(job_id, reason or "suspended by operator", hold=True),
        )

    async def operator_resume(self, job_id: str, reason: str) -> JobDetail:
        return await self._by_operator(
            job_id, JobState.SUSPENDED, "resumed",
            lambda: self._resume(job_id, reason or "resumed by operator"),
        )

    async def _by_operator(
        self, job_id: str, required: JobState, verb: str, command: Callable[[], Awaitable[None]]
    ) -> JobDetail:
        """Run an operator's suspend/resume of a job in state `required`, the policy's
        decisions about it waiting meanwhile; the job as it is afterwards."""
        job = await self._job(job_id)
        if job.state != required.value:
            raise FailedPrecondition(f"job {job_id} is {job.state}; only a {required.value} job can be {verb}")
        if job_id in self.inflight:  # another caller's (or the policy's) command: one at a time
            raise Busy(job_id)
        # A person is waiting: a job whose runtime has not connected (its program connects
        # at its first training step) is answered within seconds, not after the policy's wait.
        if not await self.core.runtimes.wait_connected(job_id, OPERATOR_CONNECT_WAIT_S, job.incarnation):
            raise FailedPrecondition(not_connected(job_id, self.core.settings.runtime_connect_deadline_s))
        self.inflight.add(job_id)
        try:
            await command()
            return await self.core.get_job(job_id)
        finally:
            self.inflight.discard(job_id)

    def quarantine_left(self) -> dict[str, float]:
        """Each quarantined server -> seconds until it takes new jobs again."""
        mono = self.core.monotonic()
        return {name: until - mono for name, until in self._quarantined.items() if until > mono}

    def quarantined(self, server: str) -> bool:
        """No new job goes to ``server`` for now (its helper failed a launch of its own)."""
        return self._quarantined.get(server, float("-inf")) > self.core.monotonic()

    async def operator_migrate(self, job_id: str, to_server: str, reason: str = "requested by operator",
                               connect_wait_s: float | None = None) -> JobDetail:
        """Start moving the job to `to_server` (the phases run in the background). A job
        whose runtime is not connected is waited for up to `connect_wait_s` (default
        OPERATOR_CONNECT_WAIT_S: a person asked); a drain, run inside the scheduling
        round, waits for none (0)."""
        job, free = await self._migration_asked(job_id, to_server)
        wait_s = OPERATOR_CONNECT_WAIT_S if connect_wait_s is None else connect_wait_s
        if wait_s > 0 and not self.core.runtimes.connected(job_id, job.incarnation):
            # A person is waiting, and a runtime reconnecting (its stream dropped, the
            # scheduler restarted) is back within seconds: waited for, as a suspend's is
            # (_by_operator), then the move is judged again on what holds then. It was
            # refused at once with "has no runtime connected ... try again once it shows
            # progress", of a job that had trained for hours. (begin_migration refuses one
            # still not connected.)
            # In slices, the job read again between them: one killed or ended meanwhile was
            # answered only when the whole wait had run out.
            ends = asyncio.get_running_loop().time() + wait_s
            while not await self.core.runtimes.wait_connected(
                    job_id, min(CONNECT_WAIT_SLICE_S, ends - asyncio.get_running_loop().time()), job.incarnation):
                if asyncio.get_running_loop().time() >= ends or (await self._job(job_id)).state not in (
                        JobState.RUNNING.value, JobState.SUSPENDED.value):
                    break
            job, free = await self._migration_asked(job_id, to_server)
        if job_id in self.inflight:
            raise Busy(job_id)
        gpus = [pt.GpuRef(to_server, i) for i in free[: job.gpus]]
        _, source = await self._where(job_id)
        self.inflight.add(job_id)
        try:
            rest = await begin_migration(self.core, job_id, gpus, reason)
        except BaseException:
            self.inflight.discard(job_id)
            raise
        # The job is MIGRATING now; the phases run in the background.
        # A held job is suspended again by _hold_again (with its hold), whatever the outcome.
        settled = self._settle_move(job_id, rest, to_server, "" if job.held else job.state, job.incarnation,
                                    source.name if source else "")
        self._background(job_id, self._hold_again(job_id, settled) if job.held else settled)
        return await self.core.get_job(job_id)

    async def _migration_asked(self, job_id: str, to_server: str) -> tuple[Job, list[int]]:
        """The job and the destination's free GPU indexes, or why an operator's migration of
        it to `to_server` is refused."""
        async with self.core.tx() as s:
            job = await repo.get_job(s, job_id)
            loads = {ld.server.name: ld for ld in await repo.server_loads(s)}
            # GPUs a migration in progress holds for its destination are not free either.
            held = {i for m in await repo.migrations(s) if m.dest_server == to_server for i in m.dest_gpus}
        if to_server not in loads:
            raise InvalidArgument("to_server", f"no server named {to_server!r}")
        dest = loads[to_server]
        if not dest.server.up:
            raise FailedPrecondition(f"server {to_server} is down")
        check_not_cordoned(dest.server)
        if job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
            raise FailedPrecondition(f"job {job_id} is {job.state}; only a running or suspended job can migrate")
        if not job.suspendable:
            raise FailedPrecondition(f"job {job_id} cannot be migrated: {job.control_note}")
        if not job.migratable:
            # The runtime's own reason (a random op, state kept in Python, a counter of its
            # own): "its loop ignores the restored step" was untrue of most of them.
            why = job.control_note or "its loop ignores the restored step"
            raise FailedPrecondition(f"job {job_id} cannot resume from a checkpoint ({why}); it can only be suspended in place")
        if job_id in dest.job_gpus:
            raise FailedPrecondition(f"job {job_id} already runs on {to_server}")
        free = [g.index for g in dest.gpus if not dest.jobs_by_gpu.get(g.index) and g.index not in held]
        if len(free) < job.gpus:
            raise FailedPrecondition(f"server {to_server} has {len(free)} free GPU(s); job {job_id} needs {job.gpus}")
        return job, free

    async def _hold_again(self, job_id: str, migration: Awaitable[None]) -> None:
        """A migration resumes its job at the destination: one an operator suspended is
        suspended again there (it ran there, held, out of the policy's reach). If that
        fails the hold ends, saying so: a job is never RUNNING and held."""
        await migration
        job = await self._job(job_id)
        if job.state != JobState.RUNNING.value or not job.held:
            return  # it stayed at its source, still suspended, or it ended
        try:
            await self._suspend(job_id, "still suspended by operator (it was migrated meanwhile)", hold=True)
        except GandivaError as err:
            async with self.core.tx() as s:
                job = await repo.get_job(s, job_id, for_update=True)
                job.held = False
                job.message = f"runs again: the operator's suspend could not be restored after its migration ({err})"
            raise

    # ---- reconciliation -------------------------------------------------------

    async def reconcile_server(
        self, server: str, running: Sequence[tuple[str, str]], running_jobs: Sequence[str] = (),
        placed: Sequence | None = None,
    ) -> None:
        """Jobs placed on `server` whose current launch its helper no longer has go back
        to the queue. `running`: the (job, incarnation) pairs it runs; `running_jobs`:
        job ids alone, from a helper that does not report incarnations; `placed`: the
        rows of repo.placed_job_rows when the heartbeat's transaction read them already.

        Runs on every heartbeat, so it only reads, unless a job's grace period ran out."""
        now = self.core.clock()
        grace = self.core.settings.down_after_s
        alive = set(running)
        legacy = set(running_jobs) if not running else set()
        if placed is None:
            async with self.core.tx(read=True) as s:
                placed = await repo.placed_job_rows(s, server)
        placed_ids = {job.id for job in placed}
        # Forget jobs no longer placed here (they ended or moved): the map stays bounded.
        for job_id in [j for j, srv in self.missing_since.items() if srv[1] == server and j not in placed_ids]:
            del self.missing_since[job_id]
        lost = []
        for job in placed:
            moving = job.id in self.inflight and job.id not in self._checkpointing
            if (job.id, job.incarnation) in alive or job.id in legacy or moving:
                self.missing_since.pop(job.id, None)
                continue
            if job.state not in (JobState.RUNNING.value, JobState.SUSPENDED.value):
                continue
            if now - job.state_changed_at < grace:
                continue
            if now - self.missing_since.setdefault(job.id, (now, server))[0] >= grace:
                lost.append(job.id)
        if not lost:
            return
        async with self.core.tx() as s:
            for job_id in lost:
                self.missing_since.pop(job_id, None)
                job = await repo.get_job(s, job_id, for_update=True)
                # Re-checked inside the write transaction: it may have moved meanwhile.
                if job.state in (JobState.RUNNING.value, JobState.SUSPENDED.value):
                    await repo.requeue(s, job, now, f"its process on {server} was lost")
        self.core.poke()


@dataclass(frozen=True)
class _Restore:
    """Where a launch finds the job's last checkpoint."""

    path: str = ""        # as the launch's server sees it ("" with none, or one to fetch first)
    fetch_from: str = ""  # the server whose helper must stream it to the launch's server first
    dest_address: str = ""  # then: the launch's server's agent, where it is streamed
    note: str = ""        # why a checkpoint the job has cannot be used (it starts from step 0),
                          # or why it waits
    wait_until: float = 0.0  # not placed now: its checkpoint's server is down, and may be back


async def _restore_plan(s: AsyncSession, job: Job, server: str, now: float = 0.0, wait_s: float = 0.0,
                        shared: bool = True, heard_ago: Callable[[str, float], float] | None = None) -> _Restore:
    """How a launch on `server` resumes the job from its last checkpoint: as recorded,
    when that checkpoint is on `server`; through `server`'s shared root (peers' ramdisks
    as ROOT/PEER-NAME) when it has one, unless `shared` is false (a read that way failed
    while the holder was down); else fetched from the server that holds it, if
    that server is up; not yet, while that server is down for less than `wait_s` since its
    last heartbeat (`heard_ago`: seconds since a server was heard, on the monotonic clock,
    given the figure its recorded last heartbeat says, a wall-clock time, for one not heard
    since this scheduler started: SchedulerCore.heard_ago); else not at all (a note saying
    why)."""
    if not job.restore_checkpoint:
        return _Restore()
    if job.restore_server == server:
        return _Restore(job.restore_checkpoint)
    target = await repo.get_server(s, server)
    try:
        holder = await repo.get_server(s, job.restore_server)
    except NotFound:
        return _Restore(note=f"its checkpoint was on {job.restore_server or 'a server'}, which is gone: "
                             "it starts from step 0")
    root = holder.ramdisk.rstrip("/") + "/"
    if shared and target.shared_root and holder.ramdisk and job.restore_checkpoint.startswith(root):
        return _Restore(posixpath.join(target.shared_root, holder.name, job.restore_checkpoint[len(root):]))
    if holder.up and holder.address and target.address:
        return _Restore(fetch_from=holder.name, dest_address=target.address)
    # Counted on the monotonic clock where known: the wall clock stepped an hour forward
    # ended the wait at once, and the job started over from step 0 (it was at 42: -k
    # waiting_for in tests/scheduler/api/test_clock_forward_fence.py).
    recorded_ago = now - (holder.last_heartbeat or 0.0)
    until = now + wait_s - (heard_ago(holder.name, recorded_ago) if heard_ago is not None else recorded_ago)
    if not holder.up and holder.address and target.address and until > now:
        return _Restore(wait_until=until, note=(
            f"waits for server {holder.name}, which is down and holds its checkpoint, to come back: "
            f"{until - now:.0f}s more at most, then it starts again from step 0 elsewhere"))
    why = ("which is down" if not holder.up else
           f"and {holder.name if not holder.address else server}'s helper has no agent address to stream it")
    return _Restore(note=f"its checkpoint is on {holder.name}, {why}: it starts from step 0")


def _job_view(job, placement: tuple[pt.GpuRef, ...], profile: JobProfile | None,  # type: ignore[no-untyped-def]
              hung: bool = False, alone_rate: float | None = None) -> pt.JobView:
    """`job`: a row of repo.SNAPSHOT_COLUMNS. Attained service is as of the last state
    change; the policy extrapolates it for running jobs from `reported_at`. A job flagged
    `hung` is not suspendable while it is. `alone_rate`: measured by scheduler/alone.py."""
    return pt.JobView(
        id=job.id,
        gpus=max(len(placement) or job.gpus, 1),
        priority=job.priority,
        state=job.state,
        placement=placement,
        submitted_at=job.submitted_at,
        steps=job.steps,
        rate=job.rate or None,
        alone_rate=alone_rate,
        # Off for good once its runtime found that a grow changes its result.
        grow_shrink=job.grow_shrink and not job.grow_shrink_note,
        migratable=job.migratable,
        suspendable=job.suspendable and not hung,
        profile=_profile(profile),
        last_state_change_at=job.state_changed_at,
        attained_service_s=job.attained_service_s,
        reported_at=job.state_changed_at if job.state == JobState.RUNNING.value else None,
        base_gpus=job.gpus,
        multi_job=job.multi_job_id,
        # A multi-job's members share one submit time: its index breaks the tie (by id,
        # random, a sweep's members were queued in any order).
        arrival=job.array_index or 0,
    )


def _profile(row: JobProfile | None) -> pt.JobProfile | None:
    """The policy's profile of a job: its GPU side once the helper measured its GPU memory
    (packing reads nothing else before), its host memory once measured; None before
    either. A profile with host memory alone has memory_bytes 0 (JobProfile.gpu_measured
    false), and its utilization and step time are left out as before."""
    if row is None or not (row.memory_max or row.host_memory_bytes):
        return None
    if not row.memory_max:
        return pt.JobProfile(memory_bytes=0, gpu_util=1.0, host_memory_bytes=row.host_memory_bytes)
    return pt.JobProfile(memory_bytes=row.memory_max, gpu_util=row.utilization,
                         step_time_s=row.step_time_s or None, host_memory_bytes=row.host_memory_bytes)

