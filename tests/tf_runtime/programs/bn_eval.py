"""Batch normalisation by hand with a `training` placeholder (a tf.cond between the batch
statistics, whose moving-average updates sit in UPDATE_OPS under the training op's control
dependencies, and the moving statistics), an evaluation on a held-out batch with training
off every 3 steps between training runs, and Momentum at a `piecewise_constant` rate of an
epoch variable incremented at the top of the loop every 4 steps in a run of its own
(`if step % 4 == 0 and step: sess.run(next_epoch)`)."""
import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

args, gs, x, y = _base.start()
training = v1.placeholder_with_default(False, [])
epoch = v1.get_variable("epoch", initializer=tf.constant(0, tf.int64), trainable=False)
next_epoch = v1.assign_add(epoch, 1)
rng = np.random.RandomState(3)
with v1.variable_scope("net"):
    w = v1.get_variable("w", initializer=rng.standard_normal((_base.DIM, 5)).astype(np.float32) * 0.3)
    gamma = v1.get_variable("gamma", initializer=tf.ones([5]))
    beta = v1.get_variable("beta", initializer=tf.zeros([5]))
    mm = v1.get_variable("moving_mean", initializer=tf.zeros([5]), trainable=False)
    mv = v1.get_variable("moving_var", initializer=tf.ones([5]), trainable=False)
    o = v1.get_variable("o", initializer=rng.standard_normal((5, _base.CLASSES)).astype(np.float32) * 0.3)
h = tf.matmul(x, w)
bm, bv = tf.nn.moments(h, [0])
v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, v1.assign(mm, mm * 0.9 + bm * 0.1))
v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, v1.assign(mv, mv * 0.9 + bv * 0.1))
mean, var = tf.cond(training, lambda: (tf.identity(bm), tf.identity(bv)),
                    lambda: (tf.identity(mm), tf.identity(mv)))
logits = tf.matmul(tf.nn.relu(tf.nn.batch_normalization(h, mean, var, beta, gamma, 1e-3)), o)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
rate = v1.train.piecewise_constant(epoch, [np.int64(1), np.int64(2)], [0.1, 0.05, 0.02])
with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
    train = v1.train.MomentumOptimizer(rate, 0.9).minimize(loss, global_step=gs)
ex, ey = _base.batch(999)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        if step % 4 == 0 and step:
            sess.run(next_epoch)
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by, training: True})
        step = sess.run(gs)
        if step % 3 == 0:
            print("eval", step, sess.run(loss, {x: ex, y: ey}), flush=True)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
