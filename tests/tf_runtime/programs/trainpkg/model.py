"""The package trainer's model and loop: two layers, RMSProp under `exponential_decay` of the
global step, a loop on the step read, its variables dumped at the end."""

import time

import numpy as np
import tensorflow as tf

from . import inputs

v1 = tf.compat.v1
DIM, CLASSES = 6, 3


def build():
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, DIM])
    y = v1.placeholder(tf.int64, [None])
    with v1.variable_scope("pkg"):
        w1 = v1.get_variable("w1", initializer=np.random.RandomState(3).standard_normal(
            (DIM, 12)).astype(np.float32) * 0.3)
        w2 = v1.get_variable("w2", initializer=np.random.RandomState(4).standard_normal(
            (12, CLASSES)).astype(np.float32) * 0.3)
    logits = tf.matmul(tf.nn.tanh(tf.matmul(x, w1)), w2)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    rate = v1.train.exponential_decay(0.02, gs, 10, 0.9)
    train = v1.train.RMSPropOptimizer(rate).minimize(loss, global_step=gs)
    return gs, x, y, train


def run(steps: int, step_sleep: float, dump: str | None) -> None:
    gs, x, y, train = build()
    config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with v1.Session(config=config) as sess:
        sess.run(v1.global_variables_initializer())
        step = sess.run(gs)
        while step < steps:
            bx, by = inputs.batch(step, 8, DIM, CLASSES)
            sess.run(train, {x: bx, y: by})
            step = sess.run(gs)
            time.sleep(step_sleep)
        if dump:
            variables = v1.global_variables()
            np.savez(dump, **{v.name: a for v, a in zip(variables, sess.run(variables))})
