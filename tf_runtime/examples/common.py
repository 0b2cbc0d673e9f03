"""Shared parts of the example programs: flags, deterministic towers, the loop.

Every example is deterministic (fixed seeds, op determinism, its input batch a
pure function of the seed, the tower and the global step), builds `--replicas N`
towers with replicated variables on the virtual devices /cpu:0../cpu:N-1 and
averages their gradients, so each replica stays identical. Its loop continues
from the global step, so a restored program picks up where it stopped.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import tf_runtime

ModelFn = Callable[[argparse.Namespace, Any, int], Any]  # (args, global step, tower) -> loss


def parse_args(description: str, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               **defaults: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(p)
    p.add_argument("--steps", type=int, default=defaults.get("steps", 100),
                   help="train until the global step reaches this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int, default=1, help="towers on /cpu:0../cpu:N-1")
    p.add_argument("--batch", type=int, default=defaults.get("batch", 16), help="per tower")
    p.add_argument("--lr", type=float, default=defaults.get("lr", 0.05))
    p.add_argument("--threads", type=int, default=defaults.get("threads", 1),
                   help="intra-op threads")
    p.add_argument("--log-every", type=int, default=0, help="print the loss every N steps")
    p.add_argument("--eval-every", type=int, default=0,
                   help="every N steps, evaluate the loss and publish it with tf_runtime.report")
    p.add_argument("--loss-avg", type=int, default=0, metavar="N",
                   help="publish loss_avg, the mean loss of the last N mini-batches (a single mini-batch's "
                        "loss is noisy: AutoML ranks better by this)")
    p.add_argument("--dump", default=None, help="write all variables to this .npz at the end")
    step_sleep_flags(p, "sleep this long after each step (slows a demo down)")
    args = p.parse_args(argv)
    if args.replicas < 1 or args.steps < 0 or args.batch < 1:
        p.error("--replicas and --batch must be >= 1 and --steps >= 0")
    return args


def step_sleep_flags(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--step-sleep", type=float, default=0.0, help=help_text)
    p.add_argument("--step-sleep-until", default=None, metavar="FILE",
                   help="sleep after steps only until FILE exists: a test that needs the job "
                        "to be training when something happens (a migration) creates FILE then, "
                        "and the job runs its last steps at full speed")


def sleep_after_step(args: argparse.Namespace) -> None:
    """--step-sleep, unless --step-sleep-until's file exists."""
    if args.step_sleep and not (args.step_sleep_until and os.path.exists(args.step_sleep_until)):
        time.sleep(args.step_sleep)


def configure(seed: int) -> None:
    """TF1 graph mode, fixed seeds, deterministic kernels."""
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def session_config(args: argparse.Namespace) -> Any:
    return tf.compat.v1.ConfigProto(
        device_count={"CPU": args.replicas},
        intra_op_parallelism_threads=args.threads,
        inter_op_parallelism_threads=args.threads,
        allow_soft_placement=False)


def same_start_getter() -> Callable[..., Any]:
    """A custom getter for `variable_scope("tower_I")`: every tower's copy of a variable
    starts from tower 0's initial value (its random init, evaluated once), as replicated
    training keeps its copies (tf_cnn_benchmarks copies tower 0 after initialisation)."""
    first: dict[str, Any] = {}

    def same_start(getter: Any, name: str, *a: Any, **kw: Any) -> Any:
        rest = name.split("/", 1)[1]
        if rest in first:
            kw.update(initializer=first[rest].initial_value, shape=None)
            return getter(name, *a, **kw)
        var = getter(name, *a, **kw)
        first[rest] = var
        return var

    return same_start


def build_replicated(model: Callable[[Any, int], Any], args: argparse.Namespace,
                     optimizer: Any) -> tuple[Any, Any, Any]:
    """Towers + averaged gradients applied to every replica.

    Returns (global_step, train, loss): running `train` applies one step and yields
    the incremented global step.
    """
    gs = tf.compat.v1.train.get_or_create_global_step()
    losses, grads, tower_vars = [], [], []
    same_start = same_start_getter()
    for i in range(args.replicas):
        with tf.device(f"/cpu:{i}"), tf.compat.v1.variable_scope(f"tower_{i}",
                                                                 custom_getter=same_start):
            loss = model(gs, i)
            variables = tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, scope=f"tower_{i}/")
            losses.append(loss)
            tower_vars.append(variables)
            grads.append(tf.gradients(loss, variables))
    with tf.device("/cpu:0"):
        n = float(args.replicas)
        avg = [g[0] if args.replicas == 1 else tf.add_n(list(g)) / n for g in zip(*grads)]
        mean_loss = tf.identity(tf.add_n(losses) / n, name="loss")
    applies = []
    for i, variables in enumerate(tower_vars):
        with tf.device(f"/cpu:{i}"):
            applies.append(optimizer.apply_gradients(list(zip(avg, variables))))
    with tf.control_dependencies(applies):
        train = gs.assign_add(1, read_value=True)
    return gs, train, mean_loss


def dense(x: Any, name: str, n_out: int, act: Callable[[Any], Any] | None = tf.nn.relu) -> Any:
    """A fully connected layer from raw variables (no tf-keras needed)."""
    n_in = int(x.shape[-1])
    w = tf.compat.v1.get_variable(f"{name}/w", [n_in, n_out],
                                  initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable(f"{name}/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
    y = tf.matmul(x, w) + b
    return act(y) if act is not None else y


def batch_seed(args: argparse.Namespace, tower: int, gs: Any, salt: int = 0) -> Any:
    """The stateless-random seed of a tower's input at this global step."""
    step = tf.cast(gs.read_value(), tf.int64)
    return tf.stack([tf.constant(args.seed * 1009 + tower * 7919 + salt, tf.int64), step])


def train_loop(args: argparse.Namespace, gs: Any, train: Any, loss: Any,
               session: Any) -> int:
    """The program's own loop, driven by the global step (so it resumes)."""
    step = int(session.run(gs))
    start = time.time()
    recent: collections.deque[float] = collections.deque(maxlen=max(1, args.loss_avg))
    while step < args.steps:
        step, value = session.run([train, loss])
        if args.loss_avg:
            recent.append(float(value))
            mean = sum(recent) / len(recent)
            # report() refuses NaN: a diverged run reports the largest float, so it ranks last.
            tf_runtime.report(loss_avg=mean if math.isfinite(mean) else sys.float_info.max)
        if args.log_every and step % args.log_every == 0:
            print(f"step {step} loss {value:.6f} ({time.time() - start:.1f} s)", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            # An evaluation run (not a mini-batch), published as a metric.
            tf_runtime.report(eval_loss=float(session.run(loss)))
        sleep_after_step(args)
    return int(step)


def dump(args: argparse.Namespace, session: Any) -> None:
    if not args.dump:
        return
    variables = tf.compat.v1.global_variables()
    values = session.run(variables)
    tmp = args.dump + ".tmp.npz"
    np.savez(tmp, **{v.name: x for v, x in zip(variables, values)})
    os.replace(tmp, args.dump)


def run_example(description: str, model: ModelFn, make_optimizer: Callable[[float], Any],
                argv: list[str] | None = None,
                extra: Callable[[argparse.ArgumentParser], None] | None = None,
                **defaults: Any) -> int:
    args = parse_args(description, argv, extra, **defaults)
    configure(args.seed)
    gs, train, loss = build_replicated(lambda g, i: model(args, g, i), args,
                                       make_optimizer(args.lr))
    with tf.compat.v1.Session(config=session_config(args)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        step = train_loop(args, gs, train, loss, sess)
        dump(args, sess)
    print(f"done at step {step}", flush=True)
    return 0
