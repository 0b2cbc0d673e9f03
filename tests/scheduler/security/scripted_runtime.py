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
    on; "ack" answers it and trains on; "huge" reports 10^6/s while packed. ``times``: it
    sends the time its reported step began (``step_at``), as the real runtime does; False:
    an older shim's reports, without."""

    def __init__(self, channel: grpc.Channel, job_id: str, incarnation: str, lie: str = "",
                 gpu: dict | None = None, alone: float = 20.0, packed: float = 20.0, times: bool = True) -> None:
        self.out: queue.Queue = queue.Queue()
        self.out.put(runtime_pb2.RuntimeMessage(hello=runtime_pb2.RuntimeHello(
            job_id=job_id, incarnation=incarnation, pid=1)))
        self.stream = runtime_pb2_grpc.RuntimeStub(channel).Connect(iter(self.out.get, None))
        self.lie, self.alone, self.packed = lie, alone, packed
        self.gpu = gpu if gpu is not None else {}
        self.gpu[job_id] = self
        self.running, self.steps, self.times = True, 0.0, times
        # (its reported count, the unix time its training went on from it): its steps are a
        # continuous count, so the time is when the count was reached in its running time.
        self.went_on = (1, time.time())
        self.resumed_at = 0.0  # (monotonic) its training time restarts here, not at the tick before
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
                elif cmd.kind == runtime_pb2.COMMAND_KIND_RESUME and not self.running:
                    self.resumed_at, self.running = time.monotonic(), True
                    self.went_on = (int(self.steps) + 1, time.time() - (self.steps % 1) / self._rate())
                count, at = self.went_on
                self.out.put(runtime_pb2.RuntimeMessage(ack=runtime_pb2.CommandAck(
                    command_id=cmd.command_id, ok=True, step=int(self.steps) + 1,  # as its reports count
                    step_at=at if self.times and count == int(self.steps) + 1 else 0.0)))
        except grpc.RpcError:
            pass  # the stream ends with the test

    def _train(self) -> None:
        # Its steps follow its rate over the time that passed (a loaded machine's ticks come
        # late): the scheduler measures a job's rate alone from its steps (scheduler/alone.py).
        last = time.monotonic()
        while not self.closed.wait(TICK_S):
            now = time.monotonic()
            passed, last = now - max(last, self.resumed_at), now
            if self.running:
                both = sum(r.running for r in self.gpu.values()) > 1
                rate = self._rate()
                self.steps += rate * passed
                count = int(self.steps) + 1
                if count != self.went_on[0]:
                    self.went_on = (count, time.time() - (self.steps % 1) / rate)
                said = 1e6 if self.lie == "huge" and both else rate
                self.out.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                    steps=count, rate=said, last_step_s=1 / rate, step_at=self.went_on[1] if self.times else 0.0)))

    def _rate(self) -> float:
        return self.packed if sum(r.running for r in self.gpu.values()) > 1 else self.alone

    def close(self) -> None:
        self.closed.set()
        self.out.put(None)
        self.stream.cancel()
