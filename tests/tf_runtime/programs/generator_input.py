"""tf.data input as TF1 programs write it beyond a plain shuffle: `--source generator`
(`Dataset.from_generator` over a Python generator that keeps its own position), `cache`
(`.cache(filename)` on disk, then `.repeat()`), `interleave` (a parallel `interleave` and
`map` with `deterministic=False`), each `.prefetch(2)`, a one-shot iterator feeding the
training run; the loop reads the global step."""

import os

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--source", choices=["generator", "cache", "interleave"], default="generator")


args = _base.parse(extra)
gs = v1.train.get_or_create_global_step()


def examples():
    i = 0
    while True:
        bx, by = _base.batch(i)
        yield bx, by
        i += 1


sig = (tf.TensorSpec([8, _base.DIM], tf.float32), tf.TensorSpec([8], tf.int64))
if args.source == "generator":
    ds = tf.data.Dataset.from_generator(examples, output_signature=sig)
else:
    pool = [_base.batch(i) for i in range(16)]
    ds = tf.data.Dataset.from_tensor_slices((np.stack([b[0] for b in pool]),
                                             np.stack([b[1] for b in pool])))
    if args.source == "cache":
        path = os.path.join(args.workdir or "/tmp", "cache")
        ds = ds.map(lambda a, b: (a * 2.0, b)).cache(path).repeat()
    else:
        ds = tf.data.Dataset.range(4).interleave(
            lambda k: ds.shard(4, k), cycle_length=4, num_parallel_calls=4,
            deterministic=False).map(lambda a, b: (a + 1.0, b), num_parallel_calls=2,
                                     deterministic=False).repeat()
x, y = v1.data.make_one_shot_iterator(ds.prefetch(2)).get_next()
train = v1.train.AdamOptimizer(0.05).minimize(_base.classifier(x, y), global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    _base.unfed_loop(sess, args, train, gs)
    _base.dump(args.dump, sess)
