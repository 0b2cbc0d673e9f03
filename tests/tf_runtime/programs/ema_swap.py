"""An exponential moving average of the weights (`ExponentialMovingAverage.apply` under the
training op's control dependencies) evaluated every `--eval-every` steps the way many TF1
programs do: the weights are backed up into non-trainable variables and the shadows swapped
in (`--swap assign`: `w.assign(ema.average(w))` after `backup.assign(w)`; `--swap load`:
the shadows fetched as arrays and loaded with `Variable.load`), a held-out batch evaluated
in a few runs, then the backup assigned back. A plain Session loop fed from the step it
read; Momentum."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-runs", type=int, default=3)
    p.add_argument("--swap", choices=["assign", "load"], default="assign")


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
weights = v1.trainable_variables()
opt_op = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
ema = v1.train.ExponentialMovingAverage(0.8)
with tf.control_dependencies([opt_op]):
    train = ema.apply(weights)
backups = [v1.get_variable(w.op.name.replace("/", "_") + "_backup", initializer=tf.zeros_like(w.initial_value),
                           trainable=False) for w in weights]
with tf.control_dependencies([b.assign(w) for b, w in zip(backups, weights)]):
    to_average = tf.group(*[w.assign(ema.average(w)) for w in weights])
to_weights = tf.group(*[w.assign(b) for b, w in zip(backups, weights)])
shadows = [ema.average(w) for w in weights]
hx, hy = _base.batch(10_000, 32)


def evaluate(sess):
    if args.swap == "assign":
        sess.run(to_average)
    else:
        saved = sess.run(weights)
        for w, value in zip(weights, sess.run(shadows)):
            w.load(value, sess)
    for _ in range(args.eval_runs):
        sess.run(loss, {x: hx, y: hy})
        time.sleep(args.step_sleep)
    if args.swap == "assign":
        sess.run(to_weights)
    else:
        for w, value in zip(weights, saved):
            w.load(value, sess)


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by})
        step = int(sess.run(gs))
        if step % args.eval_every == 0:
            evaluate(sess)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
