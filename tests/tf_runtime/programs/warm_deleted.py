"""Fine-tuning from a pre-trained backbone fetched once and deleted after loading: on its
first launch the program "downloads" the backbone's checkpoint into `--workdir` (writes it
with a Saver of a graph of its own) and leaves a `downloaded` marker; every launch warm-starts
with `init_from_checkpoint`, then, once its variables are initialised, deletes the checkpoint
to free the space (`--cleanup keep`: leaves it). The backbone and a new head are trained by
Momentum, fed from the step read."""

import os
import shutil

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--cleanup", choices=["rm", "keep"], default="rm")


args, gs, x, y = _base.start(extra)
pretrained = os.path.join(args.workdir, "pretrained")
marker = os.path.join(args.workdir, "downloaded")
os.makedirs(args.workdir, exist_ok=True)
if not os.path.exists(marker):  # the download, once
    with tf.Graph().as_default():
        bb = v1.get_variable("backbone/w", initializer=np.random.RandomState(9).standard_normal(
            (_base.DIM, 8)).astype(np.float32) * 0.3)
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            v1.train.Saver([bb]).save(s, os.path.join(pretrained, "model"))
    open(marker, "w").close()
with v1.variable_scope("backbone"):
    w = v1.get_variable("w", (_base.DIM, 8))
with v1.variable_scope("head"):
    h = v1.get_variable("h", initializer=np.zeros((8, _base.CLASSES), np.float32))
v1.train.init_from_checkpoint(pretrained, {"backbone/": "backbone/"})
logits = tf.matmul(tf.nn.relu(tf.matmul(x, w)), h)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)


def cleanup(sess):
    if args.cleanup == "rm":
        shutil.rmtree(pretrained, ignore_errors=True)


_base.plain_loop(args, train, gs, x, y, after_init=cleanup)
