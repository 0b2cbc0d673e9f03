"""The Helper service: what each server's Migration Helper calls."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from protos.gandiva.v1 import common_pb2, helper_pb2, helper_pb2_grpc
from scheduler import auth
from scheduler.api.status import grpc_errors, grpc_stream_errors
from scheduler.core import SchedulerCore
from scheduler.engine.live import LiveEngine
from scheduler.errors import FailedPrecondition, InvalidArgument, Unavailable
from scheduler.hubs import END_STREAM
from scheduler.validation import (
    MAX_ID,
    MAX_SERVER_GPUS,
    MAX_WORKDIR,
    check_exit,
    check_id,
    check_register_exits,
    check_server_name,
    check_text,
    clean_number,
    clean_step_s,
    clean_text,
)

# More GPUs, jobs or samples than any server has: a broken or hostile helper.
MAX_RUNNING_JOBS = 10_000
MAX_SAMPLES = 100_000


def _as_server(name: str, field: str = "server") -> None:
    """The server a helper names: a valid name, and the one its credential is for."""
    check_id(field, name)
    auth.require_server(auth.current(), name, field)


log = logging.getLogger(__name__)


T = TypeVar("T")
# How long a helper's heartbeat or GPU samples wait for a database not known to be down before
# they are answered without it: under the helpers' 5 s deadline for an answer
# (migration_helper.daemon.RPC_TIMEOUT_S), past which a heartbeat ends the helper's session
# (registering again needs the database: its jobs froze until it was back).
SLOW_DB_S = 4.0


class HelperServicer(helper_pb2_grpc.HelperServicer):
    def __init__(self, core: SchedulerCore, engine: LiveEngine) -> None:
        self.core = core
        self.engine = engine
        # Each server's open command stream (its task): a newer one ends it (ReceiveCommands).
        self._readers: dict[str, asyncio.Task] = {}
        self._superseded: set[asyncio.Task] = set()
        # The database work of a server's heartbeat or GPU samples under way (`_within`).
        self._pending: dict[tuple[str, str], asyncio.Task] = {}
        # Stops a heartbeat's recording worked out after its helper had been answered from
        # memory: sent with that helper's next answer (server -> (job, incarnation) -> stop).
        self._late_stops: dict[str, dict[tuple[str, str], helper_pb2.StopJob]] = {}

    @grpc_errors
    async def Register(self, request, context):  # type: ignore[no-untyped-def]
        _as_server(request.name, "name")
        check_server_name("name", request.name)
        check_text("address", request.address, 256)
        check_text("ramdisk", request.ramdisk, MAX_WORKDIR)
        check_text("shared_root", request.shared_root, MAX_WORKDIR)
        check_text("instance", request.instance, 64)
        if len(request.gpus) > MAX_SERVER_GPUS:
            raise InvalidArgument("gpus", f"{len(request.gpus)} GPUs; at most {MAX_SERVER_GPUS}")
        if len({g.index for g in request.gpus}) != len(request.gpus):
            raise InvalidArgument("gpus", "GPU indices must be distinct")
        for i, g in enumerate(request.gpus):
            check_text(f"gpus[{i}].uuid", g.uuid, 128)
            check_text(f"gpus[{i}].model", g.model, 128)
            if g.index < 0 or g.memory_total_bytes < 0:
                raise InvalidArgument(f"gpus[{i}]", "index and memory must not be negative")
            # A sample, cleaned (NaN was an integrity error the helper would retry forever).
            g.utilization = clean_number(g.utilization, 0.0, 1.0)
            g.memory_used_bytes = max(0, g.memory_used_bytes)
        if request.host_memory_bytes < 0:
            raise InvalidArgument("host_memory_bytes", f"{request.host_memory_bytes}: must not be negative (0: unknown)")
        check_register_exits(request.name, request.exits)  # held to what ReportProcessExit takes
        await self.core.register_server(request)
        st = self.core.settings
        return helper_pb2.RegisterServerResponse(
            heartbeat_interval_s=st.heartbeat_interval_s, down_after_s=st.down_after_s, lease_s=st.lease,
            scheduler_time=self.core.clock(),  # the helper checks transfer tickets on this clock
        )

    @grpc_errors
    async def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]
        _as_server(request.name, "name")
        if len(request.running_jobs) > MAX_RUNNING_JOBS or len(request.running) > MAX_RUNNING_JOBS:
            raise InvalidArgument("running", f"more than {MAX_RUNNING_JOBS} jobs")
        # Held to what an id can be, as ReportProcessExit's: taken as sent, a NUL was INTERNAL
        # on PostgreSQL, and a 100 KB or terminal-escape incarnation went into a job's events.
        for i, r in enumerate(request.running):
            check_text(f"running[{i}].job_id", r.job_id, MAX_ID)
            check_text(f"running[{i}].incarnation", r.incarnation, 64)
        for i, job_id in enumerate(request.running_jobs):
            check_text(f"running_jobs[{i}]", job_id, MAX_ID)
        running = [(r.job_id, r.incarnation) for r in request.running]
        check_text("instance", request.instance, 64)
        if request.leaving:  # its last word: nothing to reconcile, nothing to send back
            await self.core.server_leaving(request.name, request.instance)
            return helper_pb2.HeartbeatResponse(known=True)
        try:
            return await self._recorded(request, running)
        except Unavailable:
            if not self.core.heartbeat_unrecorded(request.name):
                raise
            # Answered from memory: no peer list (version 0: the helper keeps its own), no kept
            # checkpoints, only the stops an earlier recording left; its lease is renewed and
            # its session goes on.
            return helper_pb2.HeartbeatResponse(known=True, scheduler_time=self.core.clock(),
                                                stop=self._late_stops.pop(request.name, {}).values())

    async def _recorded(self, request: helper_pb2.HeartbeatRequest,
                        running: list[tuple[str, str]]) -> helper_pb2.HeartbeatResponse:
        """The heartbeat recorded and answered. Of a server that may be answered from memory
        (`SchedulerCore.vouched`): Unavailable (then answered so, see Heartbeat) while its
        previous heartbeat is still being recorded, or when the database is slow to answer
        (`_within`), the recording going on meanwhile. A database that answers nothing (a
        partition) fails each transaction only after its connections' timeouts
        (scheduler/state/db.py: 5-10 s), past the lease and the helper's own deadline: before,
        every helper's lease ran out and every job in the cluster froze for as long as the
        database was cut off (tests/multihost/test_db_host_cut.py)."""
        if not self.core.vouched(request.name):  # (a server back from a cut waits for its answer: stops)
            return await self._heartbeat(request, running)
        if not self.core.heard(request.name, request.instance):  # (also while one is being recorded)
            return helper_pb2.HeartbeatResponse(known=False)
        gave_up = False

        async def record() -> helper_pb2.HeartbeatResponse:
            reply = await self._heartbeat(request, running)
            if gave_up and reply.stop:
                # Its helper was answered from memory meanwhile: the stops go with its next
                # answer. Before, they were thrown away, worked out again by the next recording
                # and thrown away again: against a database slower than SLOW_DB_S per heartbeat
                # no stop reached the helper (tests/scheduler/test_helper_within_units.py -k
                # slow_recording).
                late = self._late_stops.setdefault(request.name, {})
                late.update(((x.job_id, x.incarnation), x) for x in reply.stop)
            return reply

        try:
            return await self._within(("beat", request.name), record)
        except Unavailable:
            gave_up = True
            raise

    async def _within(self, key: tuple[str, str], make: Callable[[], Awaitable[T]]) -> T:
        """``make()``'s result; Unavailable at once while the one ``key`` started before
        still runs (one at a time per key: a partition piles up nothing), and Unavailable
        when it has not come within a third of the lease while the database is known
        unreachable (`db_health`), or within SLOW_DB_S otherwise, the work going on
        meanwhile (never cancelled half-way: a transaction commits or not, whole)."""
        pending = self._pending.get(key)
        if pending is None or pending.done():
            pending = self._pending[key] = asyncio.ensure_future(make())
            pending.add_done_callback(_retrieved)
            # Forgotten once done: a key per server name sent (ReportGpuSamples and
            # ReportProcessExit check the name only in `make`) kept every made-up name's
            # ended task, and its error's traceback, for good.
            pending.add_done_callback(functools.partial(self._forget, key))
            wait = SLOW_DB_S if self.core.db_health.up else self.core.settings.lease / 3
            try:
                return await asyncio.wait_for(asyncio.shield(pending), wait)
            except TimeoutError:
                pass
        raise Unavailable(self.core.db_health.text() or "the scheduler's database is slow to answer; retry shortly")

    def _forget(self, key: tuple[str, str], task: asyncio.Task) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]

    async def _heartbeat(self, request: helper_pb2.HeartbeatRequest,
                         running: list[tuple[str, str]]) -> helper_pb2.HeartbeatResponse:
        known, stop, placed = await self.core.heartbeat(request.name, running, request.instance)
        if not known:
            return helper_pb2.HeartbeatResponse(known=False)
        await self.engine.reconcile_server(request.name, running, request.running_jobs, placed)
        reply = helper_pb2.HeartbeatResponse(known=True, stop=stop, scheduler_time=self.core.clock())
        if late := self._late_stops.pop(request.name, None):
            told = {(x.job_id, x.incarnation) for x in stop}
            reply.stop.extend(x for key, x in late.items() if key not in told)
        # The registered helpers, when the helper's copy is out of date.
        version, agents = await self.core.peers()
        reply.peers_version = version
        if request.peers_version != version:
            reply.peers.extend(helper_pb2.Peer(name=n, address=a) for n, a in agents)
        if request.want_kept:
            reply.kept_listed = True
            reply.kept.extend(await self.core.kept_checkpoints(request.name))
        return reply

    @grpc_errors
    async def ReportGpuSamples(self, request, context):  # type: ignore[no-untyped-def]
        _as_server(request.server)
        if len(request.samples) > MAX_SAMPLES:
            raise InvalidArgument("samples", f"more than {MAX_SAMPLES} in one report")
        for i, x in enumerate(request.samples):
            check_text(f"samples[{i}].job_id", x.job_id, 64)
            # Cleaned, not refused: one bad sample must not lose the others, nor the report
            # be retried forever (NaN was an integrity error; inf a profile that packs anything).
            x.utilization = clean_number(x.utilization, 0.0, 1.0)
            x.minibatch_s = clean_step_s(x.minibatch_s)
            for name in ("memory_used_bytes", "job_memory_bytes", "job_memory_min_bytes", "job_memory_max_bytes"):
                setattr(x, name, max(0, getattr(x, name)))
        if len(request.host_memory) > MAX_RUNNING_JOBS:
            raise InvalidArgument("host_memory", f"more than {MAX_RUNNING_JOBS} jobs in one report")
        for i, m in enumerate(request.host_memory):
            check_text(f"host_memory[{i}].job_id", m.job_id, 64)
            check_text(f"host_memory[{i}].incarnation", m.incarnation, 64)
            if m.rss_bytes < 0:
                raise InvalidArgument(f"host_memory[{i}].rss_bytes", f"{m.rss_bytes}: must not be negative")
        try:
            await self._within(("samples", request.server), lambda: self.core.gpu_samples(request))
        except Unavailable:
            # Perishable (the next report, seconds later, replaces them): dropped rather
            # than refused, which kept them at the head of the helper's outbox, ahead of
            # its command results, until the database was back.
            log.debug("GPU samples of %s dropped: the database is unreachable", request.server)
        return common_pb2.Empty()

    @grpc_errors
    async def ReportProcessExit(self, request, context):  # type: ignore[no-untyped-def]
        _as_server(request.server)
        check_exit(request)
        # A name never registered is no helper: its "exit" of any job it named was written
        # into that job's events (`job.stale_exit ... server ghost`), and a user read it.
        # Bounded as a heartbeat is (`_within`): UNAVAILABLE keeps it at the head of the helper's
        # outbox, tried again, and its session open. Waited for past the helper's 5-s deadline
        # (a database cut off), it ended the session, and every job of that helper froze until
        # the database was back. (Sent again once the first try ran, it finds its launch ended.)
        await self._within(("exit", request.server), lambda: self._exited(request))
        return common_pb2.Empty()

    async def _exited(self, request: helper_pb2.ProcessExitRequest) -> None:
        await self.core.known_server(request.server)
        await self.core.process_exit(request)

    @grpc_stream_errors
    async def ReceiveCommands(self, request, context):  # type: ignore[no-untyped-def, override]
        _as_server(request.server)
        # Only a registered server gets a command box: one per name ever seen would grow forever.
        await self.core.known_server(request.server)
        hub = self.core.helpers
        box = hub.box(request.server)
        # One stream per server, the newest: with two open (a helper's stream reopened while
        # the server had not yet seen the old one die, or a second client), each command
        # went to whichever was waiting first, and those sent down the dead one were lost
        # (3 launches: 2 to the first stream, 1 to the second). The older one is cancelled:
        # waiting, it has taken nothing; stuck sending to a peer gone, it puts the command back.
        me = asyncio.current_task()
        older = self._readers.get(request.server)
        if older is not None and older is not me and not older.done():
            log.warning("helper %s opened a new command stream; ending its older one", request.server)
            self._superseded.add(older)
            older.cancel()
        if me is not None:
            self._readers[request.server] = me
        if again := hub.resend(request.server):
            log.warning("helper %s: %d command(s) sent down its earlier command stream are still unanswered; "
                        "sending them again", request.server, again)
        log.info("helper %s connected its command stream", request.server)
        try:
            while True:
                item = await box.queue.get()
                if item[1] is END_STREAM:
                    # Marked down meanwhile: the helper reconnects (and registers) again.
                    log.info("helper %s: its server went down; ending its command stream", request.server)
                    return
                try:
                    yield item[1]
                except BaseException:
                    # Not delivered: kept, in its place, for the helper's next stream.
                    hub.put_back(box, item)
                    raise
                hub.delivered(box, item)
        except asyncio.CancelledError:
            if me not in self._superseded:
                raise
            self._superseded.discard(me)
            raise FailedPrecondition(f"server {request.server} opened a newer command stream; this one is "
                                     "ended (commands go to the newest)") from None
        finally:
            if self._readers.get(request.server) is me:
                del self._readers[request.server]
            log.info("helper %s closed its command stream", request.server)

    @grpc_errors
    async def ReportCommandResult(self, request, context):  # type: ignore[no-untyped-def]
        _as_server(request.server)
        request.message = clean_text(request.message)
        request.checkpoint_path = clean_text(request.checkpoint_path)
        self.core.helpers.resolve(request.server, request)
        return common_pb2.Empty()


def _retrieved(task: asyncio.Task) -> None:
    """Database work of `HelperServicer._within` that ended after its answer: its error is not
    logged as never retrieved (a database outage is said by the calls that wait for it)."""
    if not task.cancelled():
        task.exception()
