"""Streaming metrics of `tf.compat.v1.metrics` (an accuracy and a mean of the loss: total
and count in LOCAL_VARIABLES / METRIC_VARIABLES) updated in every training run after the
update, reset at the top of the loop every `--epoch` steps by `local_variables_initializer`
(`--reset init`) or `variables_initializer(METRIC_VARIABLES)` (`--reset own`); the running
accuracy read in a run of its own before each training run and fed as the loss's weight
(the metric steers training). Momentum, fed from the step read; the dump has the local
variables too."""

import os
import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--reset", choices=["init", "own"], default="init")
    p.add_argument("--epoch", type=int, default=5)


args, gs, x, y = _base.start(extra)
weight = v1.placeholder(tf.float32, [])
with v1.variable_scope("net"):
    w = v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
        (_base.DIM, _base.CLASSES)).astype(np.float32) * 0.3)
logits = tf.matmul(x, w)
xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
update = v1.train.MomentumOptimizer(0.05, 0.9).minimize(xent * weight, global_step=gs)
with tf.control_dependencies([update]):
    _, acc_up = v1.metrics.accuracy(y, tf.argmax(logits, 1), name="acc")
    _, mean_up = v1.metrics.mean(xent, name="mloss")
train = tf.group(update, acc_up, mean_up)
metric_vars = v1.get_collection(v1.GraphKeys.METRIC_VARIABLES)
total, count = [v for v in metric_vars if v.op.name.startswith("acc/")]
running = tf.math.divide_no_nan(tf.identity(total), tf.identity(count))
reset = (v1.local_variables_initializer() if args.reset == "init"
         else v1.variables_initializer(metric_vars))

with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    sess.run(v1.local_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        if step % args.epoch == 0 and step:
            print("epoch", step // args.epoch, "accuracy", sess.run(running), flush=True)
            sess.run(reset)
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by, weight: 1.0 + float(sess.run(running))})
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    if args.dump:
        kept = v1.global_variables() + v1.local_variables()
        np.savez(args.dump + ".tmp.npz", **{v.name: a for v, a in zip(kept, sess.run(kept))})
        os.replace(args.dump + ".tmp.npz", args.dump)
