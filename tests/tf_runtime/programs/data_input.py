"""tf.data input as most TF1 training scripts read it: 40 examples, each with its id,
through `Dataset.from_tensor_slices` (`--source slices`) or `Dataset.range` + a `map` that
gathers the example (`range`), or `from_generator` over a Python generator (`generator`,
whose state TensorFlow cannot save), then `shuffle(40, seed=5)`, `repeat`, `batch(8)`, a
`map` and `prefetch(2)`; read through a one-shot iterator or an initializable one
(`--iterator init`: in a plain Session loop its initializer is fed the features through a
placeholder after the variables' initializer; under MonitoredTrainingSession it is in
TABLE_INITIALIZERS, which the Scaffold's local_init_op runs). The training run also adds the
ids it read, and their squares, to two int64 variables (`seen`, `seen_sq`): each mini-batch
trained exactly once leaves `seen` at 780 an epoch (5 mini-batches). The loop reads the
global step (`--loop session`), or a MonitoredTrainingSession with StopAtStepHook does."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--source", choices=["slices", "range", "generator"], default="slices")
    p.add_argument("--iterator", choices=["oneshot", "init"], default="oneshot")
    p.add_argument("--loop", choices=["session", "mts"], default="session")
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")


args = _base.parse(extra)
N = 40
rng = np.random.RandomState(7)
features = rng.standard_normal((N, _base.DIM)).astype(np.float32)
labels = rng.randint(0, _base.CLASSES, size=N).astype(np.int64)
ids = np.arange(N, dtype=np.int64)
gs = v1.train.get_or_create_global_step()
fed = args.iterator == "init" and args.loop == "session"
fx = v1.placeholder(tf.float32, [N, _base.DIM]) if fed else features
if args.source == "slices":
    ds = tf.data.Dataset.from_tensor_slices((ids, fx, labels))
elif args.source == "range":
    table, classes = tf.constant(features), tf.constant(labels)
    ds = tf.data.Dataset.range(N).map(lambda i: (i, tf.gather(table, i), tf.gather(classes, i)))
else:
    def examples():
        for i in range(N):
            yield i, features[i], labels[i]

    ds = tf.data.Dataset.from_generator(examples, output_signature=(
        tf.TensorSpec([], tf.int64), tf.TensorSpec([_base.DIM], tf.float32),
        tf.TensorSpec([], tf.int64)))
ds = ds.shuffle(N, seed=5).repeat().batch(8).map(lambda i, x, y: (i, x * 2.0, y)).prefetch(2)
if args.iterator == "oneshot":
    iterator = v1.data.make_one_shot_iterator(ds)
else:
    iterator = v1.data.make_initializable_iterator(ds)
    if args.loop == "mts":
        v1.add_to_collection(v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
batch_ids, x, y = iterator.get_next()
seen = v1.get_variable("seen", initializer=np.int64(0), trainable=False)
seen_sq = v1.get_variable("seen_sq", initializer=np.int64(0), trainable=False)
optimizer = (v1.train.MomentumOptimizer(0.05, 0.9) if args.optimizer == "momentum"
             else v1.train.AdamOptimizer(0.01))
train = tf.group(optimizer.minimize(_base.classifier(x, y), global_step=gs),
                 seen.assign_add(tf.reduce_sum(batch_ids)),
                 seen_sq.assign_add(tf.reduce_sum(batch_ids * batch_ids)))
if args.loop == "session":
    with v1.Session(config=_base.config()) as sess:
        sess.run(v1.global_variables_initializer())
        if fed:
            sess.run(iterator.initializer, {fx: features})
        _base.unfed_loop(sess, args, train, gs)
        _base.dump(args.dump, sess)
else:
    with _base.monitored_session(args) as sess:
        step = sess.run(gs)
        while not sess.should_stop():
            sess.run(train)
            if not sess.should_stop():
                step = sess.run(gs)
            time.sleep(args.step_sleep)
