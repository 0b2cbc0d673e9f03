"""A replay buffer kept in variables (DQN-style): each step the program writes the step's
mini-batch into a ring of non-trainable variables (`scatter_update` at `step % 4`, plus an
int64 count of writes) in a run of its own fed that batch, before the training run, which
trains on rows of the buffer picked by stateless random ops seeded by the global step.
Adam; each mini-batch fed from the global step read."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
SLOTS = 4

args, gs, x, y = _base.start()
buf_x = v1.get_variable("replay/x", initializer=np.zeros((SLOTS, 8, _base.DIM), np.float32),
                        trainable=False)
buf_y = v1.get_variable("replay/y", initializer=np.zeros((SLOTS, 8), np.int64), trainable=False)
writes = v1.get_variable("replay/writes", initializer=np.int64(0), trainable=False)
slot = tf.math.floormod(writes, SLOTS)
write = tf.group(v1.scatter_update(buf_x, [slot], x[None]), v1.scatter_update(buf_y, [slot], y[None]))
with tf.control_dependencies([write]):
    write = v1.assign_add(writes, 1)
filled = tf.minimum(writes, SLOTS)
pick = tf.random.stateless_uniform([], seed=tf.stack([tf.cast(gs, tf.int32), 3]), maxval=filled,
                                   dtype=tf.int64)
loss = _base.classifier(tf.gather(buf_x, pick), tf.gather(buf_y, pick))
train = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
_base.plain_loop(args, train, gs, x, y, before=lambda sess, feed: sess.run(write, feed))
