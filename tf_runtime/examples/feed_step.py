"""A plain TF1 program whose every mini-batch is fed from the global step it read into Python.

This is the pattern of many real scripts with synthetic or indexed data: after
initialisation the program reads the global step (`step = sess.run(gs)`), builds
the feed for that step in NumPy, and takes the next step from the training run's
result. A restarted or migrated copy is correct only if that first read already
sees the restored step.

    python -m tf_runtime.run feed_step.py --loop session --optimizer adam --replicas 2 --steps 50
    python -m tf_runtime.run feed_step.py --loop mts --optimizer momentum --steps 50

`--loop session`: a `tf.compat.v1.Session` loop (`while step < steps`).
`--loop mts`: a `MonitoredTrainingSession` with `StopAtStepHook(last_step=steps)`.
`--optimizer momentum|adam`: slot variables in the checkpoint. `--replicas N`:
N towers, each fed its own slice, gradients averaged and applied to every replica,
on /cpu:0..N-1 (one device per tower), or with `--devices D` on D devices, several
towers to a device (tf_runtime.towers: grow and shrink that keep the result);
`--devices auto` counts the devices the helper gave the launch (CUDA_VISIBLE_DEVICES).
`--replicas auto`: one tower per device the launch holds (the common pattern whose
result a grow or shrink changes: its shim refuses such a restore, docs/tf_runtime.md).
`--dump FILE.npz` writes every global variable at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np
import tensorflow as tf

from tf_runtime.examples.common import sleep_after_step, step_sleep_flags
from tf_runtime.towers import tower_devices, visible_device_count

DIM, HIDDEN, CLASSES = 12, 16, 4


def _count(p: argparse.ArgumentParser, flag: str, value: str, what: str, default: int) -> int:
    """A positive count, or 'auto': as many as CUDA_VISIBLE_DEVICES lists (``default`` if unset)."""
    if value == "auto":
        return visible_device_count(default=default)
    try:
        n = int(value)
    except ValueError:
        p.error(f"{flag} {value!r}: {what}, or auto")
    if n < 1:
        p.error(f"{flag} must be >= 1")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop", choices=("session", "mts"), default="session")
    p.add_argument("--optimizer", choices=("momentum", "adam"), default="momentum")
    p.add_argument("--replicas", default="1",
                   help="towers (logical: fixed for the job's life); 'auto': one per device "
                   "CUDA_VISIBLE_DEVICES lists (a grow or shrink then changes the result)")
    p.add_argument("--devices", default=None,
                   help="devices the towers run on (default: one per tower); 'auto': as many as "
                   "CUDA_VISIBLE_DEVICES lists")
    p.add_argument("--steps", type=int, default=50, help="train until the global step reaches this")
    p.add_argument("--batch", type=int, default=8, help="per tower")
    p.add_argument("--seed", type=int, default=0)
    step_sleep_flags(p, "sleep after each step (s)")
    p.add_argument("--dump", default=None, help="write all global variables to this .npz at the end")
    args = p.parse_args(argv)
    if args.replicas == "auto" and args.devices is not None:
        p.error("--replicas auto builds one tower per device: leave --devices out")
    args.replicas = _count(p, "--replicas", args.replicas, "a number of towers", 1)
    if args.steps < 0 or args.batch < 1:
        p.error("--batch must be >= 1, --steps >= 0")
    args.devices = (args.replicas if args.devices is None
                    else _count(p, "--devices", args.devices, "a number of devices", args.replicas))
    args.devices = min(args.devices, args.replicas)  # more devices than towers: the rest idle
    return args


def feed_for(args: argparse.Namespace, step: int, xs: list[Any], ys: list[Any]) -> dict[Any, Any]:
    """The mini-batch of global step `step`: a pure function of the seed, the tower and step."""
    feed = {}
    for tower, (x, y) in enumerate(zip(xs, ys)):
        rng = np.random.RandomState((args.seed * 100_003 + step * 17 + tower) % (2**32))
        feed[x] = rng.standard_normal((args.batch, DIM)).astype(np.float32)
        feed[y] = rng.randint(0, CLASSES, size=args.batch).astype(np.int64)
    return feed


def build(args: argparse.Namespace) -> tuple[Any, Any, list[Any], list[Any]]:
    """(global_step, train: returns the incremented step, tower inputs, tower labels)."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    if args.optimizer == "adam":
        opt = tf.compat.v1.train.AdamOptimizer(0.01)
    else:
        opt = tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9)
    init_rng = np.random.RandomState(args.seed)
    start = {"w1": init_rng.standard_normal((DIM, HIDDEN)).astype(np.float32) * 0.3,
             "b1": np.zeros(HIDDEN, np.float32),
             "w2": init_rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32) * 0.3,
             "b2": np.zeros(CLASSES, np.float32)}
    xs, ys, grads, tower_vars = [], [], [], []
    for i, device in enumerate(tower_devices(args.replicas, args.devices, kind="cpu")):
        with tf.device(device), tf.compat.v1.variable_scope(f"tower_{i}"):
            x = tf.compat.v1.placeholder(tf.float32, [None, DIM], name="x")
            y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
            v = {k: tf.compat.v1.get_variable(k, initializer=val) for k, val in start.items()}
            h = tf.nn.relu(tf.matmul(x, v["w1"]) + v["b1"])
            logits = tf.matmul(h, v["w2"]) + v["b2"]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            variables = [v[k] for k in sorted(v)]
            xs.append(x)
            ys.append(y)
            tower_vars.append(variables)
            grads.append(tf.gradients(loss, variables))
    with tf.device("/cpu:0"):
        avg = [g[0] if args.replicas == 1 else tf.add_n(list(g)) / float(args.replicas)
               for g in zip(*grads)]
    # One apply for every replica: Adam's beta powers then advance once per step,
    # after all updates (two applies would race on them).
    apply = opt.apply_gradients([(g, v) for variables in tower_vars for g, v in zip(avg, variables)])
    with tf.control_dependencies([apply]):
        train = gs.assign_add(1, read_value=True)
    return gs, train, xs, ys


def dump(path: str | None, values: dict[str, Any]) -> None:
    if not path:
        return
    tmp = path + ".tmp.npz"
    np.savez(tmp, **values)
    os.replace(tmp, path)


def session_loop(args: argparse.Namespace, config: Any) -> int:
    gs, train, xs, ys = build(args)
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(gs))  # the restored step after a migration
        while step < args.steps:
            step = int(sess.run(train, feed_dict=feed_for(args, step, xs, ys)))
            sleep_after_step(args)
        variables = tf.compat.v1.global_variables()
        dump(args.dump, {v.name: x for v, x in zip(variables, sess.run(variables))})
    return step


class _DumpAtEnd(tf.compat.v1.train.SessionRunHook):
    def __init__(self, path: str | None) -> None:
        self.path = path

    def end(self, session: Any) -> None:
        variables = tf.compat.v1.global_variables()
        dump(self.path, {v.name: x for v, x in zip(variables, session.run(variables))})


def mts_loop(args: argparse.Namespace, config: Any) -> int:
    gs, train, xs, ys = build(args)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps), _DumpAtEnd(args.dump)]
    with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=hooks, config=config, save_checkpoint_secs=None, save_summaries_steps=None,
            save_summaries_secs=None, log_step_count_steps=None) as sess:
        step = int(sess.run(gs))
        while not sess.should_stop():
            step = int(sess.run(train, feed_dict=feed_for(args, step, xs, ys)))
            sleep_after_step(args)
    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": args.devices},
                                      intra_op_parallelism_threads=1,
                                      inter_op_parallelism_threads=1)
    step = (mts_loop if args.loop == "mts" else session_loop)(args, config)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
