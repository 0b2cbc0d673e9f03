"""An exponential moving average of the weights applied in a run of its own after each
training run (the step already advanced), as many TF1 programs do:
`sess.run(train); sess.run(ema_op); step = sess.run(gs)` (`--order after`), or before it
(`--order before`). A plain Session loop fed from the step it read; Momentum."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--order", default="after", choices=["after", "before"])


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
ema = v1.train.ExponentialMovingAverage(0.9)
ema_op = ema.apply(v1.trainable_variables())
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        bx, by = _base.batch(step)
        if args.order == "before":
            sess.run(ema_op)
        sess.run(train, {x: bx, y: by})
        if args.order == "after":
            sess.run(ema_op)
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
