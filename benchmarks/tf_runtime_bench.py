"""Benchmarks of the tf_runtime shim, each side by side with and without it.

    python benchmarks/tf_runtime_bench.py overhead    # per-run overhead, empty and ~5 ms steps
    python benchmarks/tf_runtime_bench.py suspend     # suspend -> running again round trip
    python benchmarks/tf_runtime_bench.py checkpoint  # ResNet-50-sized save/restore, 1..8 replicas
    python benchmarks/tf_runtime_bench.py all

Everything runs in one process on CPU TensorFlow; the shim runs with its real
control stream to a local gRPC Runtime server. Figures on a shared machine are
noisy: the overhead comparison alternates plain and shimmed runs on one session, and
everything reports medians or percentiles.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from protos.gandiva.v1 import runtime_pb2 as pb
from tf_runtime import shim
from tf_runtime.client import Identity, StreamClient
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import Controller, Settings
from tf_runtime.testing import LocalRuntimeServer


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


class Shimmed:
    """The shim installed with a real stream to a local Runtime server."""

    def __enter__(self) -> Shimmed:  # noqa: PYI034 - a plain context manager, not subclassed
        self.server = LocalRuntimeServer()
        self.controller = Controller(Settings(job_id="bench"))
        self.client = StreamClient(self.server.address, Identity("bench", "1", os.getpid(), "local"),
                                   self.controller.meter, self.controller.enqueue).start()
        self.controller.channel = self.client
        shim.install(self.controller)
        return self

    def __exit__(self, *exc: object) -> None:
        shim.uninstall()
        self.client.close(2.0)
        self.server.stop(0)


def step_graph(work: int) -> tuple[Any, Any, Any]:
    """A training step: `work` x `work` matmuls feeding an SGD update (0: only the step counter)."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        if work == 0:
            train = gs.assign_add(1)
        else:
            w = tf.compat.v1.get_variable("w", [work, work])
            x = tf.random.stateless_normal([work, work], seed=[1, 2])
            loss = tf.reduce_mean(tf.matmul(tf.matmul(x, w), w))
            train = tf.compat.v1.train.GradientDescentOptimizer(1e-6).minimize(loss, global_step=gs)
        init = tf.compat.v1.global_variables_initializer()
    return g, init, train


def paired_runs(g: Any, init: Any, train: Any, n: int) -> tuple[list[float], list[float]]:
    """Alternate a plain run (the original Session.run) and a run through the shim on one
    session, so that both sides see the same machine load."""
    plain_run = shim._ORIG["run"]
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=g, config=cfg) as sess:
        sess.run(init)
        for _ in range(20):
            sess.run(train)
        plain, shimmed = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            plain_run(sess, train, None, None, None)
            t1 = time.perf_counter()
            sess.run(train)
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            shimmed.append(t2 - t1)
    return plain, shimmed


def overhead(args: argparse.Namespace) -> None:
    print("== overhead per Session.run(): plain and shimmed runs alternating on one session ==")
    print(f"{'step':<12}{'without':>14}{'with shim':>14}{'overhead':>14}{'relative':>10}")
    for label, work, n in (("empty", 0, args.runs), ("~5 ms", args.work, max(100, args.runs // 10))):
        g, init, train = step_graph(work)
        with Shimmed():
            plain, shimmed = paired_runs(g, init, train, n)
        a, b = statistics.median(plain), statistics.median(shimmed)
        print(f"{label:<12}{a * 1e6:>12.1f}us{b * 1e6:>12.1f}us{(b - a) * 1e6:>12.1f}us"
              f"{(b - a) / a * 100:>9.2f}%")
    print("goal: <= 50 us on an empty step, <= 2% on a 5 ms step")


class TrainingThread:
    """A training loop in a thread, counting boundaries."""

    def __init__(self, sess: Any, train: Any) -> None:
        self.sess, self.train = sess, train
        self.stop = threading.Event()
        self.boundary = threading.Condition()
        self.count = 0
        self.thread = threading.Thread(target=self._loop)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sess.run(self.train)
            with self.boundary:
                self.count += 1
                self.boundary.notify_all()

    def wait_next(self, seen: int) -> None:
        with self.boundary:
            while self.count <= seen:
                self.boundary.wait()

    def join(self) -> None:
        self.stop.set()
        self.thread.join()


def sender(s: Shimmed, via: str) -> Callable[[Kind], None]:
    """Send a command and wait until it took effect (its ack, or the suspended state)."""
    kinds = {Kind.SUSPEND: pb.COMMAND_KIND_SUSPEND, Kind.RESUME: pb.COMMAND_KIND_RESUME}

    def over_grpc(kind: Kind) -> None:
        s.server.wait_ack(s.server.send("bench", kinds[kind]))

    def in_process(kind: Kind) -> None:
        s.controller.enqueue(Command(f"{kind.name}-{time.monotonic()}", kind))
        if kind is Kind.SUSPEND:
            while not s.controller.suspended:
                time.sleep(0.0002)

    return over_grpc if via == "gRPC stream" else in_process


def suspend(args: argparse.Namespace) -> None:
    print("== suspend -> running again, in process on CPU ==")
    g, init, train = step_graph(64)
    for via in ("in-process queue", "gRPC stream"):
        with Shimmed() as s:
            cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
            sess = tf.compat.v1.Session(graph=g, config=cfg)
            sess.run(init)
            trainer = TrainingThread(sess, train)
            s.server.wait_for(lambda j, m: m.HasField("hello"))
            send = sender(s, via)
            rounds = []
            for _ in range(args.suspends):
                t0 = time.perf_counter()
                send(Kind.SUSPEND)
                seen = trainer.count
                send(Kind.RESUME)
                trainer.wait_next(seen)
                rounds.append(time.perf_counter() - t0)
                time.sleep(0.002)
            trainer.join()
            sess.close()
        print(f"{via:<18} n={len(rounds)}  p50 {pct(rounds, 50) * 1e3:7.2f} ms   "
              f"p99 {pct(rounds, 99) * 1e3:7.2f} ms   max {max(rounds) * 1e3:7.2f} ms")
    print("goal: p50 <= 20 ms, p99 <= 100 ms (includes waiting for the next boundary)")


def resnet_vars(replicas: int) -> tuple[Any, Any]:
    """A graph with `replicas` towers of ResNet-50's variables (forward graph only)."""
    from tf_runtime.examples import resnet50
    from tf_runtime.examples.common import same_start_getter

    g = tf.Graph()
    targs = argparse.Namespace(seed=0, batch=1, image_size=32)
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        same_start = same_start_getter()  # equal copies, as replicated training keeps them
        for i in range(replicas):
            with tf.device(f"/cpu:{i}"), tf.compat.v1.variable_scope(f"tower_{i}", custom_getter=same_start):
                resnet50.model(targs, gs, i)
        init = tf.compat.v1.global_variables_initializer()
    return g, init


def checkpoint(args: argparse.Namespace) -> None:
    print("== ResNet-50-sized checkpoint into /dev/shm (median of rounds) ==")
    print(f"{'replicas':>8}{'params/replica':>16}{'shim save':>11}{'shim restore':>14}"
          f"{'shim MB':>9}{'plain Saver save':>18}{'plain restore':>15}{'plain MB':>10}")
    root = tempfile.mkdtemp(prefix="tfr-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        for r in args.replicas:
            with Shimmed():
                g, init = resnet_vars(r)
                with g.as_default():
                    plain_saver = tf.compat.v1.train.Saver(sharded=False)  # every replica's copy
                cfg = tf.compat.v1.ConfigProto(device_count={"CPU": r})
                with tf.compat.v1.Session(graph=g, config=cfg) as sess:
                    sess.run(init)
                    adapter = sess._gandiva_chain.adapter
                    with g.as_default():
                        per = sum(int(np.prod(v.shape.as_list())) for v in
                                  tf.compat.v1.global_variables() if v.name.startswith("tower_0/"))
                    saves, restores, psaves, prestores = [], [], [], []
                    size = psize = 0
                    for k in range(args.ckpt_rounds):
                        info = adapter.save(os.path.join(root, f"ck{r}"), "bench")
                        saves.append(info.seconds)
                        size = info.bytes
                        restores.append(adapter.restore(os.path.join(root, f"ck{r}")).seconds)
                        prefix = os.path.join(root, f"plain{r}-{k}", "model")
                        t0 = time.perf_counter()
                        plain_saver.save(sess, prefix, write_meta_graph=False, write_state=False)
                        psaves.append(time.perf_counter() - t0)
                        t0 = time.perf_counter()
                        plain_saver.restore(sess, prefix)
                        prestores.append(time.perf_counter() - t0)
                        psize = sum(os.path.getsize(os.path.join(os.path.dirname(prefix), f))
                                    for f in os.listdir(os.path.dirname(prefix)))
                        shutil.rmtree(os.path.dirname(prefix))
            print(f"{r:>8}{per / 1e6:>15.1f}M{statistics.median(saves):>10.3f}s"
                  f"{statistics.median(restores):>13.3f}s{size / 2**20:>9.0f}"
                  f"{statistics.median(psaves):>17.3f}s{statistics.median(prestores):>14.3f}s"
                  f"{psize / 2**20:>10.0f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("goal: save and restore <= 0.3 s each, flat from 1 to 8 replicas")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["overhead", "suspend", "checkpoint", "all"])
    p.add_argument("--runs", type=int, default=2000, help="empty-step runs per round")
    p.add_argument("--work", type=int, default=400, help="matrix size of the ~5 ms step")
    p.add_argument("--suspends", type=int, default=200)
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--ckpt-rounds", type=int, default=3)
    args = p.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    for name, fn in (("overhead", overhead), ("suspend", suspend), ("checkpoint", checkpoint)):
        if args.what in (name, "all"):
            fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
