"""A plain Session loop with a moving average of the weights (ExponentialMovingAverage,
its shadow variables applied after each update), gradients clipped by their global norm,
summaries merged and fetched in the training run and written by a FileWriter, and a
Saver of its own every few steps; each mini-batch fed from the global step it read."""

import os
import time

import _base
import tensorflow as tf

args = _base.parse()
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
params = tf.compat.v1.trainable_variables()
grads, norm = tf.clip_by_global_norm(tf.gradients(loss, params), 0.5)
opt = tf.compat.v1.train.AdamOptimizer(0.05)
update = opt.apply_gradients(zip(grads, params), global_step=gs)
ema = tf.compat.v1.train.ExponentialMovingAverage(0.9, num_updates=gs)
with tf.control_dependencies([update]):
    train = ema.apply(params)
tf.compat.v1.summary.scalar("loss", loss)
tf.compat.v1.summary.scalar("grad_norm", norm)
merged = tf.compat.v1.summary.merge_all()
saver = tf.compat.v1.train.Saver(max_to_keep=2)
workdir = args.workdir or "."
os.makedirs(workdir, exist_ok=True)
writer = tf.compat.v1.summary.FileWriter(os.path.join(workdir, "events"))
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        bx, by = _base.batch(step)
        _, summary = sess.run([train, merged], {x: bx, y: by})
        writer.add_summary(summary, step)
        step = sess.run(gs)
        if step % 10 == 0:
            saver.save(sess, os.path.join(workdir, "own", "model"), global_step=step)
        time.sleep(args.step_sleep)
    writer.close()
    _base.dump(args.dump, sess)
