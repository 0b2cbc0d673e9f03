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

import grpc

from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc
from scheduler import transport

from .commands import Ack, Command, Kind
from .progress import ProgressMeter

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
        checkpoint_path=ack.checkpoint_path, step=ack.step, durations_s=ack.durations_s))


class StreamClient:
    """Keeps the Runtime stream to the scheduler alive for the whole process."""

    def __init__(self, target: str, identity: Identity, meter: ProgressMeter,
                 on_command: Callable[[Command], None], *, flush_interval_s: float = 0.5,
                 max_backoff_s: float = 2.0) -> None:
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
    def _loop(self) -> None:
        backoff = 0.1
        while not self._closing.is_set():
            # The token and CA the helper handed this process (GANDIVA_TOKEN, GANDIVA_TLS_CA).
            self._channel = transport.channel(self.target, self._security)
            stub = runtime_pb2_grpc.RuntimeStub(self._channel)
            alive = threading.Event()
            alive.set()
            try:
                call = stub.Connect(self._requests(alive))
                self.connections += 1
                for msg in call:
                    backoff = 0.1  # the server answers: reset the back-off
                    self._command(msg)
                if self._closing.is_set():
                    return
                log.warning("scheduler ended the runtime stream; reconnecting")
            except grpc.RpcError as exc:
                if self._closing.is_set():
                    return
                log.warning("runtime stream to %s broke (%s); retrying in %.1f s",
                            self.target, exc.code() if hasattr(exc, "code") else exc, backoff)
            finally:
                alive.clear()
                self._channel.close()
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

    def _requests(self, alive: threading.Event) -> Iterator[runtime_pb2.RuntimeMessage]:
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
        while alive.is_set():
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + self._flush
                if self._meter.version != sent_version:
                    sent_version = self._meter.version
                    yield self._progress()
            try:
                item = self._outbox.get(timeout=max(0.0, next_flush - time.monotonic()))
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
            metrics=snap.metrics, other_run=snap.other_run, total_steps=snap.total_steps))
