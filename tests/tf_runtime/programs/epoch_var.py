"""An epoch counter kept in a non-trainable variable of the graph, as programs that resume
from their own checkpoints keep it (`epoch = tf.Variable(0, trainable=False)`), incremented
by the program with `tf.compat.v1.assign_add` in a run of its own once an epoch, after the
epoch's last training run; each epoch's examples are ordered by a permutation seeded by the
epoch the program reads from that variable. `--loop session|mts`, `--optimizer
momentum|adam`, `--epoch-steps E`."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
EXAMPLES = 24


def extra(p):
    p.add_argument("--loop", choices=["session", "mts"], default="session")
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")
    p.add_argument("--epoch-steps", type=int, default=4)


def mini_batch(epoch: int, i: int, n: int = 6):
    """The i-th mini-batch of an epoch: a slice of the examples in the epoch's order."""
    xs, ys = _base.batch(0, EXAMPLES)
    order = np.random.RandomState(epoch).permutation(EXAMPLES)
    pick = order[(i * n) % EXAMPLES:][:n]
    return xs[pick], ys[pick]


args, gs, x, y = _base.start(extra)
epoch = v1.Variable(0, trainable=False, name="epoch", dtype=tf.int64)
next_epoch = v1.assign_add(epoch, 1)
opt = (v1.train.MomentumOptimizer(0.05, 0.9) if args.optimizer == "momentum"
       else v1.train.AdamOptimizer(0.02))
train = opt.minimize(_base.classifier(x, y), global_step=gs)


def loop(sess, stop) -> None:
    step = int(sess.run(gs))
    while not stop(step):
        bx, by = mini_batch(int(sess.run(epoch)), step % args.epoch_steps)
        sess.run(train, {x: bx, y: by})
        if stop(step + 1):
            break
        step = int(sess.run(gs))
        if step % args.epoch_steps == 0:
            sess.run(next_epoch)
        time.sleep(args.step_sleep)


if args.loop == "session":
    with v1.Session(config=_base.config()) as sess:
        sess.run(v1.global_variables_initializer())
        loop(sess, lambda step: step >= args.steps)
        _base.dump(args.dump, sess)
else:
    hooks = [v1.train.StopAtStepHook(last_step=args.steps), _base.DumpAtEnd(args.dump)]
    with v1.train.MonitoredTrainingSession(
            hooks=hooks, config=_base.config(), save_checkpoint_secs=None,
            save_summaries_steps=None, save_summaries_secs=None,
            log_step_count_steps=None) as sess:
        loop(sess, lambda step: sess.should_stop())
