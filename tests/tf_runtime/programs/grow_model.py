"""A model that grows while it trains: once the global step read reaches `--grow-at`, the
program builds a hidden layer (new variables, created lazily in the same graph), a new
output on it, and a new optimizer for the grown model (new slots for the old weights too),
initialises only what is new (`variables_initializer`), and trains the grown model from
then on. `--optimizer momentum|adam`; each mini-batch fed from the step read. A restarted
copy past `--grow-at` grows right after reading its restored step, before its first step."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--grow-at", type=int, default=8)
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")


def optimizer():
    if args.optimizer == "adam":
        return v1.train.AdamOptimizer(0.02)
    return v1.train.MomentumOptimizer(0.05, 0.9)


args, gs, x, y = _base.start(extra)
with v1.variable_scope("net"):
    w = v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
        (_base.DIM, _base.CLASSES)).astype(np.float32) * 0.3)
logits = tf.matmul(x, w)


def xent(out):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out))


train = optimizer().minimize(xent(logits), global_step=gs)


def grow(sess):
    """The hidden layer, added beside the linear model; only the new variables initialised."""
    before = set(v1.global_variables())
    with v1.variable_scope("grown"):
        h = v1.get_variable("h", initializer=np.random.RandomState(4).standard_normal(
            (_base.DIM, 8)).astype(np.float32) * 0.3)
        o = v1.get_variable("o", initializer=np.random.RandomState(5).standard_normal(
            (8, _base.CLASSES)).astype(np.float32) * 0.3)
    grown = logits + tf.matmul(tf.nn.relu(tf.matmul(x, h)), o)
    with v1.variable_scope("grown_opt"):
        op = optimizer().minimize(xent(grown), global_step=gs)
    sess.run(v1.variables_initializer([v for v in v1.global_variables() if v not in before]))
    print(f"grown at step {sess.run(gs)}", flush=True)
    return op


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    grown = False
    while step < args.steps:
        if not grown and step >= args.grow_at:
            train, grown = grow(sess), True
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by})
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
