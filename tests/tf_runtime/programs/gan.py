"""GAN-style: a discriminator step (RMSProp, no global step) then a generator step (Adam,
increments the global step), two sess.run calls per step. `--advance first`: the
discriminator step increments the global step instead, and comes first."""

import time

import _base
import numpy as np
import tensorflow as tf


def extra(p):
    p.add_argument("--advance", default="last", choices=["first", "last"])


args = _base.parse(extra)
first = args.advance == "first"
gs = tf.compat.v1.train.get_or_create_global_step()
z = tf.compat.v1.placeholder(tf.float32, [None, 4])
real = tf.compat.v1.placeholder(tf.float32, [None, _base.DIM])
with tf.compat.v1.variable_scope("gen"):
    gw = tf.compat.v1.get_variable("w", initializer=np.random.RandomState(5).standard_normal(
        (4, _base.DIM)).astype(np.float32) * 0.3)
    fake = tf.tanh(tf.matmul(z, gw))
with tf.compat.v1.variable_scope("disc"):
    dw = tf.compat.v1.get_variable("w", initializer=np.random.RandomState(6).standard_normal(
        (_base.DIM, 1)).astype(np.float32) * 0.3)


def disc(v):
    return tf.matmul(v, dw)


d_loss = tf.reduce_mean(tf.nn.softplus(disc(fake)) + tf.nn.softplus(-disc(real)))
g_loss = tf.reduce_mean(tf.nn.softplus(-disc(fake)))
d_train = tf.compat.v1.train.RMSPropOptimizer(0.01).minimize(
    d_loss, var_list=[dw], global_step=gs if first else None)
g_train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
    g_loss, var_list=[gw], global_step=None if first else gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        rng = np.random.RandomState(step)
        feed = {z: rng.standard_normal((8, 4)).astype(np.float32),
                real: rng.standard_normal((8, _base.DIM)).astype(np.float32)}
        sess.run(d_train, feed)
        sess.run(g_train, feed)
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
