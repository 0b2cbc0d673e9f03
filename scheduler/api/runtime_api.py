"""The Runtime service: one bidirectional stream per job process (the tf_runtime shim)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping

import grpc

from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc
from scheduler import auth
from scheduler.api.status import code_for, unexpected_status
from scheduler.core import SchedulerCore
from scheduler.errors import GandivaError, InvalidArgument
from scheduler.hubs import RuntimeConn, RuntimeHub
from scheduler.pace import Pace
from scheduler.validation import (
    MAX_STEPS,
    check_id,
    check_text,
    clean_number,
    clean_rate,
    clean_step_s,
    clean_text,
)

log = logging.getLogger(__name__)

MAX_SIGNATURE_CHARS = 64 * 1024
# Messages a second one launch's runtime streams are read at past a burst (RuntimeHub.pace).
RUNTIME_RATE, RUNTIME_BURST = RuntimeHub.rate, RuntimeHub.burst


MAX_METRICS = 64
# Runtime streams one job may hold open at once. A job has one process that trains (two
# during a migration: its source and destination), a few more while processes of one launch
# hand the stream over or a reconnecting shim's old stream is not yet found dead. Each open
# stream costs the scheduler about 33 KB, and a stream superseded by a newer one of its launch
# stayed open, serving nothing, for as long as its client kept it: a job's own process (its
# runtime token is enough) opening 20 a second (the hello pace) grew the scheduler by 2 GB an
# hour. Past this, the job's oldest stream is ended (RESOURCE_EXHAUSTED), the newest kept.
MAX_STREAMS_PER_JOB = 32


def _metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """What a job reports, bounded: one program's bad loss must not spoil the batch
    write that records every job's progress (PostgreSQL's JSON refuses NaN)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if len(out) >= MAX_METRICS:
            break
        if len(name) <= 64 and "\x00" not in name and math.isfinite(value):
            out[name] = value
    return out


class RuntimeServicer(runtime_pb2_grpc.RuntimeServicer):
    def __init__(self, core: SchedulerCore) -> None:
        self.core = core
        # Progress reports taken off the streams (the load benchmark compares it with
        # what its simulated runtimes sent).
        self.progress_received = 0
        # Each job's open Connect streams, oldest first (MAX_STREAMS_PER_JOB), and those ended
        # for a newer one.
        self._streams: dict[str, dict[asyncio.Task, None]] = {}
        self._evicted: set[asyncio.Task] = set()

    def _open_stream(self, job_id: str) -> asyncio.Task | None:
        """Count this call's stream (its task, returned) against its job; end the job's
        oldest ones past the cap."""
        me = asyncio.current_task()
        if me is None:
            return None
        streams = self._streams.setdefault(job_id, {})
        streams[me] = None
        while len(streams) > MAX_STREAMS_PER_JOB:
            oldest = next(iter(streams))
            del streams[oldest]
            self._evicted.add(oldest)
            oldest.cancel()
        return me

    def _close_stream(self, job_id: str, me: asyncio.Task | None) -> None:
        """The stream of the call whose task ``me`` was is done. (Named, not the current task:
        a call cancelled while gRPC sent its command ends its stream in another task, asyncio's
        finaliser of the generator left at its yield, and the stream stayed counted.)"""
        if me is None:
            return
        streams = self._streams.get(job_id, {})
        streams.pop(me, None)
        if not streams:
            self._streams.pop(job_id, None)
        self._evicted.discard(me)

    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[runtime_pb2.RuntimeMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[runtime_pb2.RuntimeCommand]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("body") != "hello" or not first.hello.job_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello: the first message must be a RuntimeHello with job_id")
            return
        hello = first.hello
        try:
            check_id("hello.job_id", hello.job_id)
            check_text("hello.incarnation", hello.incarnation, 64)
            auth.require_runtime(auth.current(), hello.job_id, hello.incarnation)
        except GandivaError as err:
            await context.abort(code_for(err) or grpc.StatusCode.INTERNAL, str(err))
        # Counted from here (its hello may wait for the pace below, the stream open meanwhile).
        me = self._open_stream(hello.job_id)
        try:
            async for command in self._serve(hello, request_iterator, context):
                yield command
        except asyncio.CancelledError:
            if me not in self._evicted:
                raise
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"job {hello.job_id} has {MAX_STREAMS_PER_JOB} newer runtime streams open; this, "
                                "its oldest, is ended (a job's processes need one or two)")
        finally:
            self._close_stream(hello.job_id, me)

    async def _serve(
        self, hello: runtime_pb2.RuntimeHello, request_iterator: AsyncIterator[runtime_pb2.RuntimeMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[runtime_pb2.RuntimeCommand]:
        """The stream of a launch once its hello is checked: its commands out, its reports in."""
        try:
            pace = self.core.runtimes.pace(hello.job_id, hello.incarnation)
            await pace.take()  # each hello is a database read
            # (A suspend acked and written while the read below waits: it read RUNNING.)
            recorded = self.core.runtimes.suspends_recorded(hello.job_id, hello.incarnation)
            uncontrollable, running, stale = await self.core.runtime_hello(hello.job_id, hello.incarnation)
        except GandivaError as err:
            await context.abort(code_for(err) or grpc.StatusCode.INTERNAL, str(err))
        except Exception as err:  # noqa: BLE001 - never UNKNOWN; logged with its trace
            await context.abort(*unexpected_status(err, "Connect"))
        conn = self.core.runtimes.attach(hello.job_id, hello.incarnation)
        # Checked once attached, with no await between: a launch told to exit while the
        # hello above was read (or before it connected at all) is told again now; one
        # told from here on finds this connection.
        told = self.core.runtimes.told_to_exit(hello.job_id, hello.incarnation)
        if running and not told:
            self.core.runtimes.resume_on_connect(conn, recorded)
        if stale or told:
            # A launch the job no longer runs (re-placed while this copy's stream was down,
            # its helper hung: nothing else stops it): it exits at its next boundary.
            self.core.runtimes.kill_stale(hello.job_id, hello.incarnation, told or "this launch is not the job's any more")
            log.warning("runtime of job %s: launch %s is stale; told to exit", hello.job_id, hello.incarnation)
        try:
            # Or its deadline passed just before this hello's read, the mark not yet written
            # (RuntimeHub.give_up): the job read controllable here, marked just after.
            given_up = self.core.runtimes.taken_up_again(hello.job_id, hello.incarnation)
            if uncontrollable or given_up:
                await self.core.record_runtime_connected(hello.job_id, hello.incarnation)
        except GandivaError as err:
            log.warning("could not record that job %s's runtime connected: %s", hello.job_id, err)
        log.info("runtime of job %s (incarnation %s, pid %d) connected", hello.job_id, hello.incarnation, hello.pid)
        reader = asyncio.create_task(self._read(conn, request_iterator, pace, heeded=not (stale or told)))
        getter: asyncio.Task | None = None
        try:
            while True:
                getter = asyncio.create_task(conn.outbox.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                if isinstance(reader.exception(), InvalidArgument):  # a second hello
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(reader.exception()))
                if reader.exception() is None:
                    # At the end of its program (tf_runtime closes the stream then): a process
                    # that lingers after it is not hung in a mini-batch (scheduler/hangs.py).
                    self.core.hangs.ended(conn.job_id, conn.incarnation)
                return  # the shim closed its side
        finally:
            reader.cancel()
            if getter is not None:
                # A stream cancelled mid-wait (the job's process killed) left it pending, and
                # the scheduler's log said "ERROR asyncio: Task was destroyed but it is pending!".
                getter.cancel()
            self.core.runtimes.detach(conn)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                log.warning("runtime stream of job %s ended by an error: %r", conn.job_id, reader.exception())
            else:
                log.info("runtime of job %s (incarnation %s) disconnected", conn.job_id, conn.incarnation)

    async def _read(self, conn: RuntimeConn, it: AsyncIterator[runtime_pb2.RuntimeMessage], pace: Pace,
                    heeded: bool = True) -> None:
        """Reads what the runtime sends. Not ``heeded`` (a launch the job no longer runs,
        told to exit), or told to exit since: only its acks are taken. Its token stays good for ever, so its old
        process, or whoever replays the token, had marked the job "not migratable", turned
        grow-shrink off for good and reported progress, meanwhile."""
        total_seen = 0  # the program's own total mini-batches, recorded once per value
        loop = asyncio.get_running_loop()
        async for msg in it:
            # A job's runtime sends about one report a second and an ack per command; one that
            # sends more is read at RUNTIME_RATE (gRPC's flow control holds back the rest): a
            # job flooding migratability reports kept the scheduler 85% busy writing them.
            # The pace is the launch's, shared by all its streams (RuntimeHub.pace).
            await pace.take()
            conn.heard_at = loop.time()
            kind = msg.WhichOneof("body")
            if kind == "hello":
                # It was passed over, and what followed it counted for the first hello's job: a
                # client that said hello for job B on job A's stream had B's steps shown as A's.
                raise InvalidArgument("hello", f"sent again on this stream (job {msg.hello.job_id[:64]!r}); a stream "
                                               f"speaks for the launch of its first hello, job {conn.job_id}: "
                                               f"open a new stream for another launch")
            # Nor once it is told to exit while connected (killed, its server marked down, the
            # job moved on): its reports went on counting until it exited, so a killed job's
            # steps, total and migratability still changed, and a re-queued job's old copy
            # reported progress its restart would not have.
            if kind != "ack" and (not heeded or self.core.runtimes.told_to_exit(conn.job_id, conn.incarnation)):
                continue
            try:
                if kind == "progress":
                    self.progress_received += 1
                    p = msg.progress
                    # Said by the user's own process: held to what a mini-batch can be
                    # (docs/security.md), never stored as sent.
                    conn.step_s = clean_step_s(p.last_step_s)
                    await self.core.record_progress(
                        conn.job_id, conn.incarnation, min(max(0, p.steps), MAX_STEPS), clean_rate(p.rate),
                        conn.step_s, _metrics(p.metrics), p.other_run, clean_number(p.step_at, 0.0),
                    )
                    if 0 < p.total_steps <= MAX_STEPS and p.total_steps != total_seen:
                        await self.core.record_total_steps(conn.job_id, conn.incarnation, p.total_steps)
                        total_seen = p.total_steps
                elif kind == "ack":
                    msg.ack.message = clean_text(msg.ack.message)
                    msg.ack.checkpoint_path = clean_text(msg.ack.checkpoint_path)
                    msg.ack.step = min(max(msg.ack.step, 0), MAX_STEPS)  # it becomes the job's steps
                    msg.ack.step_at = clean_number(msg.ack.step_at, 0.0)  # (its rate alone's time)
                    self.core.alone_rates.ack_arrived(conn.job_id, conn.incarnation, msg.ack.step, self.core.clock(),
                                                      msg.ack.step_at)
                    self.core.runtimes.resolve(conn, msg.ack)
                elif kind == "train_signature":
                    # Bounded: a signature is a few names; a huge one is not worth relaying.
                    sig = msg.train_signature.json
                    conn.train_signature = sig if len(sig) <= MAX_SIGNATURE_CHARS else ""
                elif kind == "towers":
                    t = msg.towers
                    if not t.checkpoint_towers:  # the graph's count, for a grow's destination
                        conn.towers = max(0, t.towers)
                    elif t.checkpoint_towers != t.towers:
                        await self.core.record_towers_changed(
                            conn.job_id, conn.incarnation, max(0, t.towers),
                            max(0, t.checkpoint_towers), max(0, t.devices))
                elif kind == "migratability":
                    conn.verdict = (msg.migratability.migratable, clean_text(msg.migratability.reason, 1024))
                    await self.core.record_migratability(conn.job_id, conn.incarnation, *conn.verdict)
            except GandivaError as err:
                # A progress report lost to a brief database outage is superseded by the next one.
                log.warning("runtime message of job %s not recorded: %s", conn.job_id, err)
