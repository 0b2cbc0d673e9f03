"""A common TF1 input pipeline: a seeded, shuffled, repeated tf.data pipeline read through a
one-shot iterator, a plain Session loop that reads the global step into Python. Until s42 its
input position was in no checkpoint and the shim reported it not migratable; now the
iterator's position travels with the checkpoint (docs/tf_runtime.md, "tf.data input")."""

import time

import _base
import numpy as np
import tensorflow as tf

args = _base.parse()
rng = np.random.RandomState(7)
features = rng.standard_normal((256, _base.DIM)).astype(np.float32)
labels = rng.randint(0, _base.CLASSES, size=256).astype(np.int64)
data = tf.compat.v1.data.Dataset.from_tensor_slices((features, labels)).shuffle(256, seed=5).repeat().batch(8)
x, y = tf.compat.v1.data.make_one_shot_iterator(data).get_next()
gs = tf.compat.v1.train.get_or_create_global_step()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        _, step = sess.run([train, gs])
        if args.step_sleep:
            time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
