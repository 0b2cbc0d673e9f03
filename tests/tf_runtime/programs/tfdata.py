"""A tf.data pipeline (seeded shuffle, repeat, batch) feeding the training run."""

import time

import _base
import tensorflow as tf

args = _base.parse(lambda p: p.add_argument("--iterator", default="one_shot",
                                            choices=["one_shot", "initializable"]))
gs = tf.compat.v1.train.get_or_create_global_step()
bx, by = _base.batch(0, 64)
ds = tf.data.Dataset.from_tensor_slices((bx, by)).shuffle(64, seed=3).repeat().batch(8)
if args.iterator == "one_shot":
    it = tf.compat.v1.data.make_one_shot_iterator(ds)
else:
    it = tf.compat.v1.data.make_initializable_iterator(ds)
x, y = it.get_next()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    if args.iterator == "initializable":
        sess.run(it.initializer)
    step = sess.run(gs)
    while step < args.steps:
        sess.run(train)
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
