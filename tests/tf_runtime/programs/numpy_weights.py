"""TF1 code written from scratch: the first layer's weights loaded from NumPy arrays after
`global_variables_initializer()` (`sess.run(w.assign(placeholder), {placeholder: array})`, as
programs loading a pre-trained network from `.npy` files do), then trained. `--update apply`:
an optimizer's update; `--update manual`: gradient descent written by hand
(`tf.compat.v1.assign(w, w - rate * grad)` for each weight) and the global step advanced by
`gs.assign(gs + 1)`. Each mini-batch fed from the global step it read."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--update", choices=["apply", "manual"], default="manual")


args, gs, x, y = _base.start(extra)
with v1.variable_scope("net"):
    w1 = v1.get_variable("w1", shape=(_base.DIM, 8))
    w2 = v1.get_variable("w2", initializer=tf.fill([8, _base.CLASSES], 0.05))
logits = tf.matmul(tf.tanh(tf.matmul(x, w1)), w2)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
if args.update == "apply":
    train = v1.train.GradientDescentOptimizer(0.2).minimize(loss, global_step=gs)
else:
    grads = tf.gradients(loss, [w1, w2])
    steps = [v1.assign(w, w - 0.2 * g) for w, g in zip([w1, w2], grads)]
    with tf.control_dependencies(steps):
        train = gs.assign(gs + 1)
pretrained = v1.placeholder(tf.float32, (_base.DIM, 8))
load = w1.assign(pretrained)
sess = _base.plain_loop(args, train, gs, x, y, after_init=lambda s: s.run(
    load, {pretrained: np.random.RandomState(9).standard_normal((_base.DIM, 8)).astype(
        np.float32)}))
