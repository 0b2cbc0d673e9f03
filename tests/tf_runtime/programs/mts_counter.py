"""A MonitoredTrainingSession loop whose StopAtStepHook (and CheckpointSaverHook, with
`--workdir`) read the global step while the program picks each mini-batch by a counter of
its own (`--feed counter`: `i = 0; while not sess.should_stop(): ...; i += 1`), or by the
step it reads itself before each run (`--feed step`)."""

import time

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--feed", choices=["counter", "step"], default="counter")


args, gs, x, y = _base.start(extra)
train = tf.compat.v1.train.AdamOptimizer(0.05).minimize(_base.classifier(x, y), global_step=gs)
hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps), _base.DumpAtEnd(args.dump)]
with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=args.workdir, hooks=hooks, config=_base.config(),
        save_checkpoint_steps=1000 if args.workdir else None, save_checkpoint_secs=None,
        save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None) as sess:
    i = 0
    while not sess.should_stop():
        if args.feed == "step":
            i = int(sess.run(gs))
        bx, by = _base.batch(i)
        sess.run(train, {x: bx, y: by})
        i += 1
        time.sleep(args.step_sleep)
