"""Object-based checkpoints in graph mode, as TF1 programs moving to TF2 write them: a
`tf.compat.v1.train.Checkpoint` (`--api v1`) or `tf.train.Checkpoint` saved by a `tf.train.CheckpointManager` (`v2`) of the weights,
the optimizer and the step, restored by the program at its start from the latest one in its
own directory (`--workdir`), saved there every 5 steps; the loop reads the global step."""

import os
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--api", choices=["v1", "v2"], default="v1")


args, gs, x, y = _base.start(extra)
opt = v1.train.AdamOptimizer(0.05)
train = opt.minimize(_base.classifier(x, y), global_step=gs)
w, b = v1.trainable_variables()
kind = v1.train.Checkpoint if args.api == "v1" else tf.train.Checkpoint
ckpt = kind(w=w, b=b, step=gs, optimizer=opt)
prefix = os.path.join(args.workdir, "ckpt")
manager = tf.train.CheckpointManager(ckpt, args.workdir, max_to_keep=3)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    latest = tf.train.latest_checkpoint(args.workdir)
    if latest:
        ckpt.restore(latest).run_restore_ops(sess)
    step = int(sess.run(gs))
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        if step % 5 == 0:
            if args.api == "v1":
                ckpt.save(prefix, session=sess)
            else:
                manager.save(checkpoint_number=step)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
