"""A reinitializable tf.data iterator (`Iterator.from_structure`) shared by a training and an
evaluation dataset, as TF1 tutorials wrote it: the training set (40 examples with their ids,
shuffled with a seed, no repeat) ends an epoch with `OutOfRangeError`; the program then
initialises the iterator on the evaluation set, evaluates all of it, and initialises it on
the training set again. The loop reads the global step; the training run sums the ids it
read into `seen` (780 an epoch)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
args = _base.parse()
rng = np.random.RandomState(7)
N = 40
features = rng.standard_normal((N, _base.DIM)).astype(np.float32)
labels = rng.randint(0, _base.CLASSES, size=N).astype(np.int64)
train_ds = tf.data.Dataset.from_tensor_slices(
    (np.arange(N, dtype=np.int64), features, labels)).shuffle(N, seed=5).batch(8)
val_ds = tf.data.Dataset.from_tensor_slices(
    (np.zeros(12, np.int64), features[:12] + 0.5, labels[:12])).batch(4)
iterator = v1.data.Iterator.from_structure(v1.data.get_output_types(train_ds),
                                           v1.data.get_output_shapes(train_ds))
train_init, val_init = iterator.make_initializer(train_ds), iterator.make_initializer(val_ds)
ids, x, y = iterator.get_next()
gs, loss, train = _base.counted_training(ids, x, y)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    sess.run(train_init)
    while step < args.steps:
        try:
            sess.run(train)
        except tf.errors.OutOfRangeError:
            sess.run(val_init)
            total = 0.0
            while True:
                try:
                    total += sess.run(loss)
                except tf.errors.OutOfRangeError:
                    break
            print(f"step {step}: evaluation loss {total:.6f}", flush=True)
            sess.run(train_init)
            continue
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
