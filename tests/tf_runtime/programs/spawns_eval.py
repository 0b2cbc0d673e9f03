"""A plain Session loop that saves its own checkpoint every few steps and evaluates it in a
separate Python process (`subprocess.run([sys.executable, ...])`, which closes the parent's
other file descriptors), as training scripts that hand evaluation to a script of their own
do. The evaluator imports TensorFlow, builds the model and restores the checkpoint; it
never trains. Momentum; each mini-batch fed from the global step it read."""

import os
import subprocess
import sys
import time

import _base
import tensorflow as tf

EVALUATE = """
import sys
import _base
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
x, y = _base.inputs()
loss = _base.classifier(x, y)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    tf.compat.v1.train.Saver().restore(sess, sys.argv[1])
    bx, by = _base.batch(10**6, 32)
    print(f"held-out loss {sess.run(loss, {x: bx, y: by}):.4f}", flush=True)
"""


def extra(p):
    p.add_argument("--eval-every", type=int, default=10)


args = _base.parse(extra)
workdir = args.workdir or "."
os.makedirs(os.path.join(workdir, "own"), exist_ok=True)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH"), here) if p))
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        if step % args.eval_every == 0:
            path = saver.save(sess, os.path.join(workdir, "own", "model"), global_step=step)
            subprocess.run([sys.executable, "-c", EVALUATE, path], env=env, check=True)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
