"""Batch normalization as TF1 programs write it, by hand (`tf.compat.v1.layers` needs Keras 2,
which this TensorFlow lacks): the batch's moments normalise the layer, and the moving
averages are updated by assignments in UPDATE_OPS, under `control_dependencies` of the
training op (`--updates deps`), or in a run of their own fed the same mini-batch after the
training run (`--updates after`) or before it (`before`)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--updates", choices=["deps", "after", "before"], default="deps")


args, gs, x, y = _base.start(extra)
w1 = v1.get_variable("w1", initializer=np.random.RandomState(4).standard_normal(
    (_base.DIM, 8)).astype(np.float32) * 0.5)
h = tf.matmul(x, w1)
mean, var = tf.nn.moments(h, [0])
beta = v1.get_variable("bn/beta", initializer=np.zeros(8, np.float32))
gamma = v1.get_variable("bn/gamma", initializer=np.ones(8, np.float32))
moving_mean = v1.get_variable("bn/moving_mean", initializer=np.zeros(8, np.float32),
                              trainable=False)
moving_var = v1.get_variable("bn/moving_var", initializer=np.ones(8, np.float32),
                             trainable=False)
for moving, now in ((moving_mean, mean), (moving_var, var)):
    v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, moving.assign(moving * 0.8 + now * 0.2))
h = tf.nn.batch_normalization(h, mean, var, beta, gamma, 1e-3)
loss = _base.classifier(tf.nn.relu(h)[:, :_base.DIM], y)
updates = v1.get_collection(v1.GraphKeys.UPDATE_OPS)
opt = v1.train.MomentumOptimizer(0.05, 0.9)
if args.updates == "deps":
    with tf.control_dependencies(updates):
        train = opt.minimize(loss, global_step=gs)
else:
    train = opt.minimize(loss, global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        bx, by = _base.batch(step)
        feed = {x: bx, y: by}
        if args.updates == "before":
            sess.run(updates, feed)
        sess.run(train, feed)
        if args.updates == "after":
            sess.run(updates, feed)
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
