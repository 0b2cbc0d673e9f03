"""The training op run from two places (probed s46): a warm-up of `--warmup` steps counted
in Python (`for i in range(warmup)`, the learning rate fed rising linearly), then the main
loop on the step read (`while step < steps`), mini-batches picked by the step in both.
Not migratable (a restarted copy runs the warm-up again on top of the restored weights);
before s46 refused with "the program never reads the global step", which it does in every
step of its main loop."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--warmup", type=int, default=6)


args, gs, x, y = _base.start(extra)
lr = v1.placeholder(tf.float32, [])
train = v1.train.MomentumOptimizer(lr, 0.9).minimize(_base.classifier(x, y), global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    for i in range(args.warmup):
        bx, by = _base.batch(i)
        sess.run(train, {x: bx, y: by, lr: 0.05 * (i + 1) / args.warmup})
        time.sleep(args.step_sleep)
    while (step := int(sess.run(gs))) < args.steps:
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by, lr: 0.05})
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
