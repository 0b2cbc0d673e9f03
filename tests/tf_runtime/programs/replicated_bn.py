"""Replicated data parallelism as tf_cnn_benchmarks' `replicated` mode builds it: one copy of
every variable per tower (`tower_0/`, `tower_1/`, each copy starting from the same values),
the towers' gradients averaged and applied to every copy (Momentum), so the trainable copies
stay equal; each tower normalises its own half of the mini-batch with batch normalisation
whose moving mean and variance (non-trainable) it updates from its own half (its own
UPDATE_OPS), so those differ between towers. Plain Session loop fed from the global step."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
TOWERS, HIDDEN = 2, 5

args, gs, x, y = _base.start()
xs, ys = tf.split(x, TOWERS), tf.split(y, TOWERS)
losses, grads, tower_vars, updates = [], [], [], []
for i in range(TOWERS):
    with v1.variable_scope(f"tower_{i}"):
        w1 = v1.get_variable("w1", initializer=np.random.RandomState(1).standard_normal(
            (_base.DIM, HIDDEN)).astype(np.float32) * 0.4)
        w2 = v1.get_variable("w2", initializer=np.random.RandomState(2).standard_normal(
            (HIDDEN, _base.CLASSES)).astype(np.float32) * 0.4)
        gamma = v1.get_variable("bn/gamma", initializer=np.ones(HIDDEN, np.float32))
        beta = v1.get_variable("bn/beta", initializer=np.zeros(HIDDEN, np.float32))
        mm = v1.get_variable("bn/moving_mean", initializer=np.zeros(HIDDEN, np.float32),
                             trainable=False)
        mv = v1.get_variable("bn/moving_variance", initializer=np.ones(HIDDEN, np.float32),
                             trainable=False)
        h = tf.matmul(xs[i], w1)
        mean, var = tf.nn.moments(h, [0])
        h = tf.nn.relu(tf.nn.batch_normalization(h, mean, var, beta, gamma, 1e-3))
        updates += [v1.assign_sub(mm, 0.1 * (mm - mean)), v1.assign_sub(mv, 0.1 * (mv - var))]
        logits = tf.matmul(h, w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys[i],
                                                                            logits=logits))
        variables = [w1, w2, gamma, beta]
        losses.append(loss)
        tower_vars.append(variables)
        grads.append(tf.gradients(loss, variables))
avg = [tf.add_n(list(g)) / TOWERS for g in zip(*grads)]
opt = v1.train.MomentumOptimizer(0.05, 0.9)
applies = [opt.apply_gradients(list(zip(avg, vs))) for vs in tower_vars]
with tf.control_dependencies(applies + updates):
    train = gs.assign_add(1)
_base.plain_loop(args, train, gs, x, y)
