"""Layer-wise unfreezing: a two-layer network whose training op is chosen each step from a
Python schedule of the step read: the head alone first (`var_list=` its variables), then the
head and the hidden layer, then everything with another optimizer (`--then adam`: Adam
from `--all-at`, its slots created for all variables at graph build) or the same Momentum.
Each mini-batch fed from the step read."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--hidden-at", type=int, default=4)
    p.add_argument("--all-at", type=int, default=8)
    p.add_argument("--then", choices=["adam", "momentum"], default="adam")


args, gs, x, y = _base.start(extra)
rng = np.random.RandomState(5)
with v1.variable_scope("stem"):
    w0 = v1.get_variable("w", initializer=(rng.standard_normal((_base.DIM, 8)) * 0.3).astype(np.float32))
with v1.variable_scope("hidden"):
    w1 = v1.get_variable("w", initializer=(rng.standard_normal((8, 8)) * 0.3).astype(np.float32))
with v1.variable_scope("head"):
    w2 = v1.get_variable("w", initializer=(rng.standard_normal((8, _base.CLASSES)) * 0.3).astype(np.float32))
    b2 = v1.get_variable("b", initializer=np.zeros(_base.CLASSES, np.float32))
logits = tf.matmul(tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w0)), w1)), w2) + b2
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
momentum = v1.train.MomentumOptimizer(0.05, 0.9)
train_head = momentum.minimize(loss, var_list=[w2, b2], global_step=gs)
train_upper = momentum.minimize(loss, var_list=[w1, w2, b2], global_step=gs)
last = v1.train.AdamOptimizer(0.01) if args.then == "adam" else momentum
train_all = last.minimize(loss, global_step=gs)

with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        op = (train_head if step < args.hidden_at else
              train_upper if step < args.all_at else train_all)
        step = _base.fed_step(sess, op, gs, x, y, step)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
