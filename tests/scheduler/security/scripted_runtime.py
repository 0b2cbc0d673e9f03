"""A job's runtime as a test scripts it, on a real Runtime stream: a job that reports
its progress from inside the user's own process, and so can disobey or lie. Shared by
the tests of what such a job can and cannot do to another user's job on its GPU."""

from __future__ import annotations

import queue
import threading
import time

import grpc

from protos.gandiva.v1 import runtime_pb2, runtime_pb2_grpc

TICK_S = 0.05


class ScriptedRuntime:
    """Reports its progress every TICK_S while it runs. Its rate: ``alone`` mini-batches/s
    when it is the only one of ``gpu`` (a dict the runtimes of one GPU share) running,
    ``packed`` when another runs too. ``lie``: "deaf" never answers a suspend and trains
    on; "ack" answers it and trains on; "huge" reports 10^6/s while packed."""

    def __init__(self, channel: grpc.Channel, job_id: str, incarnation: str, lie: str = "",
                 gpu: dict | None = None, alone: float = 20.0, packed: float = 20.0) -> None:
        self.out: queue.Queue = queue.Queue()
        self.out.put(runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(
            job_id=job_id, incarnation=incarnation, pid=1)))
        self.stream = runtime_pb2_grpc.RuntimeStub(channel).Connect(iter(self.out.get, None))
        self.lie, self.alone, self.packed = lie, alone, packed
        self.gpu = gpu if gpu is not None else {}
        self.gpu[job_id] = self
        self.running, self.steps = True, 0.0
        self.closed = threading.Event()
        threading.Thread(target=self._obey, daemon=True).start()
        threading.Thread(target=self._train, daemon=True).start()

    def _obey(self) -> None:
        try:
            for cmd in self.stream:
                if cmd.kind == runtime_pb2.COMMAND_KIND_SUSPEND:
                    if self.lie == "deaf":
                        continue
                    self.running = self.lie == "ack"
                elif cmd.kind == runtime_pb2.COMMAND_KIND_RESUME:
                    self.running = True
                self.out.put(runtime_pb2.RuntimeMessage(ack=runtime_pb2.CommandAck(
                    command_id=cmd.command_id, ok=True, step=int(self.steps) + 1)))  # as its reports count
        except grpc.RpcError:
            pass  # the stream ends with the test

    def _train(self) -> None:
        # Its steps follow its rate over the time that passed (a loaded machine's ticks come
        # late): the scheduler measures a job's rate alone from its steps (scheduler/alone.py).
        last = time.monotonic()
        while not self.closed.wait(TICK_S):
            now = time.monotonic()
            passed, last = now - last, now
            if self.running:
                both = sum(r.running for r in self.gpu.values()) > 1
                rate = self.packed if both else self.alone
                self.steps += rate * passed
                said = 1e6 if self.lie == "huge" and both else rate
                self.out.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                    steps=int(self.steps) + 1, rate=said, last_step_s=1 / rate)))

    def close(self) -> None:
        self.closed.set()
        self.out.put(None)
        self.stream.cancel()
