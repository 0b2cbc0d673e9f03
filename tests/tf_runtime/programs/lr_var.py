"""The learning rate kept in a non-trainable variable and halved by the program in a run of
its own at the top of its loop every 5 steps (`if step % 5 == 0 and step:
sess.run(lr.assign(lr * 0.5))`, before that step's training run), each mini-batch fed from
the step read. `--loop session|mts`, `--optimizer momentum|adam`."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--loop", choices=["session", "mts"], default="session")
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")


args, gs, x, y = _base.start(extra)
lr = v1.get_variable("lr", initializer=0.1, trainable=False)
decay = lr.assign(lr * 0.5)
opt = (v1.train.MomentumOptimizer(lr, 0.9) if args.optimizer == "momentum"
       else v1.train.AdamOptimizer(lr * 0.2))
train = opt.minimize(_base.classifier(x, y), global_step=gs)


def loop(sess, stop) -> None:
    step = int(sess.run(gs))
    while not stop(step):
        if step % 5 == 0 and step:
            sess.run(decay)
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by})
        if stop(step + 1):
            break
        step = int(sess.run(gs))
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
