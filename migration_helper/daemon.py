"""The helper daemon: its HelperAgent server, its session with the scheduler
(register, heartbeat, command stream, reports) and GPU sampling.

The session reconnects by itself: any failure (scheduler restarted, unreachable,
or answering ``known=false``) ends the session and a new one registers again and
reopens the command stream. Process exits and command results wait in an outbox
until the scheduler has taken them, so none is lost while it is away; exits are also
kept on disk until then, for the next start of a helper stopped first (undelivered.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import math
import os
import socket
import stat
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from migration_helper.agent import agent_server
from migration_helper.config import HelperConfig
from migration_helper.gpus import GpuBackend, open_backend
from migration_helper.jobs import JobTable
from migration_helper.process import JobProcess, exit_reason, kill_left_behind, owner_mark
from migration_helper.ramdisk import Ramdisk
from migration_helper.sampling import Sampler
from migration_helper.undelivered import UndeliveredExits
from migration_protocol.host_memory import format_size
from protos.gandiva.v1 import common_pb2, helper_pb2, helper_pb2_grpc
from scheduler.transport import add_port, aio_channel, check_exposure
from scheduler.validation import MAX_REGISTER_EXITS
from tf_runtime.lease import write_lease

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 5.0
# A Register unanswered this long is sent again over another new connection (the first
# is not given up): see HelperDaemon._register.
REGISTER_HEDGE_S = 1.0
# The session's channel keeps a TCP connection of its own (gRPC shares one per address
# and options across a process's channels, by default even after a close): a session
# that ended on a dead connection gets a fresh one, not that one back.
SESSION_CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)
# How long a transfer to an address not (yet) in the registered-helpers list waits for
# the next heartbeat answer before it is refused: at least two default heartbeats.
PEER_WAIT_S = 5.0
MAX_BACKOFF_S = 2.0
# The same reconnect warning is said again at most this often (tries go on every 2 s).
REPEAT_WARNING_S = 60.0
MAX_REMEMBERED_COMMANDS = 10_000
LEASE_POLL_S = 0.1
# The lease's end, for the jobs' shims (tf_runtime.lease): a host that froze whole wakes
# its jobs with its helper, and they must not train before it looks. In RAM (lease_path).
LEASE_FILE = ".lease"
LEASE_HOME = Path("/dev/shm")
# Heartbeats sent and not answered yet, at most (a late link keeps several in flight).
HEARTBEATS_IN_FLIGHT = 4
# While a heartbeat of the session has gone unanswered this long (or twice the median
# round trip of its last HEDGE_RTTS answered ones, if longer: a late link), another is
# sent over a new connection every HEARTBEAT_HEDGE_S (at most HEARTBEATS_IN_FLIGHT at
# once): see _hedge_heartbeats.
HEARTBEAT_HEDGE_S = 1.0
HEDGE_RTTS = 8
# A gap between this server's wall clock and the scheduler's past this is logged (once
# per change of this size): transfer tickets are checked on the scheduler's clock anyway.
CLOCK_GAP_WARN_S = 300.0
# Answers the scheduler will give again however often a report is retried: such a
# report is logged and dropped, so it never blocks the reports queued behind it.
PERMANENT = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
})


# What the scheduler's refusal of a second helper under one --server-name says
# (scheduler.core.SchedulerCore.register_server).
NAME_HELD = "is held by another live helper"


class SessionEnded(Exception):
    """The scheduler no longer knows this server, or closed the command stream."""


class HelperDaemon:
    def __init__(self, config: HelperConfig, backend: GpuBackend | None = None) -> None:
        self.config = config
        # Who this helper is, for its whole life: the scheduler refuses a second helper
        # started with the same --server-name while this one lives.
        self.instance = uuid.uuid4().hex
        self.backend = backend or open_backend(config.gpus, config.server_name, config.virtual)
        self.ramdisk = Ramdisk(config.ramdisk_dir, max_bytes=config.max_transfer_bytes)
        self.lease_file = self.ramdisk.root / LEASE_FILE  # until start() finds its place (lease_path)
        self.jobs = JobTable(
            server=config.server_name,
            scheduler=config.scheduler,
            log_dir=config.logs_dir,
            on_exit=self._process_exited,
            stop_grace_s=config.stop_grace_s,
            security=config.security,
            roots=[config.ramdisk_dir, *([config.shared_root] if config.shared_root else [])],
            peer_check=self.not_a_peer,
            owner=owner_mark(config.ramdisk_dir),
            lease_ran_out=self._lease_ran_out,
            lease_file=str(self.lease_file),
        )
        # The registered helpers' agents, address -> name, as the scheduler last sent them
        # in a heartbeat answer (with their version): checkpoints go only to these.
        self.peers: dict[str, str] = {}
        self._peers_version = 0
        # The checkpoints here the scheduler still needs (HeartbeatResponse.kept), and when
        # they were listed; asked for once before each housekeeping round.
        self._kept: set[str] | None = None
        self._kept_at = float("-inf")
        self._want_kept = True
        self.sampler = Sampler(
            self.backend, lambda: self.jobs.processes.values(), config.sample_interval_s
        )
        self.address = ""
        # Reported at every registration; measured once (the machine does not change).
        self.host_memory_bytes = config.reported_host_memory
        self.registered = asyncio.Event()
        self.sessions = 0  # how many times it registered (tests watch reconnects)
        self.hedged_heartbeats = 0  # answered over a new connection (_hedge_heartbeats)
        self._hedge_said = False  # this session's first such answer was logged
        # The lease (from the scheduler; 0 until registered: no jobs run before that).
        self.lease_s = 0.0
        self._lease_from = 0.0
        self._newest_answer = 0.0  # when the newest heartbeat answered so far was sent (loop time)
        # Round trips of the session's last heartbeats answered on its own connection.
        self._rtts: collections.deque[float] = collections.deque(maxlen=HEDGE_RTTS)
        self.frozen = False
        self._lease_unwritten = False  # the lease file could not be written (said once)
        # When the watchdog froze the jobs (loop time): only a heartbeat sent after it thaws.
        self._frozen_at = 0.0
        self._heartbeat_interval_s = MAX_BACKOFF_S  # the scheduler's, from the last registration
        # The scheduler's wall clock minus this server's, from its last answer (0 until then,
        # or with a scheduler that does not send its clock): the agent checks transfer
        # tickets, which expire on the scheduler's clock, against scheduler_now().
        self.clock_gap_s = 0.0
        self._gap_warned = 0.0
        self._outbox: collections.deque[Any] = collections.deque()
        self._sending: Any = None  # the outbox's message being sent now (None: none)
        self.dropped = 0  # reports the scheduler refused for good
        self._outbox_ready = asyncio.Event()
        # Process exits are also kept on disk until delivered (id of the outbox's message ->
        # its file), and those an earlier run of this helper left go with its registration.
        self._undelivered = UndeliveredExits(config.logs_dir / ".undelivered-exits" / config.server_name)
        self._exit_files: dict[int, Path] = {}
        self._inherited: list[tuple[helper_pb2.ProcessExitRequest, Path]] = []
        # Command ids already taken (bounded: a re-send comes within seconds, not days).
        self._seen_commands: collections.OrderedDict[str, asyncio.Task[None]] = collections.OrderedDict()
        self._stopping = False  # set by stop(): no launch or activation starts any more
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        try:
            self.ramdisk.prepare()
        except OSError as exc:
            if exc.filename is None:  # its own words already say what to do
                raise
            raise OSError(f"--ramdisk {self.ramdisk.root}: cannot create it ({exc.strerror}); give a directory "
                          "this helper can create and write (default /dev/shm/gandiva-SERVER)") from None
        _check_log_dir(self.config.logs_dir)
        self.lease_file = lease_path(self.ramdisk.root)
        self.jobs.lease_file = str(self.lease_file)
        self._inherited = self._undelivered.load(self.config.server_name)
        if self._inherited:
            log.info("%d process exit(s) an earlier run of this helper could not deliver (jobs %s): "
                     "sent with its registration", len(self._inherited),
                     ", ".join(sorted({x.job_id for x, _ in self._inherited})))
        left = kill_left_behind(self.ramdisk.root)
        if left:
            log.warning("killed %d process(es) an earlier run of this helper left running (jobs %s): "
                        "the scheduler places those jobs again", len(left), ", ".join(sorted({j for _, j in left})))
        self._server = agent_server(self.ramdisk, self.config.security.token, self.scheduler_now)
        warning = check_exposure(self.config.listen, self.config.tls, self.config.tls is not None
                                 and bool(self.config.tls.client_ca), self.config.insecure,
                                 f"helper {self.config.server_name}'s agent", auth_flag="--tls-client-ca")
        port = add_port(self._server, self.config.listen, self.config.tls)
        if port == 0:
            raise OSError(f"--listen {self.config.listen}: cannot bind")
        if warning:  # with the port bound, not `:0`
            log.warning("%s", warning.replace(f" {self.config.listen} ",
                                              f" {self.config.listen.rpartition(':')[0]}:{port} ", 1))
        await self._server.start()
        host = self.config.listen.rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = socket.getfqdn()  # peers need a name they can reach, not the wildcard
        self.address = f"{host}:{port}"
        log.info("helper %s: agent on %s, ramdisk %s, %s GPUs (%s), host memory for jobs %s",
                 self.config.server_name, self.address, self.ramdisk.root, len(self.backend.gpus()),
                 self.backend.name, format_size(self.host_memory_bytes) if self.host_memory_bytes
                 else "not reported (not checked)")
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run_sessions()), loop.create_task(self._sample_loop()),
                       loop.create_task(self._housekeeping()), loop.create_task(self._lease_watchdog())]

    async def stop(self) -> None:
        """Stop the jobs (they cannot be supervised without us), tell the scheduler if
        it is reachable, and close the server."""
        self._stopping = True
        for task in self._seen_commands.values():
            task.cancel()  # a launch or activation waiting on a process we are about to stop
        await asyncio.gather(*self._seen_commands.values(), return_exceptions=True)
        await self.jobs.stop_all()
        # Let the live session deliver the exits just posted, then take over what is left.
        deadline = asyncio.get_running_loop().time() + 2.0
        while self._outbox and self.registered.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._flush_outbox(timeout_s=2.0)
        await self._say_leaving(timeout_s=2.0)
        if self._server is not None:
            await self._server.stop(1.0)
        self.backend.close()
        if self.lease_file.parent != self.ramdisk.root:
            # Its folder in RAM goes with it (one per helper would pile up in /dev/shm); a
            # helper killed -9 leaves it, and its next start on that ramdisk takes it again.
            with contextlib.suppress(OSError):
                self.lease_file.unlink(missing_ok=True)
                self.lease_file.parent.rmdir()

    # ---- reports -------------------------------------------------------------------

    def _process_exited(self, proc: JobProcess) -> None:
        code = proc.exit_code if proc.exit_code is not None else -1
        message = helper_pb2.ProcessExitRequest(
            server=self.config.server_name,
            job_id=proc.job_id,
            incarnation=proc.incarnation,
            exit_code=code,
            reason=exit_reason(code, proc.stopped),
            steps=proc.last_step,  # its runtime's own count: its last reports may not have arrived
        )
        path = self._undelivered.keep(message)
        if path is not None:
            self._exit_files[id(message)] = path
        self._post(message)

    def _post(self, message: Any) -> None:
        self._outbox.append(message)
        self._outbox_ready.set()

    def _post_samples(self, request: helper_pb2.GpuSamplesRequest) -> None:
        """Samples are perishable: the newest batch replaces one still waiting. Not the batch
        being sent (the outbox's head while _send_queued waits for its answer): removing it
        made that send's end take the report behind it out of the outbox unsent. On a busy
        host, where a send outlasts the sampler's report interval, every command result and
        process exit posted behind a batch in flight was lost: a pre-warm launch answered
        nothing for 300 s although its process held warm, and its stop nothing for 30 s."""
        for i, queued in enumerate(self._outbox):
            if isinstance(queued, helper_pb2.GpuSamplesRequest) and queued is not self._sending:
                del self._outbox[i]
                break
        self._post(request)

    async def _send(self, stub: helper_pb2_grpc.HelperStub, message: Any) -> None:
        if isinstance(message, helper_pb2.ProcessExitRequest):
            await stub.ReportProcessExit(message, timeout=RPC_TIMEOUT_S)
        elif isinstance(message, helper_pb2.HelperCommandResult):
            await stub.ReportCommandResult(message, timeout=RPC_TIMEOUT_S)
        else:
            await stub.ReportGpuSamples(message, timeout=RPC_TIMEOUT_S)

    async def _send_queued(self, stub: helper_pb2_grpc.HelperStub) -> None:
        while self._outbox:
            # Sent in order and removed only once taken: a transient failure reconnects
            # and retries; a refusal for good is logged and the report dropped.
            message = self._sending = self._outbox[0]
            try:
                await self._send(stub, message)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in PERMANENT:
                    raise
                self.dropped += 1
                log.error("scheduler refused a %s for good (%s: %s); dropped",
                          type(message).__name__, exc.code().name, exc.details())
            finally:
                self._sending = None
            # That very message, by identity (never "the head now": see _post_samples).
            for i, queued in enumerate(self._outbox):
                if queued is message:
                    del self._outbox[i]
                    break
            if (path := self._exit_files.pop(id(message), None)) is not None:
                self._undelivered.forget(path)

    async def _drain_outbox(self, stub: helper_pb2_grpc.HelperStub) -> None:
        delay, said = 0.2, False
        while True:
            try:
                await self._send_queued(stub)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                # Not taken now (the scheduler's database unreachable): kept, in order, and
                # tried again; the session goes on (a scheduler that is gone ends it through
                # its heartbeats and command stream). Before, the session ended, and its
                # registration was refused until the database was back.
                if not said:
                    log.warning("the scheduler could not take a %s yet (%s); trying again",
                                type(self._outbox[0]).__name__, exc.details())
                    said = True
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            delay, said = 0.2, False
            self._outbox_ready.clear()
            await self._outbox_ready.wait()

    async def _flush_outbox(self, timeout_s: float) -> None:
        if not self._outbox:
            return
        try:
            async with aio_channel(self.config.scheduler, self.config.security) as channel:
                stub = helper_pb2_grpc.HelperStub(channel)
                async with asyncio.timeout(timeout_s):
                    await self._send_queued(stub)
        except (grpc.aio.AioRpcError, TimeoutError):
            kept = sum(id(m) in self._exit_files for m in self._outbox)
            log.warning("scheduler unreachable; %d report(s) not delivered%s", len(self._outbox),
                        f" ({kept} process exit(s) kept on disk, sent when this helper next starts)" if kept else "")

    async def _say_leaving(self, timeout_s: float) -> None:
        """Tell the scheduler this server runs nothing any more and is going (its jobs were
        stopped and their exits reported): it goes down now, and the name is free at once
        for this helper's restart, instead of after the heartbeat timeout."""
        if not self.registered.is_set():
            return
        try:
            async with aio_channel(self.config.scheduler, self.config.security) as channel:
                await helper_pb2_grpc.HelperStub(channel).Heartbeat(helper_pb2.HeartbeatRequest(
                    name=self.config.server_name, instance=self.instance, leaving=True), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.warning("could not tell the scheduler this helper is leaving (%s); it marks "
                        "the server down after its heartbeat timeout", exc.code().name)

    # ---- the session with the scheduler -------------------------------------------

    def _register_request(self) -> helper_pb2.RegisterServerRequest:
        return helper_pb2.RegisterServerRequest(
            name=self.config.server_name,
            address=self.address,
            gpus=[
                common_pb2.Gpu(index=g.index, uuid=g.uuid, model=g.model,
                               memory_total_bytes=g.memory_total_bytes)
                for g in self.backend.gpus()
            ],
            ramdisk=str(self.ramdisk.root),
            shared_root=str(self.config.shared_root.resolve()) if self.config.shared_root else "",
            host_memory_bytes=self.host_memory_bytes,
            instance=self.instance,
            exits=self._exits_to_register(),
        )

    def _exits_to_register(self) -> list[helper_pb2.ProcessExitRequest]:
        """What an earlier run left, then the exits still in the outbox, the newest
        MAX_REGISTER_EXITS. Those of the outbox too: back from a cut that outlasted the
        heartbeat timeout, a job that ended meanwhile was re-queued, and its exit, sent only
        after the registration, came after the round that placed the job again (it ran a
        second time). With the registration, the scheduler applies it first. Sent again
        from the outbox after it, where it changes nothing."""
        exits = [x for x, _ in self._inherited]
        exits += [m for m in self._outbox if isinstance(m, helper_pb2.ProcessExitRequest)]
        return exits[-MAX_REGISTER_EXITS:]

    async def _run_sessions(self) -> None:
        backoff = 0.2
        said, said_at, unsaid = "", 0.0, 0
        while True:
            try:
                channel, reply = await self._register()
                try:
                    await self._session(helper_pb2_grpc.HelperStub(channel), reply)
                finally:
                    await channel.close()
            except (grpc.aio.AioRpcError, SessionEnded) as exc:
                if self.registered.is_set():
                    said = ""  # a session that was up: its end is always said
                self.registered.clear()
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                # A scheduler not there (not started yet, a wrong --scheduler) was the same
                # warning every 2 s for as long as it lasted, and never said what to check.
                now = time.monotonic()
                if detail != said or now - said_at >= REPEAT_WARNING_S:
                    hint = ""
                    if "failed to connect" in (detail or "").lower():
                        hint = (f"; is the scheduler running at {self.config.scheduler}? (start it with "
                                "`gandiva scheduler`, or give this helper --scheduler ADDR or GANDIVA_SCHEDULER)")
                    again = f"; {unsaid} more tries since the last warning" if unsaid else ""
                    log.warning("scheduler session ended (%s); reconnecting%s%s", detail, hint, again)
                    said, said_at, unsaid = detail, now, 0
                else:
                    unsaid += 1
                if isinstance(exc, grpc.aio.AioRpcError):
                    self._stop_superseded(exc)
            except Exception as exc:  # a session must end, never the sessions
                # Anything else a session task raised (an OSError of a file system gone
                # read-only, a bug) ended this loop for good: the helper process lived on,
                # silent, its server called down and its jobs re-placed, and nothing said why.
                self.registered.clear()
                detail = f"{type(exc).__name__}: {exc}"
                now = time.monotonic()
                if detail != said or now - said_at >= REPEAT_WARNING_S:
                    log.error("scheduler session failed (%s); registering again", detail, exc_info=exc)
                    said, said_at, unsaid = detail, now, 0
            await asyncio.sleep(backoff)
            # Never slower than a heartbeat: a scheduler back from a restart hears from
            # every live helper well before it may call a silent server down.
            backoff = (min(MAX_BACKOFF_S, self._heartbeat_interval_s, backoff * 2)
                       if not self.registered.is_set() else 0.2)

    def _stop_superseded(self, exc: grpc.aio.AioRpcError) -> None:
        """Refused because another helper instance holds this server's name, while this
        one's lease has run out: the scheduler gave the name away only after this helper
        was silent past its heartbeat timeout, so it has re-queued (or re-queues, once the
        new instance's heartbeats lack them) every job placed here. The frozen copies
        here can never be let train again; kill them rather than hold their memory (and
        GPUs) frozen for as long as this helper keeps being refused. Killing a copy loses
        no job: the scheduler restarts it from its restore point wherever it places it."""
        if not (self.frozen and exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                and NAME_HELD in (exc.details() or "")):
            return
        for job_id, incarnation in self.jobs.running_pairs():
            log.warning("job %s/%s: this server's name is held by another live helper since this one's "
                        "lease ran out; the scheduler has re-placed its jobs: killing this copy",
                        job_id, incarnation)
            self.jobs.fence(job_id, incarnation)

    async def _register(self) -> tuple[grpc.aio.Channel, helper_pb2.RegisterServerResponse]:
        """Register over a new connection, and over one more every REGISTER_HEDGE_S while
        none has answered (each waits RPC_TIMEOUT_S): the first answer wins and its
        channel carries the session; the first failure ends the try (the caller backs off).

        On a flapping link (cut and restored every 1-3 s) a Register reached the scheduler
        and its answer did not come back within RPC_TIMEOUT_S: its segments, lost in a cut,
        waited for TCP's next retransmission, whose timeout doubles with each loss and had
        grown to 1.7-3.5 s, long after the link was back (`ss -ti` in the helper's
        namespace). The next try came 5 s later, often over the same connection (gRPC
        shares one per address across a process's channels), so getting a new session took
        9-18 s, jobs frozen by the lease meanwhile, and with a heartbeat timeout under about
        20 s the server could be called down. A new connection starts with fresh timers: the
        first that meets the link up answers within a round trip
        (tests/migration_helper/test_helper_reregister.py, tests/multihost/test_flapping_link.py)."""
        request = self._register_request()
        tries: dict[asyncio.Task[helper_pb2.RegisterServerResponse], grpc.aio.Channel] = {}

        async def register(stub: helper_pb2_grpc.HelperStub) -> helper_pb2.RegisterServerResponse:
            return await stub.Register(request, timeout=RPC_TIMEOUT_S)

        try:
            while True:
                if len(tries) * REGISTER_HEDGE_S < RPC_TIMEOUT_S:
                    channel = aio_channel(self.config.scheduler, self.config.security, SESSION_CHANNEL_OPTIONS)
                    tries[asyncio.create_task(register(helper_pb2_grpc.HelperStub(channel)))] = channel
                done, _ = await asyncio.wait(tries, timeout=REGISTER_HEDGE_S, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    continue
                answered = [t for t in done if t.exception() is None]
                winner = answered[0] if answered else next(iter(done))
                reply = winner.result()  # the first failure, when none answered, ends the try
                return tries.pop(winner), reply
        finally:
            for task, channel in tries.items():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await channel.close()

    async def _session(self, stub: helper_pb2_grpc.HelperStub, reply: helper_pb2.RegisterServerResponse) -> None:
        self._heard_clock(reply.scheduler_time)
        for _, path in self._inherited:  # taken with the registration
            self._undelivered.forget(path)
        self._inherited = []
        lease = reply.lease_s
        interval = reply.heartbeat_interval_s or 2.0
        if self.config.lease_s is not None:
            mine = self.config.lease_s
            if mine < 2 * interval:
                # As the scheduler holds its own lease (Settings): `--lease 0.001` froze every
                # job here at once, and none was ever thawed (no answer comes within 1 ms).
                mine = 2 * interval
                log.warning("--lease %g s is shorter than two of the scheduler's heartbeats (%g s each): the "
                            "jobs here would be frozen between them; using %g s", self.config.lease_s,
                            interval, mine)
            lease = min(lease, mine) if lease else mine
        self.lease_s = lease
        if not self._lease_from:  # the first registration: the lease starts now
            self._lease_from = asyncio.get_running_loop().time()
        self._publish_lease()
        self.sessions += 1
        self.registered.set()
        self._heartbeat_interval_s = interval
        log.info("registered with %s (heartbeat every %.1f s)", self.config.scheduler, interval)
        tasks = [
            asyncio.create_task(self._heartbeats(stub, interval)),
            asyncio.create_task(self._commands(stub)),
            asyncio.create_task(self._drain_outbox(stub)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # re-raise why the session ended
            raise SessionEnded("a session task returned")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeats(self, stub: helper_pb2_grpc.HelperStub, interval: float) -> None:
        """One heartbeat every `interval`, whether the ones before were answered yet or
        not (each waits RPC_TIMEOUT_S for its answer; a failed one ends the session). On
        a late link (round trips of seconds) the lease is then renewed every `interval`
        by answers a round trip old. Before, each heartbeat waited for the answer to the
        one before, then `interval`: an answer came only every round trip plus
        `interval`, the lease ran up to two round trips plus `interval`, and with 0.3-2 s
        of delay each way (lease 6 s) the jobs froze for 3-4 s every 10-12 s although no
        heartbeat was lost (tests/multihost/test_degraded_links.py -k late_heartbeats).
        At most HEARTBEATS_IN_FLIGHT wait at once: a scheduler slow to answer (its
        database locked) is not sent more and more of them."""
        loop = asyncio.get_running_loop()
        # The heartbeats in flight, each with its send time (read by the hedging too).
        pending: dict[asyncio.Task[None], float] = {}
        self._rtts.clear()
        self._hedge_said = False
        hedges = asyncio.create_task(self._hedge_heartbeats(pending))
        try:
            while True:
                due = loop.time() + interval
                pending[asyncio.create_task(self._heartbeat(stub))] = loop.time()
                while (left := due - loop.time()) > 0 or len(pending) >= HEARTBEATS_IN_FLIGHT:
                    if not pending:
                        await asyncio.sleep(left)
                        break
                    done, _ = await asyncio.wait(pending, timeout=max(left, 0.0) or None,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        del pending[task]
                        task.result()  # a heartbeat that failed ends the session
        finally:
            for task in (*pending, hedges):
                task.cancel()
            await asyncio.gather(*pending, hedges, return_exceptions=True)

    async def _hedge_heartbeats(self, sent: dict[asyncio.Task[None], float]) -> None:
        """While the session's oldest unanswered heartbeat (`sent`: each one's send time)
        has waited HEARTBEAT_HEDGE_S, send one more every HEARTBEAT_HEDGE_S over a new
        connection of its own (at most HEARTBEATS_IN_FLIGHT at once). Its answer renews the
        lease and fences what it names, as any heartbeat's; its failure ends nothing.

        The session ends only once a heartbeat has gone unanswered for RPC_TIMEOUT_S (a
        late link must not end it). On a flapping link the session's connection, its
        retransmission timeout grown through the cuts, stayed silent that long after the
        link was back: the scheduler heard nothing for 5 s and more, so with a heartbeat
        timeout under about 7 s it called the server down (its jobs re-placed), and the
        jobs froze once the lease ran out. A new connection starts with fresh timers and is
        answered within a round trip of the link's return
        (tests/migration_helper/test_helper_heartbeat_hedge.py). On a late link (answers
        seconds old, none lost) the wait is twice the recent median round trip instead (at
        most half the lease, so that a hedge can still renew it): with 1 s there, a hedge
        went out about every second (65 in 75 s in test_degraded_links -k late_heartbeats),
        each a new connection and a log line, for nothing."""
        loop = asyncio.get_running_loop()
        hedges: set[asyncio.Task[None]] = set()
        last = 0.0
        try:
            while True:
                await asyncio.sleep(HEARTBEAT_HEDGE_S / 4)
                hedges = {t for t in hedges if not t.done()}
                now = loop.time()
                oldest = min((at for task, at in sent.items() if not task.done()), default=now)
                wait = max(HEARTBEAT_HEDGE_S, min(2 * statistics.median(self._rtts) if self._rtts else 0.0,
                                                  self.lease_s / 2 if self.lease_s > 0 else float("inf")))
                if now - oldest >= wait and now - last >= HEARTBEAT_HEDGE_S \
                        and len(hedges) < HEARTBEATS_IN_FLIGHT:
                    last = now
                    hedges.add(asyncio.create_task(self._hedge_heartbeat(now - oldest)))
        finally:
            for task in hedges:
                task.cancel()
            await asyncio.gather(*hedges, return_exceptions=True)

    async def _hedge_heartbeat(self, waited: float) -> None:
        channel = aio_channel(self.config.scheduler, self.config.security, SESSION_CHANNEL_OPTIONS)
        try:
            await self._heartbeat(helper_pb2_grpc.HelperStub(channel), hedge=True)
            self.hedged_heartbeats += 1
            # Said once a session (then at debug level): a stuck connection hedges every second.
            log.log(logging.INFO if not self._hedge_said else logging.DEBUG,
                    "a heartbeat unanswered for %.1f s on the session's connection; another was answered "
                    "over a new connection (the lease renewed)", waited)
            self._hedge_said = True
        except (grpc.aio.AioRpcError, SessionEnded) as exc:
            log.debug("a heartbeat over a new connection failed: %s", exc)
        finally:
            await channel.close()

    async def _heartbeat(self, stub: helper_pb2_grpc.HelperStub, hedge: bool = False) -> None:
        sent_at = asyncio.get_running_loop().time()
        pairs = self.jobs.running_pairs()
        reply = await stub.Heartbeat(
            helper_pb2.HeartbeatRequest(
                name=self.config.server_name,
                running_jobs=sorted({j for j, _ in pairs}),
                running=[helper_pb2.JobIncarnation(job_id=j, incarnation=i) for j, i in pairs],
                peers_version=self._peers_version,
                want_kept=self._want_kept,
                instance=self.instance,
            ),
            timeout=RPC_TIMEOUT_S,  # the lease watchdog runs apart: a slow answer freezes nothing early
        )
        if not reply.known:
            raise SessionEnded("the scheduler does not know this server; registering again")
        if not hedge:
            self._rtts.append(asyncio.get_running_loop().time() - sent_at)
        # Answers may come out of order (several heartbeats in flight on a late link): the
        # peer list and the kept checkpoints come from the newest one sent only.
        if sent_at >= self._newest_answer:
            self._newest_answer = sent_at
            self._heard_clock(reply.scheduler_time)
            # A new version replaces the list, even by an empty one (every peer gone);
            # version 0 is a scheduler that lists no peers at all: keep what we have.
            if reply.peers_version and reply.peers_version != self._peers_version:
                self.peers = {p.address: p.name for p in reply.peers}
                self._peers_version = reply.peers_version
            if reply.kept_listed:
                self._kept, self._kept_at = set(reply.kept), asyncio.get_running_loop().time()
                self._want_kept = False
        # Stale launches die first (stale stays stale, whatever the answer's age); then,
        # the lease renewed, the others may train again.
        for stop in reply.stop:
            self.jobs.fence(stop.job_id, stop.incarnation)
        self._lease_renewed(sent_at, set(pairs))

    def scheduler_now(self) -> float:
        """The scheduler's wall clock as this helper last heard it (Unix seconds)."""
        return time.time() + self.clock_gap_s

    def _heard_clock(self, scheduler_time: float) -> None:
        """A server whose clock is hours off (NTP never set it) refused every checkpoint
        with "the transfer ticket has expired": tickets are good for an hour by the
        scheduler's clock. The answer's delay (at most RPC_TIMEOUT_S) is the error."""
        if scheduler_time <= 0:
            return
        self.clock_gap_s = scheduler_time - time.time()
        if abs(self.clock_gap_s) > CLOCK_GAP_WARN_S and abs(self.clock_gap_s - self._gap_warned) > CLOCK_GAP_WARN_S:
            self._gap_warned = self.clock_gap_s
            log.warning("this server's wall clock is %.0f s %s the scheduler's: fix its time (NTP); checkpoint "
                        "transfer tickets are checked on the scheduler's clock", abs(self.clock_gap_s),
                        "ahead of" if self.clock_gap_s < 0 else "behind")

    def kept_checkpoints(self) -> set[str] | None:
        """What the scheduler last said it still needs here, if it said so since the last
        housekeeping round (None: unknown, and housekeeping keeps every job's newest
        checkpoint); the next heartbeat asks again."""
        fresh = asyncio.get_running_loop().time() - self._kept_at <= 2 * self.config.housekeeping_s
        kept = self._kept if fresh else None
        self._want_kept = True
        return kept

    async def not_a_peer(self, address: str) -> str:
        """Why ``address`` is not the agent of a registered helper ("" when it is). An
        address not in the list waits for the next heartbeat answer first: a helper
        that registered moments ago may not be in the copy this helper holds yet."""
        # Looked at every 0.1 s, not waited for on an asyncio.Condition with wait_for: a
        # transfer cancelled just as that wait timed out left the condition's lock held by a
        # task that had ended, and the heartbeat loop, which took it for each answer, stopped.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PEER_WAIT_S
        while address not in self.peers:
            if loop.time() >= deadline:
                return (f"{address} is not the agent address of a registered helper (the scheduler "
                        f"lists {len(self.peers)}: {', '.join(sorted(self.peers)[:5]) or 'none yet'}); "
                        "a checkpoint is streamed only to the scheduler's registered helpers")
            await asyncio.sleep(0.1)
        return ""

    def _lease_renewed(self, sent_at: float, reported: set[tuple[str, str]]) -> None:
        """A heartbeat sent at `sent_at`, reporting the launches `reported`, was answered
        (the stale ones it named are killed): the lease runs from then.
        Frozen jobs thaw only on the answer to a heartbeat sent after they were frozen:
        a late answer to one sent before the lease ran out says nothing about the
        scheduler now (it may already be re-placing them), so it must not thaw them
        for a moment (issue 9). A fresh round trip does, and brings the stops with it,
        for the launches that heartbeat reported only: one started since (read from the
        command stream as this helper came back from a stop: the scheduler may have placed
        the job elsewhere meanwhile) stays frozen until a heartbeat reporting it is
        answered without naming it stale. Before, that first answer thawed it too, and it
        ran until the next one."""
        self._lease_from = max(self._lease_from, sent_at)
        fresh = sent_at >= self._frozen_at and asyncio.get_running_loop().time() - sent_at <= self.lease_s
        if fresh and self.frozen:
            self.frozen = False
            log.warning("lease renewed: jobs thawed")
        self._publish_lease()
        if fresh and self.jobs.any_frozen():
            self.jobs.thaw_all(reported)

    def _publish_lease(self) -> None:
        """Write the lease's end for the jobs' shims (none while frozen: the end written
        last has passed). One that cannot be written (its file system full) is removed, so
        that no shim holds for it: the watchdog's SIGSTOP still freezes them in time. Never
        raises: called with each heartbeat's answer, an error here ended the heartbeats for
        good (a file system turned read-only, where the file could not be removed either:
        the helper went silent, its server was called down and every job re-placed)."""
        if self.frozen:
            return
        path = self.lease_file
        try:
            # On time.monotonic()'s scale, which the shims read (the loop's may be uvloop's).
            write_lease(path, time.monotonic() + self.lease_left())
            self._lease_unwritten = False
        except OSError as exc:
            try:
                path.unlink(missing_ok=True)
                outcome = "removed; jobs are frozen by SIGSTOP only"
            except OSError as gone:
                outcome = (f"nor removed ({gone.strerror}): the jobs' shims hold once the end it holds has "
                           "passed, until it can be written again")
            if not self._lease_unwritten:  # once, not at every heartbeat
                log.warning("cannot write the lease file %s (%s): %s", path, exc, outcome)
            self._lease_unwritten = True

    def lease_left(self) -> float:
        """Seconds until the lease runs out with no heartbeat answered: what the lease file
        tells the jobs' shims and what /metrics reports, from this one place. 0 once it has
        run out (the jobs frozen, or frozen at the watchdog's next look) and before a first
        registration; inf with no lease (a scheduler that sends none and no --lease)."""
        if self.frozen or not self._lease_from:
            return 0.0
        if self.lease_s <= 0:
            return math.inf
        return max(0.0, self._lease_from + self.lease_s - asyncio.get_running_loop().time())

    def _lease_ran_out(self) -> bool:
        """Whether no heartbeat has been answered for the lease: the jobs must be frozen
        (and they are frozen until thawed by _lease_renewed). Asked by the watchdog every
        LEASE_POLL_S and by every launch and activation before its process may train: a
        helper stopped (SIGSTOP) past its lease, then continued, read the launch the
        scheduler had sent before calling it down and started it before the watchdog's
        next look; the job trained there beside its new copy elsewhere."""
        loop = asyncio.get_running_loop()
        if not self.frozen and self.lease_s > 0 and loop.time() - self._lease_from > self.lease_s:
            log.warning("no heartbeat answered for %.1f s (lease %.1f s): freezing jobs",
                        loop.time() - self._lease_from, self.lease_s)
            self._frozen_at = loop.time()
            self.frozen = True
        return self.frozen

    async def _lease_watchdog(self) -> None:
        """No heartbeat answered for the lease: freeze every job. The scheduler re-places
        a silent server's jobs only after its lease has surely run out (down_after_s),
        so a cut-off server never trains a job while its replacement runs elsewhere."""
        while True:
            await asyncio.sleep(LEASE_POLL_S)
            if self._lease_ran_out():
                # Again on every poll until thawed: a launch that started meanwhile is frozen too.
                self.jobs.freeze_all()

    async def _commands(self, stub: helper_pb2_grpc.HelperStub) -> None:
        stream = stub.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server=self.config.server_name))
        async for command in stream:
            if command.command_id in self._seen_commands:
                log.info("command %s seen before; not run twice", command.command_id)
                continue
            if self._stopping and command.WhichOneof("body") in ("launch", "activate"):
                # A process started now would outlive stop_all(): unsupervised once this
                # helper is gone, while the scheduler places the job again (it re-queued it
                # on the stopped exit). Unanswered: "leaving" takes the server down, and the
                # command fails with it.
                log.warning("command %s: %s ignored: this helper is stopping", command.command_id,
                            command.WhichOneof("body"))
                continue
            self._seen_commands[command.command_id] = asyncio.create_task(self._run_command(command))
            while len(self._seen_commands) > MAX_REMEMBERED_COMMANDS:
                self._seen_commands.popitem(last=False)
        raise SessionEnded("the scheduler closed the command stream")

    async def _run_command(self, command: helper_pb2.HelperCommand) -> None:
        kind = command.WhichOneof("body") or ""
        job_id = getattr(getattr(command, kind), "job_id", "") if kind else ""
        log.info("command %s: %s job %s", command.command_id, kind, job_id)
        result = await self.jobs.handle(command)
        if not result.ok:
            log.warning("command %s failed (job %s): %s", command.command_id, job_id, result.message)
        self._post(result)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.config.housekeeping_s)
            try:
                self.ramdisk.prune(set(self.jobs.running_jobs()), self.config.checkpoint_retain_s,
                                   kept=self.kept_checkpoints())
            except OSError:  # a checkpoint vanishing under us is fine; retry next round
                log.warning("ramdisk housekeeping failed", exc_info=True)

    # ---- GPU sampling ---------------------------------------------------------------

    async def _sample_loop(self) -> None:
        interval = self.config.sample_interval_s
        per_report = max(1, round(self.config.report_interval_s / interval))
        n = 0
        while True:
            self.sampler.take()
            n += 1
            if n % per_report == 0:
                self._post_samples(self.sampler.report(self.config.server_name))
            await asyncio.sleep(interval)


def lease_path(ramdisk: Path, home: Path = LEASE_HOME) -> Path:
    """Where the helper of ``ramdisk`` publishes its lease's end for its jobs' shims: a
    folder of its own (mode 700) in RAM (``home``, /dev/shm), named after the ramdisk (one
    per helper, the same at its next start). Not in the ramdisk, which an operator may put
    on a disk: a disk that turned read-only (ext4 mounted errors=remount-ro, on an I/O
    error) left there a lease file that could be neither rewritten nor removed, and every
    job's shim held for good once its end passed, while the helper heartbeated on. The
    ramdisk itself where there is no ``home``, or where that folder is not this user's own
    (another user made it first: /dev/shm is everyone's)."""
    digest = hashlib.sha256(str(ramdisk.resolve()).encode()).hexdigest()[:16]
    folder = home / f"gandiva-lease-{digest}"
    try:
        if not home.is_dir():
            return ramdisk / LEASE_FILE
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        st = folder.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("%s is not a folder of this helper's user: the lease file stays in the ramdisk", folder)
            return ramdisk / LEASE_FILE
        if st.st_mode & 0o077:
            folder.chmod(0o700)
    except OSError as exc:
        log.warning("cannot make %s (%s): the lease file stays in the ramdisk", folder, exc.strerror)
        return ramdisk / LEASE_FILE
    return folder / LEASE_FILE


def _check_log_dir(path: Path) -> None:
    """OSError naming --log-dir unless the jobs' output can be written under ``path``: a helper
    given one it could not create started all the same, and every job it launched failed."""
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise OSError(f"--log-dir {path}: cannot create or write it ({exc.strerror or exc}); give a directory "
                      "this helper can write: each job's output goes there (gandiva logs reads it)") from None
