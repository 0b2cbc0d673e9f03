"""Fine-tuning from a pre-trained checkpoint: `tf.compat.v1.train.init_from_checkpoint` makes
the initialisers of the backbone's variables load them from a checkpoint the program writes
once into its `--workdir` (a deterministic "pre-training"), the head starts from its own
initialiser, and only the head and the last backbone layer train (`var_list`), with SGD and a
learning rate warmed up linearly over the first 10 steps of the global step. Each
mini-batch fed from the global step it read."""

import os

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

args = _base.parse()
pretrained = os.path.join(args.workdir or "/tmp/warm_start", "pretrained")
if not os.path.exists(pretrained + ".index"):
    with tf.Graph().as_default(), v1.Session() as pre:
        rng = np.random.RandomState(11)
        with v1.variable_scope("backbone"):
            for name, shape in (("w1", (_base.DIM, 8)), ("w2", (8, 8))):
                v1.get_variable(name, initializer=rng.standard_normal(shape).astype(np.float32))
        pre.run(v1.global_variables_initializer())
        v1.train.Saver().save(pre, pretrained, write_meta_graph=False)

gs = v1.train.get_or_create_global_step()
x, y = _base.inputs()
with v1.variable_scope("backbone"):
    w1 = v1.get_variable("w1", shape=(_base.DIM, 8))
    w2 = v1.get_variable("w2", shape=(8, 8))
v1.train.init_from_checkpoint(pretrained, {"backbone/": "backbone/"})
with v1.variable_scope("head"):
    w3 = v1.get_variable("w3", initializer=tf.fill([8, _base.CLASSES], 0.05))
logits = tf.matmul(tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)), w3)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
rate = 0.1 * tf.minimum(1.0, tf.cast(gs + 1, tf.float32) / 10.0)
train = v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=gs,
                                                          var_list=[w2, w3])
_base.plain_loop(args, train, gs, x, y)
