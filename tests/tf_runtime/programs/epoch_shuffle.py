"""The mini-batch reader of the TF1 MNIST tutorial (`DataSet.next_batch`): the examples are
kept in memory and shuffled once per epoch, the batches of an epoch taken in that order.
`--shuffle numpy`: `np.random.shuffle` of numpy's global generator, seeded once; `tf`: the
permutation drawn by a seeded `tf.random.shuffle` in a run of its own at each epoch; `step`:
by a `np.random.RandomState(epoch)` of the epoch the global step is in (a restarted copy
draws the same)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
N, B = 40, 8


def extra(p):
    p.add_argument("--shuffle", choices=["numpy", "tf", "step"], default="numpy")


args, gs, x, y = _base.start(extra)
np.random.seed(5)
pool_x, pool_y = _base.batch(0, N)
permute = tf.random.shuffle(tf.range(N), seed=5)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(_base.classifier(x, y), global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    order = None
    while step < args.steps:
        epoch, pos = divmod(step, N // B)
        if order is None or pos == 0:
            if args.shuffle == "numpy":
                order = np.arange(N)
                np.random.shuffle(order)
            elif args.shuffle == "tf":
                order = sess.run(permute)
            else:
                order = np.random.RandomState(epoch).permutation(N)
        idx = order[pos * B:(pos + 1) * B]
        sess.run(train, {x: pool_x[idx], y: pool_y[idx]})
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
