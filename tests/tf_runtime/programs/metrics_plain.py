"""A plain Session loop with state outside the global variables: a trainable scale kept in a
collection of its own (`collections=["model", TRAINABLE_VARIABLES]`), initialised in a run of
its own after `global_variables_initializer()`; streaming metrics (local variables): with
`--train-metric`, a mean of the loss updated in every training run (all local variables
initialised at the start); every 10 steps an accuracy on a held-out batch, its metric reset
(`local_variables_initializer()`) before each evaluation, so without `--train-metric` the
local variables stay uninitialised until the first one. Momentum; each mini-batch fed from the
global step it read."""

import os
import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--train-metric", action="store_true")


args, gs, x, y = _base.start(extra)
scale = v1.get_variable("scale", initializer=np.float32(1.0),
                        collections=["model", v1.GraphKeys.TRAINABLE_VARIABLES])
with v1.variable_scope("net"):
    w = v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
        (_base.DIM, _base.CLASSES)).astype(np.float32) * 0.3)
logits = tf.matmul(x, w) * scale
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
if args.train_metric:
    mean_loss, update_mean = v1.metrics.mean(loss, name="train_mean")
    train = tf.group(train, update_mean)
accuracy, update_accuracy = v1.metrics.accuracy(y, tf.argmax(logits, 1), name="eval_accuracy")
held_out = _base.batch(10**6, n=32)
accuracies = []
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    sess.run(v1.variables_initializer(v1.get_collection("model")))
    if args.train_metric:
        sess.run(v1.local_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        if step % 10 == 0:
            sess.run(v1.local_variables_initializer())
            sess.run(update_accuracy, {x: held_out[0], y: held_out[1]})
            accuracies.append(float(sess.run(accuracy)))
            print(f"step {step} accuracy {accuracies[-1]:.4f}", flush=True)
        time.sleep(args.step_sleep)
    if args.dump:
        state = v1.global_variables() + v1.get_collection("model") + v1.local_variables()
        values = {v.name: a for v, a in zip(state, sess.run(state))}
        np.savez(args.dump + ".tmp.npz", **values)
        os.replace(args.dump + ".tmp.npz", args.dump)
print(f"done at step {step}", flush=True)
