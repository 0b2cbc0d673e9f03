"""Input staged one step ahead in a `StagingArea` (tf.contrib.staging's, as tf_cnn_benchmarks
and the TF1 performance guide wrote it): a warm-up run puts the first batch, then every
training run takes the staged batch (`area.get()`) and puts the next one in the same run.
`--source iterator`: the batches come from a one-shot tf.data iterator (shuffled with a
seed, repeated); `--source feed`: from Python, the batch of the step after the one read
fed to each run (the warm-up stages the step read's). The training run sums the ids it
read into `seen`."""

import time

import _base
import numpy as np
import tensorflow as tf
from tensorflow.python.ops.data_flow_ops import StagingArea

v1 = tf.compat.v1
args = _base.parse(lambda p: p.add_argument("--source", default="iterator",
                                            choices=["iterator", "feed"]))
N = 40
features, labels = _base.examples(N)
if args.source == "iterator":
    ds = tf.data.Dataset.from_tensor_slices(
        (np.arange(N, dtype=np.int64), features, labels)).shuffle(N, seed=5).repeat().batch(8)
    staged = v1.data.make_one_shot_iterator(ds).get_next()
else:
    staged = (v1.placeholder(tf.int64, [8]), v1.placeholder(tf.float32, [8, _base.DIM]),
              v1.placeholder(tf.int64, [8]))
area = StagingArea(dtypes=[tf.int64, tf.float32, tf.int64],
                   shapes=[[8], [8, _base.DIM], [8]])
stage = area.put(list(staged))
ids, x, y = area.get()
gs, loss, train = _base.counted_training(ids, x, y)


def feed(step):
    if args.source == "iterator":
        return None
    i = (np.arange(8) + 8 * int(step)) % N
    return dict(zip(staged, (i.astype(np.int64), features[i], labels[i])))


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    sess.run(stage, feed(step))  # warm-up: the first batch staged
    while step < args.steps:
        sess.run([train, stage], feed(step + 1))
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
