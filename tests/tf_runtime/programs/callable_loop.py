"""A plain Session loop that trains through `Session.make_callable` instead of `run`: its
input is computed in the graph from the global step (stateless random ops seeded by it),
its training step is a callable without feeds (`--form list`: `[train, loss]`; `op`: the
train op alone; `options`: a callable that takes RunOptions) and it reads the step through
a callable of its own. Momentum with Nesterov, so the slots must travel too."""

import time

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--form", choices=["list", "op", "options"], default="list")


args = _base.parse(extra)
gs = tf.compat.v1.train.get_or_create_global_step()
seed = tf.stack([tf.cast(gs, tf.int32), 7])
x = tf.random.stateless_normal([8, _base.DIM], seed=seed)
y = tf.random.stateless_uniform([8], seed=seed + 1, minval=0, maxval=_base.CLASSES,
                                dtype=tf.int64)
loss = _base.classifier(x, y)
opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True)
train = opt.minimize(loss, global_step=gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    read_step = sess.make_callable(gs)
    if args.form == "list":
        step_fn = sess.make_callable([train, loss])
    elif args.form == "op":
        step_fn = sess.make_callable(train)
    else:
        with_options = sess.make_callable([train, loss], accept_options=True)
        opts = tf.compat.v1.RunOptions(report_tensor_allocations_upon_oom=True)

        def step_fn():
            return with_options(options=opts)
    step = read_step()
    while step < args.steps:
        step_fn()
        step = read_step()
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
