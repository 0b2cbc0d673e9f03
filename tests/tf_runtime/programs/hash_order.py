"""Python containers whose order depends on string hashing: the model's branches are built
by iterating a `set` of feature names (so the variables are created, and the branches'
contributions summed, in the set's order), and each mini-batch's examples are taken from
shards named in a `set` too, in its iteration order. Fixed by PYTHONHASHSEED (which the
job's environment or the helper sets); each mini-batch fed from the step read; Momentum."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
FEATURES = {"age", "height", "weight", "income", "score", "tenure"}
SHARDS = {"train-a.tfr", "train-b.tfr", "train-c.tfr", "train-d.tfr"}

args, gs, x, y = _base.start()
logits = 0.0
for i, name in enumerate(FEATURES):
    w = v1.get_variable(f"branch_{name}", initializer=np.full((_base.DIM, _base.CLASSES), 0.01 * (i + 1),
                                                               np.float32))
    logits = logits + tf.matmul(x, w)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
order = list(SHARDS)


def batch(step):
    shard = order[step % len(order)]
    rng = np.random.RandomState(sum(map(ord, shard)) * 1000 + step)
    return (rng.standard_normal((8, _base.DIM)).astype(np.float32),
            rng.randint(0, _base.CLASSES, size=8).astype(np.int64))


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        bx, by = batch(step)
        sess.run(train, {x: bx, y: by})
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
