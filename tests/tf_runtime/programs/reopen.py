"""Hostile-ish: its own tf.train.Saver checkpoints in --workdir, a SIGTERM handler, and
at step --reopen-at it closes its session, opens a new one and restores its own checkpoint."""

import os
import signal
import time

import _base
import tensorflow as tf

args = _base.parse(lambda p: p.add_argument("--reopen-at", type=int, default=3))
signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
workdir = args.workdir or "own"
os.makedirs(workdir, exist_ok=True)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
saver = tf.compat.v1.train.Saver(max_to_keep=2)
init = tf.compat.v1.global_variables_initializer()


def session():
    sess = tf.compat.v1.Session(config=_base.config())
    latest = tf.train.latest_checkpoint(workdir)
    if latest:
        saver.restore(sess, latest)
    else:
        sess.run(init)
    return sess


sess = session()
step = sess.run(gs)
reopened = False
while step < args.steps:
    bx, by = _base.batch(step)
    sess.run(train, {x: bx, y: by})
    step = sess.run(gs)
    if step % 5 == 0:
        saver.save(sess, os.path.join(workdir, "ck"), global_step=step)
    if not reopened and step >= args.reopen_at:
        saver.save(sess, os.path.join(workdir, "ck"), global_step=step)
        sess.close()
        sess = session()
        reopened = True
    time.sleep(args.step_sleep)
_base.dump(args.dump, sess)
sess.close()
