"""Choices made in Python between steps, as TF1 programs write them: a learning rate fed
through a placeholder and a curriculum (the mini-batch size) chosen `--by step` (from the
global step read), `counter` (from a Python counter of its own), or `plateau` (the rate halved
when the fetched loss has not improved for 3 steps, kept in Python variables)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--by", choices=["step", "counter", "plateau"], default="step")


args, gs, x, y = _base.start(extra)
rate = v1.placeholder(tf.float32, [])
loss = _base.classifier(x, y)
train = v1.train.MomentumOptimizer(rate, 0.9).minimize(loss, global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step, i = int(sess.run(gs)), 0
    lr, best, waited = 0.1, np.inf, 0
    while step < args.steps:
        if args.by == "step":
            lr, size = 0.1 * 0.5 ** (step // 7), 4 + 4 * (step >= 10)
        elif args.by == "counter":
            lr, size = 0.1 * 0.5 ** (i // 7), 4 + 4 * (i >= 10)
        else:
            size = 8
        bx, by = _base.batch(step, size)
        _, value = sess.run([train, loss], {x: bx, y: by, rate: lr})
        if args.by == "plateau":
            if value < best - 1e-3:
                best, waited = value, 0
            else:
                waited += 1
                if waited >= 3:
                    lr, waited = lr * 0.5, 0
        i += 1
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
