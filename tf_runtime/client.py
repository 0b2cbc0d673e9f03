"""The control-stream client: gandiva.v1.Runtime/Connect, one stream per process.

A daemon thread keeps the bidirectional stream open: RuntimeHello first, then
progress in batches (a snapshot of the ProgressMeter at most every
`flush_interval_s`, and only when it changed), MigratabilityReport and CommandAcks
as they come. Commands received are converted and handed to the controller's
queue. When the stream breaks (the scheduler restarted) it reconnects with
exponential back-off, says hello again and re-sends the migratability verdict and
the first training run's signature (TrainSignature, for pre-warming a destination);
progress lives in the meter, so nothing is lost.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from . import own_modules
from .commands import Ack, Command, Kind
from .progress import ProgressMeter

if TYPE_CHECKING:
    from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc
    from scheduler import transport
else:  # Gandiva's own, whatever the program names its modules (tf_runtime/own_modules.py)
    runtime_pb2, runtime_pb2_grpc, transport = own_modules.load()

log = logging.getLogger(__name__)

_KINDS = {
    runtime_pb2.COMMAND_KIND_SUSPEND: Kind.SUSPEND,
    runtime_pb2.COMMAND_KIND_RESUME: Kind.RESUME,
    runtime_pb2.COMMAND_KIND_CHECKPOINT: Kind.CHECKPOINT,
    runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION: Kind.STOP_FOR_MIGRATION,
    runtime_pb2.COMMAND_KIND_KILL: Kind.KILL,
}
_CLOSE = object()


@dataclass(frozen=True)
class Identity:
    """Who this process is (RuntimeHello)."""

    job_id: str
    incarnation: str
    pid: int
    server: str
    restored_step: int = 0


def to_command(msg: runtime_pb2.RuntimeCommand) -> Command:
    """Wire command -> Command; ValueError naming what is wrong."""
    kind = _KINDS.get(msg.kind)
    if kind is None:
        raise ValueError(f"command {msg.command_id!r}: unknown kind {msg.kind}")
    return Command(msg.command_id, kind, msg.checkpoint_dir, msg.reason)


def ack_message(ack: Ack) -> runtime_pb2.RuntimeMessage:
    return runtime_pb2.RuntimeMessage(ack=runtime_pb2.CommandAck(
        command_id=ack.command_id, ok=ack.ok, message=ack.message,
        checkpoint_path=ack.checkpoint_path, step=ack.step, durations_s=ack.durations_s, step_at=ack.step_at))


class StreamClient:
    """Keeps the Runtime stream to the scheduler alive for the whole process."""

    def __init__(self, target: str, identity: Identity, meter: ProgressMeter,
                 on_command: Callable[[Command], None], *, flush_interval_s: float = 0.5,
                 max_backoff_s: float = 2.0, standing: Callable[[], str] | None = None,
                 claim: Callable[[], None] | None = None) -> None:
        self.target = target
        self.identity = identity
        self._meter = meter
        self._on_command = on_command
        self._flush = flush_interval_s
        self._max_backoff = max_backoff_s
        self._outbox: queue.Queue[object] = queue.Queue()
        self._closing = threading.Event()
        self._migratability: runtime_pb2.MigratabilityReport | None = None
        self._signature: runtime_pb2.RuntimeMessage | None = None
        self._towers: runtime_pb2.RuntimeMessage | None = None
        self._thread = threading.Thread(target=self._loop, name="gandiva-stream", daemon=True)
        self._channel: grpc.Channel | None = None
        self._security = transport.ClientSecurity.from_env()
        self.connections = 0  # streams opened so far (reconnects + 1)
        # Which process of the launch holds the job's stream (tf_runtime.launch.
        # stream_standing: "hold", "retake" or "leave"), asked before each connect and at
        # each flush; `claim` is called before each connect and once this one has left.
        self._standing = standing
        self._claim = claim
        self._call: Any = None
        self.left = False  # this process left the job's stream to the launch's trainer

    def start(self) -> StreamClient:
        self._thread.start()
        return self

    # -- Channel protocol (used by the controller) -----------------------------------------
    def send_ack(self, ack: Ack) -> None:
        self._outbox.put(ack_message(ack))

    def send_migratability(self, migratable: bool, reason: str) -> None:
        report = runtime_pb2.MigratabilityReport(migratable=migratable, reason=reason)
        self._migratability = report
        self._outbox.put(runtime_pb2.RuntimeMessage(migratability=report))

    def send_train_signature(self, signature: str) -> None:
        msg = runtime_pb2.RuntimeMessage(train_signature=runtime_pb2.TrainSignature(json=signature))
        self._signature = msg
        self._outbox.put(msg)

    def send_towers(self, towers: int, checkpoint_towers: int, devices: int, reason: str) -> None:
        msg = runtime_pb2.RuntimeMessage(towers=runtime_pb2.TowerReport(
            towers=towers, checkpoint_towers=checkpoint_towers, devices=devices, reason=reason))
        if not checkpoint_towers:
            self._towers = msg  # the graph's count: again after a reconnect
        self._outbox.put(msg)

    def close(self, timeout_s: float) -> None:
        """Send what is queued plus a last progress report, half-close, wait for the end."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._outbox.put(_CLOSE)
        self._thread.join(timeout_s)
        if self._channel is not None:
            self._channel.close()

    # -- the stream thread ---------------------------------------------------------------------
    def _stand(self) -> str:
        if self._standing is None:
            return "hold"
        try:
            return self._standing()
        except Exception:  # a mark that cannot be read changes nothing
            log.debug("the launch's stream standing could not be read", exc_info=True)
            return "hold"

    def _loop(self) -> None:
        backoff = 0.1
        while not self._closing.is_set():
            if self._stand() == "leave":
                # Another process of the launch trains and holds the job's stream: this
                # one connects no more (like a secondary that never trains).
                log.info("this process does not train, and its launch's trainer holds the "
                         "job's stream: this one closed its own for good")
                self.left = True
                return
            if self._claim is not None:
                self._claim()
            # The token and CA the helper handed this process (GANDIVA_TOKEN, GANDIVA_TLS_CA).
            self._channel = transport.channel(self.target, self._security)
            stub = runtime_pb2_grpc.RuntimeStub(self._channel)
            alive = threading.Event()
            alive.set()
            handover = [""]  # "retake" or "leave" when this stream is handed over
            try:
                self._call = None
                call = self._call = stub.Connect(self._requests(alive, handover))
                self.connections += 1
                for msg in call:
                    backoff = 0.1  # the server answers: reset the back-off
                    self._command(msg)
                if self._closing.is_set():
                    return
                if not handover[0]:
                    log.warning("scheduler ended the runtime stream; reconnecting")
            except grpc.RpcError as exc:
                if self._closing.is_set():
                    return
                if not handover[0]:
                    log.warning("runtime stream to %s broke (%s); retrying in %.1f s",
                                self.target, exc.code() if hasattr(exc, "code") else exc, backoff)
            finally:
                alive.clear()
                self._channel.close()
            if handover[0] == "leave":
                # Claimed, so that the trainer connects again now that this stream is
                # gone: its hello may have reached the scheduler after the trainer's (the
                # job's stream until now), and the job would be left with none.
                self.left = True
                if self._claim is not None:
                    self._claim()
                return
            if handover[0]:
                continue  # retaken: at once
            if self._closing.wait(backoff):
                return
            backoff = min(backoff * 2, self._max_backoff)

    def _command(self, msg: runtime_pb2.RuntimeCommand) -> None:
        try:
            cmd = to_command(msg)
        except ValueError as exc:
            self.send_ack(Ack(msg.command_id, False, str(exc)))
            return
        log.info("command %s: %s", cmd.id, cmd.kind.name)
        self._on_command(cmd)

    def _requests(self, alive: threading.Event, handover: list[str]) -> Iterator[runtime_pb2.RuntimeMessage]:
        ident = self.identity
        yield runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(
            job_id=ident.job_id, incarnation=ident.incarnation, pid=ident.pid,
            server=ident.server, restored_step=ident.restored_step))
        if self._migratability is not None:
            yield runtime_pb2.RuntimeMessage(migratability=self._migratability)
        if self._signature is not None:  # again after a reconnect (a duplicate is harmless)
            yield self._signature
        if self._towers is not None:
            yield self._towers
        sent_version = -1
        next_flush = time.monotonic()
        next_stand = next_flush + self._flush  # (self._call is this stream's by then)
        while alive.is_set():
            now = time.monotonic()
            if now >= next_stand:
                next_stand = now + self._flush
                standing = self._stand()
                if standing != "hold" and self._call is not None:
                    # "retake": this process, the launch's trainer, connects again (a
                    # process of the launch that does not train closed its stream, which
                    # may have replaced this one). "leave": that trainer trains; this
                    # process does not. Cancelled, not closed: the scheduler would take a
                    # closed stream for the program's end.
                    log.info("the job's stream: %s", "taken back by this process, the launch's "
                             "trainer" if standing == "retake" else "left to the launch's trainer")
                    handover[0] = standing
                    self._call.cancel()
                    return
            if now >= next_flush:
                next_flush = now + self._flush
                if self._meter.version != sent_version:
                    sent_version = self._meter.version
                    yield self._progress()
            try:
                item = self._outbox.get(timeout=max(0.0, min(next_flush, next_stand) - time.monotonic()))
            except queue.Empty:
                continue
            if item is _CLOSE:
                yield self._progress()
                return  # half-close: the server ends its side, and the call finishes
            yield item  # type: ignore[misc]

    def _progress(self) -> runtime_pb2.RuntimeMessage:
        snap = self._meter.snapshot()
        return runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
            steps=snap.steps, rate=snap.rate, last_step_s=snap.last_step_s, at=snap.at,
            metrics=snap.metrics, other_run=snap.other_run, total_steps=snap.total_steps, step_at=snap.step_at))
