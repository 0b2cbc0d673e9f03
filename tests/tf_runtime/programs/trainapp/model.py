"""The directory trainer's model: two layers, Adagrad, mini-batches made from the step."""

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
DIM, CLASSES = 6, 3


def build():
    v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [None, DIM])
    y = v1.placeholder(tf.int64, [None])
    w1 = v1.get_variable("app/w1", initializer=np.random.RandomState(3).standard_normal(
        (DIM, 10)).astype(np.float32) * 0.3)
    w2 = v1.get_variable("app/w2", initializer=np.random.RandomState(4).standard_normal(
        (10, CLASSES)).astype(np.float32) * 0.3)
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train = v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    sess = v1.Session(config=v1.ConfigProto(intra_op_parallelism_threads=1,
                                            inter_op_parallelism_threads=1))
    sess.run(v1.global_variables_initializer())

    def feed(step):
        rng = np.random.RandomState(1000 + int(step))
        return {x: rng.standard_normal((8, DIM)).astype(np.float32),
                y: rng.randint(0, CLASSES, size=8).astype(np.int64)}

    return sess, gs, train, feed


def dump(sess, path):
    if path:
        variables = v1.global_variables()
        np.savez(path, **{v.name: a for v, a in zip(variables, sess.run(variables))})
