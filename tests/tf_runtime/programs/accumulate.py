"""Gradient accumulation: each step sums the gradients of `--micro` mini-batches into
non-trainable accumulators (runs that train nothing yet), applies their mean with RMSProp,
zeroes them, and then advances the global step in a run of its own (`sess.run(inc)`). Runs
are named by strings (`"train/apply"`, feeds `{"x:0": ...}`), as programs that load their
graph from a file do. Each micro-batch fed from the step and its index."""

import time

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--micro", type=int, default=3)


args = _base.parse(extra)
gs = tf.compat.v1.train.get_or_create_global_step()
x = tf.compat.v1.placeholder(tf.float32, [None, _base.DIM], name="x")
y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
loss = _base.classifier(x, y)
params = tf.compat.v1.trainable_variables()
accums = [tf.compat.v1.get_variable(p.op.name + "/accum", initializer=tf.zeros(p.shape),
                                    trainable=False) for p in params]
grads = tf.gradients(loss, params)
accumulate = tf.group(*[a.assign_add(g) for a, g in zip(accums, grads)], name="accumulate")
with tf.name_scope("train"):
    opt = tf.compat.v1.train.RMSPropOptimizer(0.02)
    apply = opt.apply_gradients([(a / args.micro, p) for a, p in zip(accums, params)])
    with tf.control_dependencies([apply]):
        tf.group(*[a.assign(tf.zeros_like(a)) for a in accums], name="apply")
inc = tf.compat.v1.assign_add(gs, 1, name="increment")
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        for i in range(args.micro):
            bx, by = _base.batch(step * args.micro + i)
            sess.run("accumulate", {"x:0": bx, "y:0": by})
        sess.run("train/apply")
        step = sess.run(inc)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
