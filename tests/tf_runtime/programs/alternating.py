"""Two training ops taking turns, as TF1 programs write it: `--choose counter` by the parity
of a Python counter (`i % 2`), `step` by the parity of the global step it reads, `random` by
a draw from Python's `random` seeded once. `--steps-of shared`: both optimizers advance the
global step; `own`: only the first does, the second keeps a step counter of its own.
`--order b_first`: the second op's call comes first in the loop's code."""

import random
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--choose", choices=["counter", "step", "random"], default="counter")
    p.add_argument("--steps-of", choices=["shared", "own"], default="shared")
    p.add_argument("--order", choices=["a_first", "b_first"], default="a_first")


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
params = v1.trainable_variables()
b_step = v1.Variable(0, trainable=False, name="b_step", dtype=tf.int64)
train_a = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs, var_list=params[:1])
train_b = v1.train.AdamOptimizer(0.02).minimize(
    loss, global_step=gs if args.steps_of == "shared" else b_step, var_list=params[1:])
random.seed(4)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step, i = int(sess.run(gs)), 0
    while step < args.steps:
        if args.choose == "counter":
            second = i % 2 == 1
        elif args.choose == "step":
            second = step % 2 == 1
        else:
            second = random.random() < 0.5
        bx, by = _base.batch(step * 2 + int(second))
        feed = {x: bx, y: by}
        if args.order == "b_first":
            if second:
                sess.run(train_b, feed)
            else:
                sess.run(train_a, feed)
        elif not second:
            sess.run(train_a, feed)
        else:
            sess.run(train_b, feed)
        i += 1
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
