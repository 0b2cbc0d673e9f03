"""tf.data as TF1 programs wrote it before one-shot iterators: an initializable iterator over
a shuffled (seeded, reshuffled each epoch) dataset of placeholders, re-initialised by the
program at each epoch (`OutOfRangeError` ends one), the epoch counted in Python. The
iterator's position travels with the checkpoint since s42, put back after the program's
initializer run (fed the same features)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
args = _base.parse()
rng = np.random.RandomState(7)
features = rng.standard_normal((40, _base.DIM)).astype(np.float32)
labels = rng.randint(0, _base.CLASSES, size=40).astype(np.int64)
fx = v1.placeholder(tf.float32, [None, _base.DIM])
fy = v1.placeholder(tf.int64, [None])
data = tf.data.Dataset.from_tensor_slices((fx, fy)).shuffle(40, seed=5).batch(8)
iterator = v1.data.make_initializable_iterator(data)
x, y = iterator.get_next()
gs = v1.train.get_or_create_global_step()
train = v1.train.AdamOptimizer(0.01).minimize(_base.classifier(x, y), global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step, epoch = sess.run(gs), 0
    sess.run(iterator.initializer, {fx: features, fy: labels})
    while step < args.steps:
        try:
            sess.run(train)
        except tf.errors.OutOfRangeError:
            epoch += 1
            sess.run(iterator.initializer, {fx: features, fy: labels})
            continue
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
