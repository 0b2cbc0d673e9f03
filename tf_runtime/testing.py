"""Test doubles for the shim: a real local Runtime server and a fake session world.

`LocalRuntimeServer` is a small, real Runtime gRPC server for tests, demos and
benchmarks. It listens on 127.0.0.1 (port 0 by default), records every
message the shims send, and lets the caller send commands to a job's current
stream. It ends a stream when the shim half-closes it, as the real scheduler
should. It is not the scheduler: no state, no policy.

`FakeWorld` puts the real wrapper chain and Controller in front of a fake session
(a global-step counter whose runs are named "train", "init", "eval", ...), for
fast tests of the boundary logic against scripted command schedules.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc

from .chain import RunInfo, build_chain
from .checkpoint import CheckpointInfo, check_towers, validate, write_atomically
from .commands import Ack
from .controller import Controller, Settings

_END = object()


class _Servicer(runtime_pb2_grpc.RuntimeServicer):
    def __init__(self, owner: LocalRuntimeServer) -> None:
        self._owner = owner

    def Connect(self, request_iterator: Iterator[runtime_pb2.RuntimeMessage],
                context: grpc.ServicerContext) -> Iterator[runtime_pb2.RuntimeCommand]:
        first = next(request_iterator, None)
        if first is None or not first.HasField("hello"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be hello")
            return
        job = first.hello.job_id
        out: queue.Queue[object] = queue.Queue()
        self._owner._opened(job, first, out)

        def pump() -> None:
            try:
                for msg in request_iterator:
                    self._owner._record(job, msg)
            except grpc.RpcError:
                pass
            finally:
                out.put(_END)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            item = out.get()
            if item is _END:
                return
            yield item  # type: ignore[misc]


class LocalRuntimeServer:
    """Real gRPC over a real socket; thread-safe accessors for what was received."""

    def __init__(self, port: int = 0) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        runtime_pb2_grpc.add_RuntimeServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        if self.port == 0:
            raise RuntimeError(f"could not bind 127.0.0.1:{port}")
        self._cond = threading.Condition()
        self.messages: list[tuple[str, runtime_pb2.RuntimeMessage]] = []
        self._streams: dict[str, queue.Queue[object]] = {}
        self._ids = itertools.count(1)
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, grace: float | None = 0) -> None:
        self._server.stop(grace).wait()

    # -- called by the servicer ---------------------------------------------------------
    def _opened(self, job: str, hello: runtime_pb2.RuntimeMessage, out: queue.Queue[object]) -> None:
        with self._cond:
            self._streams[job] = out
            self.messages.append((job, hello))
            self._cond.notify_all()

    def _record(self, job: str, msg: runtime_pb2.RuntimeMessage) -> None:
        with self._cond:
            self.messages.append((job, msg))
            self._cond.notify_all()

    # -- for tests ----------------------------------------------------------------------
    def send(self, job: str, kind: int, checkpoint_dir: str = "", reason: str = "") -> str:
        """Send a command to the job's latest stream; returns its command id."""
        command_id = f"c{next(self._ids)}"
        with self._cond:
            out = self._streams.get(job)
        if out is None:
            raise KeyError(f"job {job!r} has no open stream")
        out.put(runtime_pb2.RuntimeCommand(command_id=command_id, kind=kind,  # type: ignore[arg-type]
                                           checkpoint_dir=checkpoint_dir, reason=reason))
        return command_id

    def wait_for(self, predicate: Callable[[str, runtime_pb2.RuntimeMessage], bool],
                 timeout: float = 30.0) -> runtime_pb2.RuntimeMessage:
        """The first recorded message matching predicate(job, msg), waiting for it."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for job, msg in self.messages[seen:]:
                    if predicate(job, msg):
                        return msg
                seen = len(self.messages)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching message within {timeout} s "
                                       f"({len(self.messages)} received)")
                self._cond.wait(left)

    def wait_ack(self, command_id: str, timeout: float = 30.0) -> runtime_pb2.CommandAck:
        msg = self.wait_for(lambda _j, m: m.HasField("ack") and m.ack.command_id == command_id,
                            timeout)
        return msg.ack

    def wait_progress(self, job: str, min_steps: int, timeout: float = 60.0) -> runtime_pb2.ProgressReport:
        msg = self.wait_for(lambda j, m: j == job and m.HasField("progress")
                            and m.progress.steps >= min_steps, timeout)
        return msg.progress

    def of_kind(self, job: str, field: str) -> list[Any]:
        with self._cond:
            return [getattr(m, field) for j, m in self.messages
                    if j == job and m.WhichOneof("body") == field]


class Exited(Exception):
    """Raised by the fake exit function instead of leaving pytest."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


RUN_KINDS = {
    "train": RunInfo(is_training=True, reads_global_step=True, metric_slots=((0, "loss"),),
                     advances_step=True),
    "train_nogs": RunInfo(is_training=True, advances_step=True),
    # A training run that leaves the global step alone (a GAN's discriminator run).
    "train_d": RunInfo(is_training=True),
    "init": RunInfo(initializes=True),
    "eval": RunInfo(),
    "read_gs": RunInfo(reads_global_step=True),
    "own_restore": RunInfo(restores=True),  # the program's own Saver restore (sets step 100)
}


class FakeSession:
    """Counts a global step; `hooks[step]` run inside that training step (mid-step arrivals)."""

    def __init__(self) -> None:
        self.step = 0
        self.hooks: dict[int, Any] = {}
        self.block = threading.Event()
        self.in_block = threading.Event()

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        if fetches == "blocking_eval":  # a background thread's run that takes its time
            self.in_block.set()
            self.block.wait(10)
            return None
        if fetches == "own_restore":
            self.step = 100
        if fetches == "read_gs":
            return self.step
        if RUN_KINDS[fetches].advances_step:
            self.step += 1
            hook = self.hooks.get(self.step)
            if hook:
                hook()
            return [1.0 / self.step]
        if RUN_KINDS[fetches].is_training:
            return [0.5]
        return None


class FakeAdapter:
    """A SessionAdapter over FakeSession; save/restore write real checkpoint dirs."""

    def __init__(self, sess: FakeSession) -> None:
        self.sess = sess
        self.closed = False
        self.saves: list[str] = []
        self.rehearsals = 0
        self.prebuilt_saves = 0
        self.tower_count = 1  # tower copies of the variables "in the graph"

    def classify(self, fetches: Any) -> RunInfo:
        return RUN_KINDS.get(fetches, RunInfo())

    def metrics(self, info: RunInfo, results: Any) -> dict[str, float]:
        return {name: float(results[i]) for i, name in info.metric_slots}

    def has_global_step(self) -> bool:
        return True

    def trainable_names(self) -> frozenset[str]:
        return frozenset({"w:0"})

    def global_step(self) -> int:
        return self.sess.step

    def save(self, directory: str, job_id: str, start_step: int | None = None,
             started_at: float | None = None) -> CheckpointInfo:
        step = self.sess.step
        path, size = write_atomically(
            directory, lambda tmp: (tmp / "model.index").write_text(str(step)),
            {"job_id": job_id, "global_step": step, "replicas": self.tower_count,
             **({"start_step": start_step} if start_step is not None else {}),
             **({"started_at": started_at} if started_at is not None else {})})
        self.saves.append(str(path))
        return CheckpointInfo(str(path), step, self.tower_count, size, 0.001)

    def rehearse(self, step: Callable[[], Any]) -> dict[str, float]:
        before = self.sess.step
        try:
            step()
        finally:
            self.sess.step = before
        self.rehearsals += 1
        return {"warm_step_s": 0.001}

    def prebuild_save(self) -> float:
        self.prebuilt_saves += 1
        return 0.001

    def signature(self, fetches: Any, feed_dict: Any, options: Any) -> str | None:
        return fetches if isinstance(fetches, str) else None

    def signature_step(self, signature: str) -> Callable[[], Any] | None:
        if signature not in RUN_KINDS:
            return None
        return lambda: self.sess.run(signature)

    def towers(self) -> int:
        return self.tower_count

    def restore(self, directory: str, partial: bool = False) -> CheckpointInfo:
        manifest = validate(directory)
        check_towers(directory, manifest, self.tower_count)
        self.sess.step = int((Path(directory) / "model.index").read_text())
        assert self.sess.step == manifest["global_step"]
        return CheckpointInfo(directory, self.sess.step, self.tower_count, 0, 0.001)


class FakeChannel:
    def __init__(self) -> None:
        self.acks: list[Ack] = []
        self.migratability: list[tuple[bool, str]] = []
        self.signatures: list[str] = []
        self.towers: list[tuple[int, int, int, str]] = []
        self.closed = False
        self.cond = threading.Condition()

    def send_ack(self, ack: Ack) -> None:
        with self.cond:
            self.acks.append(ack)
            self.cond.notify_all()

    def send_migratability(self, migratable: bool, reason: str) -> None:
        self.migratability.append((migratable, reason))

    def send_train_signature(self, signature: str) -> None:
        self.signatures.append(signature)

    def send_towers(self, towers: int, checkpoint_towers: int, devices: int, reason: str) -> None:
        self.towers.append((towers, checkpoint_towers, devices, reason))

    def close(self, timeout_s: float) -> None:
        self.closed = True

    def wait_ack(self, command_id: str, timeout: float = 5.0) -> Ack:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for a in self.acks:
                    if a.command_id == command_id:
                        return a
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no ack for {command_id}")
                self.cond.wait(left)


class FakeWorld:
    """One controller + one fake session behind the real wrapper chain."""

    def __init__(self, settings: Settings | None = None, status: Any = None) -> None:
        self.sess = FakeSession()
        self.adapter = FakeAdapter(self.sess)
        self.channel = FakeChannel()

        def exit_fn(code: int) -> None:
            raise Exited(code)

        self.controller = Controller(settings or Settings(job_id="fake"), channel=self.channel,
                                     status=status, exit_fn=exit_fn)
        self.session = build_chain(
            lambda f, fd, o, m: self.sess.run(f, fd, o, m), self.adapter, self.controller,
            self.controller.gate)

    def run(self, fetches: str) -> Any:
        return self.session.run(fetches)
