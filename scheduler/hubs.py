"""In-memory routing of commands to the processes connected right now.

The HelperHub holds, per server, the commands waiting for that server's helper
stream and the futures of commands awaiting a result; the RuntimeHub does the same
for each job's shim stream. Neither is persisted: after a scheduler restart the
helpers and shims reconnect and the engine reconciles from the database.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TypeVar

from protos.gandiva.v1 import helper_pb2, runtime_pb2
from scheduler.errors import FailedPrecondition, Unavailable
from scheduler.pace import Pace

K = TypeVar("K")
V = TypeVar("V")


def _command_id() -> str:
    return uuid.uuid4().hex[:16]


def command_word(kind: runtime_pb2.CommandKind.ValueType) -> str:
    """A runtime command's kind as said in messages: "suspend", "stop_for_migration"."""
    return runtime_pb2.CommandKind.Name(kind).removeprefix("COMMAND_KIND_").lower()


def _resolve(pending: dict[str, asyncio.Future], command_id: str, result: object) -> None:
    fut = pending.pop(command_id, None)
    if fut is not None and not fut.done():
        fut.set_result(result)


def remember(kept: dict[K, V], key: K, value: V, limit: int) -> None:
    """``kept[key] = value`` as its newest entry, the oldest dropped beyond ``limit``."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > limit:
        del kept[next(iter(kept))]


def _fail(pending: dict[str, asyncio.Future], reason: str) -> None:
    for fut in pending.values():
        if not fut.done():
            fut.set_exception(Unavailable(reason))
    pending.clear()


# Commands kept per server for HelperHub.resend (answered ones leave at once).
MAX_UNANSWERED = 1000

# Put in a dropped box's queue (``HelperHub.fail_all``): the command stream reading it ends,
# so that a helper that was only silent (paused, cut off for a while) reconnects its stream
# to the server's new box instead of waiting on the old one for commands that never come.
# Told by identity (``is``); never sent.
END_STREAM = helper_pb2.HelperCommand(command_id="end of stream")


# A server's command as queued: (its place in the order they were sent, the command).
Queued = tuple[int, helper_pb2.HelperCommand]


@dataclass
class _Outbox:
    # Commands in the order they were sent, whatever was put back in its place since
    # (HelperHub.resend, put_back): a PriorityQueue of Queued.
    queue: asyncio.PriorityQueue = field(default_factory=asyncio.PriorityQueue)
    pending: dict[str, asyncio.Future] = field(default_factory=dict)
    # Commands written into a command stream and not answered yet (HelperHub.resend).
    sent: dict[str, Queued] = field(default_factory=dict)
    sent_so_far: int = 0


class HelperHub:
    def __init__(self) -> None:
        self._boxes: dict[str, _Outbox] = {}

    def box(self, server: str) -> _Outbox:
        return self._boxes.setdefault(server, _Outbox())

    def send(self, server: str, cmd: helper_pb2.HelperCommand) -> asyncio.Future:
        """Queue `cmd` for `server`'s helper; the future resolves with its result."""
        if not cmd.command_id:
            cmd.command_id = _command_id()
        box = self.box(server)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        box.pending[cmd.command_id] = fut
        box.sent_so_far += 1
        box.queue.put_nowait((box.sent_so_far, cmd))
        return fut

    async def call(
        self, server: str, cmd: helper_pb2.HelperCommand, timeout: float, watch: str = ""
    ) -> helper_pb2.HelperCommandResult:
        """``watch``: another server whose going down fails the call too (a transfer to
        its agent: a stream into a cut link would otherwise wait out the whole timeout)."""
        fut = self.send(server, cmd)
        if watch and watch != server:
            self.box(watch).pending[cmd.command_id] = fut
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"helper on {server} did not answer within {timeout:.0f}s") from None
        finally:
            if watch and (box := self._boxes.get(watch)) is not None:
                box.pending.pop(cmd.command_id, None)

    def resolve(self, server: str, result: helper_pb2.HelperCommandResult) -> None:
        box = self._boxes.get(server)  # a result for a server without a box has no taker
        if box is not None:
            box.sent.pop(result.command_id, None)
            _resolve(box.pending, result.command_id, result)

    def delivered(self, box: _Outbox, item: Queued) -> None:
        """``item``'s command was written into a command stream: gRPC took it, which does
        not mean the helper got it. Kept until answered, for ``resend``."""
        cmd = item[1]
        if cmd.command_id in box.pending:
            box.sent[cmd.command_id] = item
            if len(box.sent) > MAX_UNANSWERED:  # only ever awaited commands; bounded all the same
                box.sent.pop(next(iter(box.sent)))

    @staticmethod
    def put_back(box: _Outbox, item: Queued) -> None:
        """``item`` was taken from ``box`` by a command stream that could not write it (ended
        meanwhile): it goes back in its place, before the commands sent after it. Before,
        it went behind them, also behind those a newer stream's ``resend`` had already put
        back: a launch then reached the helper after a later command about its job."""
        box.queue.put_nowait(item)

    def resend(self, server: str) -> int:
        """A helper opened a new command stream: the commands written into its earlier ones
        and still awaited go first on it. A connection that died (its link cut: the helper
        ends its session when a heartbeat goes unanswered, then registers again and opens a
        new stream) took with it what was in flight, with no error on this side: a launch,
        a migration's pre-warm or activation then waited out its whole timeout (60-300 s),
        unanswered. The helper runs a command id once: one that did arrive is not run
        twice, and its result comes from the helper's outbox. Returns how many."""
        box = self.box(server)
        again = [item for cid, item in box.sent.items() if (fut := box.pending.get(cid)) is not None and not fut.done()]
        box.sent.clear()
        for item in again:  # each in its place: before every command still waiting
            box.queue.put_nowait(item)
        return len(again)

    def fail_all(self, server: str, reason: str) -> None:
        """The server went down: its commands in flight fail, those not yet delivered are
        dropped (their callers were told), and its command stream, if one is still open,
        ends (``END_STREAM``): the helper reconnects to a new box when it comes back."""
        box = self._boxes.pop(server, None)
        if box is not None:
            _fail(box.pending, reason)
            while not box.queue.empty():
                box.queue.get_nowait()
            box.queue.put_nowait((0, END_STREAM))


@dataclass
class RuntimeConn:
    job_id: str
    incarnation: str
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    pending: dict[str, asyncio.Future] = field(default_factory=dict)
    # The process's first training run as names (TrainSignature JSON): what a
    # pre-warmed destination rehearses when the job migrates.
    train_signature: str = ""
    # Tower copies of the variables in its graph (its TowerReport; 0: not known yet): a
    # pre-warmed destination of a grow or shrink refuses another number.
    towers: int = 0
    # When (the event loop's clock) a message of its last arrived.
    heard_at: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    # Its last mini-batch time (its progress reports): a shim reports only when its step
    # count changes, so within one mini-batch it is silent.
    step_s: float = 0.0
    # Its last migratability verdict (migratable, reason); None until it sends one. The
    # job's row may drop it (the launch marked uncontrollable meanwhile): see
    # SchedulerCore.record_runtime_connected.
    verdict: tuple[bool, str] | None = None


class RuntimeHub:
    """The shims connected now, by job and incarnation.

    During a migration two processes of one job are connected at once: the source
    and the pre-warmed destination, each with its own incarnation; commands name
    the incarnation they are for, so neither is mistaken for the other.
    """

    # A shim whose stream dropped reconnects within about a second (its back-off).
    reconnect_grace_s = 5.0
    # How many launches told to exit are remembered (kill_stale): launches end for good,
    # so only memory bounds it; a copy connecting that late is judged by runtime_hello.
    told_to_exit_kept = 4096
    # Messages a second one launch's streams are read at, together, past a burst (a runtime
    # sends about one); launches whose pace is kept (the newest to connect).
    rate, burst, paces_kept = 20, 200, 65536

    def __init__(self) -> None:
        self._conns: dict[str, dict[str, RuntimeConn]] = {}
        # Launches told to exit, whether or not connected then (oldest first): one whose
        # runtime connects afterwards is told again at once (see told_to_exit).
        self._told: dict[tuple[str, str], str] = {}
        # Launches whose runtime said hello, until their connect deadline is checked
        # (LiveEngine.watch_runtime pops them; bounded by the launches being watched).
        self._watched: dict[tuple[str, str], bool] = {}
        # Launches found unconnected at their deadline, whose hello has not come since
        # (oldest first; see give_up).
        self._given_up: dict[tuple[str, str], None] = {}
        self._paces: dict[tuple[str, str], Pace] = {}
        # Commands awaiting their ack: command id -> (job id, kind, when sent on the event
        # loop's clock, the job's mini-batch time then), for `gandiva get problems`.
        self._asked: dict[str, tuple[str, str, float, float]] = {}
        # Launches whose shim acked a suspend not yet written to the database (a write that
        # waits out an outage): a stream of one that reconnects meanwhile reads the job
        # RUNNING, and is not told to resume (resume_on_connect) for it. And how many such
        # records each launch had (the newest launches kept): one written while a hello read.
        self._suspend_unrecorded: set[tuple[str, str]] = set()
        self._suspends_recorded: dict[tuple[str, str], int] = {}

    def unanswered(self, after_s: float, steps: float) -> list[tuple[str, str, float, float]]:
        """(job id, command kind, seconds waited, its mini-batch time) of each command waiting
        for its ack longer than ``after_s`` and ``steps`` of the job's mini-batches."""
        now = asyncio.get_running_loop().time()
        return [(job_id, kind, now - at, step_s) for job_id, kind, at, step_s in list(self._asked.values())
                if now - at > max(after_s, steps * step_s)]

    def watch(self, job_id: str, incarnation: str) -> None:
        """Start remembering whether launch `incarnation` of the job ever connects."""
        self._watched[(job_id, incarnation)] = self.connected(job_id, incarnation)

    def unwatch(self, job_id: str, incarnation: str) -> None:
        self._watched.pop((job_id, incarnation), None)

    def ever_connected(self, job_id: str, incarnation: str) -> bool:
        """Whether the watched launch connected since `watch`; stops watching it."""
        return self._watched.pop((job_id, incarnation), False) or self.connected(job_id, incarnation)

    def give_up(self, job_id: str, incarnation: str) -> None:
        """That launch was found unconnected at its deadline (ever_connected, with no await
        between): its job is being marked uncontrollable. A hello of it that read the job
        before that mark was written (the database busy) saw it controllable and would not
        undo the mark: such a hello asks here instead (taken_up_again)."""
        remember(self._given_up, (job_id, incarnation), None, self.told_to_exit_kept)

    def taken_up_again(self, job_id: str, incarnation: str) -> bool:
        """Whether that launch was given up on (give_up) before this hello of it; each
        launch answers True once."""
        key = (job_id, incarnation)
        if key not in self._given_up:
            return False
        del self._given_up[key]
        return True

    def pace(self, job_id: str, incarnation: str) -> Pace:
        """What every stream of that launch reads its messages by, hellos included. It was
        one per stream: a job's process (its own runtime token is enough) opening 20 streams
        was read 20 times as fast, each with a burst of its own; and kept while the launch is
        away, so that reconnecting starts no new burst."""
        key = (job_id, incarnation)
        pace = self._paces.pop(key, None) or Pace(self.rate, self.burst)
        remember(self._paces, key, pace, self.paces_kept)
        return pace

    def attach(self, job_id: str, incarnation: str) -> RuntimeConn:
        if (job_id, incarnation) in self._watched:
            self._watched[(job_id, incarnation)] = True
        conns = self._conns.setdefault(job_id, {})
        old = conns.pop(incarnation, None)
        conn = RuntimeConn(job_id, incarnation)
        conns[incarnation] = conn
        if old is not None:
            _fail(old.pending, "the job's runtime reconnected")
        return conn

    def resume_on_connect(self, conn: RuntimeConn, recorded_before: int = 0) -> None:
        """The job is RUNNING as this launch: its shim's first command is a resume. A
        suspend whose answer was lost (a scheduler restarted or a stream dropped between
        the shim's suspending and its ack reaching the scheduler) left the shim suspended
        while the job is recorded RUNNING, and nothing would ever resume it: it sat there,
        "running", training nothing. Queued before anything else can be sent on this
        connection."""
        key = (conn.job_id, conn.incarnation)
        if key in self._suspend_unrecorded or self.suspends_recorded(*key) != recorded_before:
            # Its suspend was acked and not yet written when the hello read the job
            # (`recorded_before`: suspends_recorded before that read). Resumed here, the
            # operator's suspend was undone: the job recorded SUSPENDED while it trained.
            return
        self._queue_resume(conn, "the job is recorded running: resume if suspended")

    def suspend_unrecorded(self, job_id: str, incarnation: str, unrecorded: bool) -> None:
        """That launch's shim acked a suspend (True) whose record is being written, until
        it is (False): see resume_on_connect."""
        key = (job_id, incarnation)
        if unrecorded:
            self._suspend_unrecorded.add(key)
        else:
            self._suspend_unrecorded.discard(key)
            remember(self._suspends_recorded, key, self.suspends_recorded(*key) + 1, self.paces_kept)

    def suspends_recorded(self, job_id: str, incarnation: str) -> int:
        """How many acked suspends of that launch were written (suspend_unrecorded)."""
        return self._suspends_recorded.get((job_id, incarnation), 0)

    def resume_after(self, job_id: str, incarnation: str, reason: str) -> None:
        """Queue a resume behind the commands already sent to that launch's shim (if
        connected; one that reconnects is resumed by resume_on_connect)."""
        conn = self._conns.get(job_id, {}).get(incarnation)
        if conn is not None:
            self._queue_resume(conn, reason)

    @staticmethod
    def _queue_resume(conn: RuntimeConn, reason: str) -> None:
        # Not awaited (its ack has no taker): a shim that is not suspended answers
        # "not suspended", one that is resumes.
        conn.outbox.put_nowait(runtime_pb2.RuntimeCommand(
            command_id=_command_id(), kind=runtime_pb2.COMMAND_KIND_RESUME, reason=reason))

    def fail_pending(self, job_id: str, incarnation: str, reason: str) -> None:
        """Fail the commands awaiting an answer from that launch's shim (its server is lost)."""
        conn = self._conns.get(job_id, {}).get(incarnation)
        if conn is not None:
            _fail(conn.pending, reason)

    def answers(self, job_id: str, incarnation: str, lease_s: float) -> float:
        """Whether that launch's shim is connected and was heard from recently enough to be
        alive: within the lease, or within two of its mini-batches and a second (its
        reports come at step ends: a job of 10 s mini-batches is silent for 10 s). Returns
        how long until that window ends (by then an answering copy has been heard again),
        0 when it does not answer."""
        conn = self._conns.get(job_id, {}).get(incarnation)
        if conn is None or not incarnation:
            return 0.0
        left = conn.heard_at + max(lease_s, 2 * conn.step_s + 1.0) - asyncio.get_running_loop().time()
        return max(0.0, left)

    def kill_stale(self, job_id: str, incarnation: str, reason: str) -> bool:
        """Tell that launch's shim, if it is still connected, to exit at its next boundary
        (not awaited): the job was re-queued while this copy still runs (its server marked
        down with the job's process alive: its helper stopped or hung, not its host). Only
        that very launch; whether one was connected. One not connected now is told when
        its runtime connects (told_to_exit)."""
        if not incarnation:
            return False
        remember(self._told, (job_id, incarnation), reason, self.told_to_exit_kept)
        conn = self._conns.get(job_id, {}).get(incarnation)
        if conn is None:
            return False
        conn.outbox.put_nowait(runtime_pb2.RuntimeCommand(
            command_id=_command_id(), kind=runtime_pb2.COMMAND_KIND_KILL, reason=reason))
        return True

    def told_to_exit(self, job_id: str, incarnation: str) -> str:
        """Why that launch was told to exit (kill_stale), "" if it was not. A copy whose
        runtime was not connected then (a migration's destination restoring, its helper
        hung; a stream dropped and reconnecting) said hello later, while the database
        still called it current (the migration not yet ended): told nothing, it trained
        beside the job's restart at its source for as long as its helper was stopped."""
        return self._told.get((job_id, incarnation), "")

    def detach(self, conn: RuntimeConn) -> None:
        conns = self._conns.get(conn.job_id, {})
        if conns.get(conn.incarnation) is conn:
            del conns[conn.incarnation]
            if not conns:
                del self._conns[conn.job_id]
        _fail(conn.pending, "the job's runtime disconnected")

    def _find(self, job_id: str, incarnation: str) -> RuntimeConn | None:
        conns = self._conns.get(job_id, {})
        if incarnation:
            # A shim launched without an incarnation (by hand) answers for any.
            return conns.get(incarnation) or conns.get("")
        # No incarnation named: the most recently connected process.
        return next(reversed(conns.values()), None)

    def train_signature(self, job_id: str, incarnation: str = "") -> str:
        """The connected process's TrainSignature JSON; "" when none is known."""
        conn = self._find(job_id, incarnation)
        return conn.train_signature if conn is not None else ""

    def towers(self, job_id: str, incarnation: str = "") -> int:
        """The connected process's tower count; 0 when none is known."""
        conn = self._find(job_id, incarnation)
        return conn.towers if conn is not None else 0

    def verdict(self, job_id: str, incarnation: str = "") -> tuple[bool, str] | None:
        """The connected process's last migratability verdict; None when none is known."""
        conn = self._find(job_id, incarnation)
        return conn.verdict if conn is not None else None

    def connected(self, job_id: str, incarnation: str = "") -> bool:
        return self._find(job_id, incarnation) is not None

    async def wait_connected(self, job_id: str, timeout: float, incarnation: str = "") -> bool:
        """Give a shim that is reconnecting (its stream dropped) a moment to come back."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._find(job_id, incarnation) is None:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def call(
        self,
        job_id: str,
        kind: runtime_pb2.CommandKind.ValueType,
        timeout: float,
        checkpoint_dir: str = "",
        reason: str = "",
        incarnation: str = "",
    ) -> runtime_pb2.CommandAck:
        cmd = runtime_pb2.RuntimeCommand(
            command_id=_command_id(), kind=kind, checkpoint_dir=checkpoint_dir, reason=reason
        )
        return await self.send(job_id, cmd, timeout, incarnation)

    async def send(
        self, job_id: str, cmd: runtime_pb2.RuntimeCommand, timeout: float, incarnation: str = ""
    ) -> runtime_pb2.CommandAck:
        """Send `cmd` to the job's shim (that incarnation, if given) and await its ack.
        Never to a launch told to exit (kill_stale: its server went down, its job re-queued):
        Unavailable at once. A migration whose source server went down while its destination
        pre-warmed sent its stop-for-migration to the lost source after that, and a frozen
        host's stream looks open: the job, re-queued, was held unplaced for the command's
        120 s instead of being placed at once."""
        self._refuse_told(job_id, incarnation, cmd)
        await self.wait_connected(job_id, min(timeout, self.reconnect_grace_s), incarnation)
        conn = self._find(job_id, incarnation)
        if conn is None:
            which = f" (launch {incarnation})" if incarnation else ""
            raise FailedPrecondition(f"job {job_id} has no running process{which} connected to the scheduler")
        self._refuse_told(job_id, conn.incarnation, cmd)
        if not cmd.command_id:
            cmd.command_id = _command_id()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        conn.pending[cmd.command_id] = fut
        conn.outbox.put_nowait(cmd)
        self._asked[cmd.command_id] = (job_id, command_word(cmd.kind), loop.time(), conn.step_s)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            conn.pending.pop(cmd.command_id, None)
            raise Unavailable(
                f"job {job_id} did not reach a mini-batch boundary within {timeout:.0f}s"
            ) from None
        finally:
            self._asked.pop(cmd.command_id, None)

    def _refuse_told(self, job_id: str, incarnation: str, cmd: runtime_pb2.RuntimeCommand) -> None:
        told = self.told_to_exit(job_id, incarnation)
        if told and cmd.kind != runtime_pb2.COMMAND_KIND_KILL:
            raise Unavailable(f"job {job_id}'s launch {incarnation} was told to exit ({told}): "
                              f"no {command_word(cmd.kind)} is sent to it")

    def resolve(self, conn: RuntimeConn, ack: runtime_pb2.CommandAck) -> None:
        _resolve(conn.pending, ack.command_id, ack)
