"""The loop most TF1 tutorials write: `for i in range(steps)`, each mini-batch picked by
the Python counter `i`, the global step fetched with the training op only to log it.
`--start step`: the loop starts from the global step it read (`range(start, steps)`)."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--start", choices=["zero", "step"], default="zero")


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    start = sess.run(gs) if args.start == "step" else 0
    for i in range(start, args.steps):
        bx, by = _base.batch(i)
        _, loss_value, step = sess.run([train, loss, gs], {x: bx, y: by})
        if step % 10 == 0:
            print(f"step {step} loss {loss_value:.4f}", flush=True)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
