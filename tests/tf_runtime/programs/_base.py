"""Shared bits of the unseen-program family: flags, determinism, data from a step, dumping."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
import tensorflow as tf

DIM, CLASSES = 6, 3


def parse(extra: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--dump", default=None)
    p.add_argument("--workdir", default=None)
    if extra:
        extra(p)
    args = p.parse_args()
    tf.compat.v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    tf.compat.v1.set_random_seed(1)
    return args


def start(extra: Any = None) -> tuple[argparse.Namespace, Any, Any, Any]:
    """Flags, then the graph's usual beginning: (args, global step, features, labels)."""
    args = parse(extra)
    return args, tf.compat.v1.train.get_or_create_global_step(), *inputs()


def config() -> Any:
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)


def batch(step: int, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1000 + int(step))
    return (rng.standard_normal((n, DIM)).astype(np.float32),
            rng.randint(0, CLASSES, size=n).astype(np.int64))


def inputs() -> tuple[Any, Any]:
    """The placeholders of a mini-batch: features and labels."""
    return (tf.compat.v1.placeholder(tf.float32, [None, DIM]),
            tf.compat.v1.placeholder(tf.int64, [None]))


def classifier(x: Any, y: Any, scope: str = "net") -> Any:
    with tf.compat.v1.variable_scope(scope):
        w = tf.compat.v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
            (DIM, CLASSES)).astype(np.float32) * 0.3)
        b = tf.compat.v1.get_variable("b", initializer=np.zeros(CLASSES, np.float32))
        logits = tf.matmul(x, w) + b
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def examples(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A fixed data set held in memory: `n` examples' features and labels."""
    rng = np.random.RandomState(7)
    return (rng.standard_normal((n, DIM)).astype(np.float32),
            rng.randint(0, CLASSES, size=n).astype(np.int64))


def counted_training(ids: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
    """(global step, loss, training op) of the classifier on a tf.data batch, trained by
    Adam; the training op also sums the ids it read into a variable `seen`, so that each
    example trained on more or less than once shows in the final variables."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    loss = classifier(x, y)
    seen = tf.compat.v1.get_variable("seen", initializer=np.int64(0), trainable=False)
    train = tf.group(tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=gs),
                     seen.assign_add(tf.reduce_sum(ids)))
    return gs, loss, train


def fed_step(sess: Any, train: Any, gs: Any, x: Any, y: Any, step: int) -> int:
    """One training run fed the mini-batch of `step`; the global step read after it."""
    bx, by = batch(step)
    sess.run(train, {x: bx, y: by})
    return int(sess.run(gs))


def plain_loop(args: argparse.Namespace, train: Any, gs: Any, x: Any, y: Any,
               after_init: Any = None, before: Any = None, after: Any = None) -> Any:
    """The plain Session loop: initialise (then `after_init(sess)`), read the global step,
    train each mini-batch fed from the step it read until `--steps`, dump. `before(sess,
    feed)` / `after(sess, feed)`: a run of the program's own right before / after each
    training run (given its feed). Returns the session (closed)."""
    import time

    with tf.compat.v1.Session(config=config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if after_init is not None:
            after_init(sess)
        step = sess.run(gs)
        while step < args.steps:
            if before is None and after is None:
                step = fed_step(sess, train, gs, x, y, step)
            else:
                bx, by = batch(step)
                feed = {x: bx, y: by}
                if before is not None:
                    before(sess, feed)
                sess.run(train, feed)
                if after is not None:
                    after(sess, feed)
                step = int(sess.run(gs))
            time.sleep(args.step_sleep)
        dump(args.dump, sess)
    return sess


def unfed_loop(sess: Any, args: argparse.Namespace, train: Any, gs: Any) -> int:
    """A loop whose training run needs no feed (its input is in the graph): train until the
    global step read after each run reaches `--steps`. Returns that step."""
    import time

    step = sess.run(gs)
    while step < args.steps:
        sess.run(train)
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    return int(step)


def monitored_loop(sess: Any, args: argparse.Namespace, train: Any, gs: Any, x: Any,
                   y: Any) -> int:
    """A MonitoredSession's loop: read the step, train each mini-batch fed from it until a
    hook asks to stop. Returns the last step read."""
    import time

    step = sess.run(gs)
    while not sess.should_stop():
        bx, by = batch(step)
        sess.run(train, {x: bx, y: by})
        if not sess.should_stop():
            step = sess.run(gs)
        time.sleep(args.step_sleep)
    return int(step)


def dump(path: str | None, sess: Any) -> None:
    if not path:
        return
    variables = tf.compat.v1.global_variables()
    values = {v.name: x for v, x in zip(variables, sess.run(variables))}
    tmp = path + ".tmp.npz"
    np.savez(tmp, **values)
    os.replace(tmp, path)


class DumpAtEnd(tf.compat.v1.train.SessionRunHook):
    """Dumps the variables (`dump`) when a MonitoredSession ends."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def end(self, session: Any) -> None:
        dump(self.path, session)


def monitored_session(args: argparse.Namespace) -> Any:
    """MonitoredTrainingSession until `--steps` (StopAtStepHook), dumping the variables at its
    end, with none of its own checkpoints or summaries."""
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps), DumpAtEnd(args.dump)]
    return tf.compat.v1.train.MonitoredTrainingSession(
        hooks=hooks, config=config(), save_checkpoint_secs=None, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=None)
