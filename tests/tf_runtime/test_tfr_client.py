"""The control-stream client against a real gRPC server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from typing import Any

from protos.gandiva.v1 import runtime_pb2 as pb
from tf_runtime.client import Identity, StreamClient
from tf_runtime.commands import Ack, Command, Kind
from tf_runtime.progress import ProgressMeter
from tf_runtime.testing import LocalRuntimeServer


def make_client(server: Any, meter: ProgressMeter, received: list[Command]) -> StreamClient:
    ident = Identity("j", "inc1", 4242, "srv-a", restored_step=17)
    return StreamClient(server.address, ident, meter, received.append,
                        flush_interval_s=0.2, max_backoff_s=0.3).start()


def test_hello_first_then_batched_progress(runtime_server: LocalRuntimeServer) -> None:
    meter = ProgressMeter()
    client = make_client(runtime_server, meter, [])
    hello = runtime_server.wait_for(lambda j, m: m.HasField("hello")).hello
    assert (hello.job_id, hello.incarnation, hello.pid, hello.server, hello.restored_step) == (
        "j", "inc1", 4242, "srv-a", 17)
    t0 = time.perf_counter()
    for i in range(2000):  # a fast training loop: many steps per flush
        meter.step(0.0001, time.perf_counter())
        if i % 200 == 0:
            time.sleep(0.05)
    meter.add_metrics({"loss": 0.5})
    runtime_server.wait_progress("j", 2000, timeout=10)
    elapsed = time.perf_counter() - t0
    reports = runtime_server.of_kind("j", "progress")
    assert len(reports) <= elapsed / 0.2 + 3  # batched, never one message per step
    assert reports[-1].rate > 0
    assert reports[-1].step_at == meter.went_on_at(2000) > 0  # when its step 2000 ended (its rate alone)
    client.close(5)
    assert runtime_server.of_kind("j", "progress")[-1].metrics["loss"] == 0.5


def test_commands_are_delivered_and_bad_ones_refused(runtime_server: LocalRuntimeServer) -> None:
    received: list[Command] = []
    client = make_client(runtime_server, ProgressMeter(), received)
    runtime_server.wait_for(lambda j, m: m.HasField("hello"))
    runtime_server.send("j", pb.COMMAND_KIND_SUSPEND, reason="time slice over")
    bad = runtime_server.send("j", pb.COMMAND_KIND_CHECKPOINT)  # no directory
    unknown = runtime_server.send("j", pb.COMMAND_KIND_UNSPECIFIED)
    assert not runtime_server.wait_ack(bad).ok
    assert "checkpoint_dir" in runtime_server.wait_ack(bad).message
    assert "unknown kind" in runtime_server.wait_ack(unknown).message
    assert [(c.kind, c.reason) for c in received] == [(Kind.SUSPEND, "time slice over")]
    client.send_ack(Ack(received[0].id, True, "suspended", step=3, durations_s={"release": 0.01}, step_at=1e9))
    ack = runtime_server.wait_ack(received[0].id)
    assert ack.ok and ack.step == 3 and ack.durations_s["release"] == 0.01 and ack.step_at == 1e9
    client.close(5)


def test_reconnects_when_the_scheduler_restarts() -> None:
    server = LocalRuntimeServer()
    port = server.port
    meter = ProgressMeter()
    received: list[Command] = []
    client = make_client(server, meter, received)
    server.wait_for(lambda j, m: m.HasField("hello"))
    client.send_migratability(False, "counts from 0")
    for _ in range(5):
        meter.step(0.01, time.perf_counter())
    server.wait_progress("j", 5)
    server.stop(0)

    for _ in range(3):  # training goes on while the scheduler is away
        meter.step(0.01, time.perf_counter())
    restarted = LocalRuntimeServer(port=port)
    try:
        hello = restarted.wait_for(lambda j, m: m.HasField("hello"), timeout=15).hello
        assert hello.job_id == "j"
        report = restarted.wait_for(lambda j, m: m.HasField("migratability"), timeout=5)
        assert report.migratability.reason == "counts from 0"
        assert restarted.wait_progress("j", 8, timeout=5).steps == 8  # nothing lost
        restarted.send("j", pb.COMMAND_KIND_RESUME)
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [c.kind for c in received] == [Kind.RESUME]
        assert client.connections >= 2
        client.close(5)
    finally:
        restarted.stop(0)


def test_close_half_closes_and_the_server_ends_the_stream(runtime_server: LocalRuntimeServer) -> None:
    meter = ProgressMeter()
    client = make_client(runtime_server, meter, [])
    runtime_server.wait_for(lambda j, m: m.HasField("hello"))
    meter.step(0.01, time.perf_counter())
    done = threading.Event()
    threading.Thread(target=lambda: (client.close(5), done.set())).start()
    assert done.wait(5)  # did not hang on the open stream
    assert runtime_server.of_kind("j", "progress")[-1].steps == 1
