"""A variable whose shape grows as it trains: the loss history, made with
`validate_shape=False` (a resource variable also with `shape=tf.TensorShape(None)`), one
entry appended by the training run each step (`tf.concat`, ordered after the update), its
mean weighting the loss. `--ref`: a reference variable. Momentum, fed from the step read."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--ref", action="store_true")


args, gs, x, y = _base.start(extra)
own = {} if args.ref else {"shape": tf.TensorShape(None)}
history = v1.Variable(np.zeros(1, np.float32), validate_shape=False, trainable=False,
                      name="history", use_resource=not args.ref, **own)
loss = _base.classifier(x, y) * (1.0 + 0.1 * tf.reduce_mean(history))
update = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
with tf.control_dependencies([update]):
    longer = tf.concat([tf.identity(history), tf.reshape(loss, [1])], 0)
    train = v1.assign(history, longer, validate_shape=False)
_base.plain_loop(args, train, gs, x, y)
