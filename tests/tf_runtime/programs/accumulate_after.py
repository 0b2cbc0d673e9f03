"""Gradient accumulation as many TF1 programs write it: each micro-batch's gradients added
into non-trainable accumulators in a run of its own, a Python counter applying their mean
every K micro-batches with `apply_gradients(..., global_step=gs)`, and the accumulators
zeroed in a run of their own right after the apply (`acc.assign(tf.zeros_like(acc))`;
`--zero mul`: `acc.assign(acc * 0.0)`; `--zero init`: their initialiser run again,
`variables_initializer(accs)`)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
K = 3


def extra(p):
    p.add_argument("--zero", choices=["zeros", "mul", "init"], default="zeros")


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
params = v1.trainable_variables()
accs = [v1.get_variable(p.op.name + "/acc", initializer=np.zeros(p.shape, np.float32),
                        trainable=False) for p in params]
grads = tf.gradients(loss, params)
accumulate = tf.group(*[a.assign_add(g) for a, g in zip(accs, grads)])
apply = v1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(
    [(a / K, p) for a, p in zip(accs, params)], global_step=gs)
if args.zero == "init":
    zero = v1.variables_initializer(accs)
else:
    zero = tf.group(*[a.assign(tf.zeros_like(a) if args.zero == "zeros" else a * 0.0)
                      for a in accs])
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step, micro = int(sess.run(gs)), 0
    while step < args.steps:
        bx, by = _base.batch(step * K + micro)
        sess.run(accumulate, {x: bx, y: by})
        micro += 1
        if micro == K:
            sess.run(apply)
            sess.run(zero)
            micro = 0
            step = int(sess.run(gs))
            time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
