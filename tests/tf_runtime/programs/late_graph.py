"""Old-style TF1 code: an InteractiveSession opened before the model is built (notebook
style), a global step made by hand (`tf.Variable(0, name="global_step")`, int32, in no
collection), weights split by a partitioner, batch normalisation whose moving averages
run through UPDATE_OPS, and plain SGD; each mini-batch fed from the step it read."""

import time

import _base
import tensorflow as tf

args = _base.parse()
sess = tf.compat.v1.InteractiveSession(config=_base.config())
gs = tf.Variable(0, trainable=False, name="global_step")
x, y = _base.inputs()
w = tf.compat.v1.get_variable("w", shape=[_base.DIM, 16],
                              initializer=tf.compat.v1.glorot_uniform_initializer(seed=3),
                              partitioner=tf.compat.v1.fixed_size_partitioner(2))
mean, var = tf.nn.moments(tf.matmul(x, w), [0])
beta = tf.compat.v1.get_variable("beta", initializer=tf.zeros([16]))
gamma = tf.compat.v1.get_variable("gamma", initializer=tf.ones([16]))
h = tf.nn.batch_normalization(tf.matmul(x, w), mean, var, beta, gamma, 1e-3)
for stat, value in (("moving_mean", mean), ("moving_variance", var)):
    moving = tf.compat.v1.get_variable(stat, initializer=tf.zeros([16]), trainable=False)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                   moving.assign(0.9 * moving + 0.1 * value))
w2 = tf.compat.v1.get_variable("w2", initializer=tf.fill([16, _base.CLASSES], 0.1))
out = tf.matmul(tf.nn.relu(h), w2)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out))
with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
sess.run(tf.compat.v1.global_variables_initializer())
step = sess.run(gs)
while step < args.steps:
    bx, by = _base.batch(step)
    train.run({x: bx, y: by})
    step = gs.eval()
    time.sleep(args.step_sleep)
_base.dump(args.dump, sess)
sess.close()
