"""A MonitoredTrainingSession (or a SingularMonitoredSession) that stops after a number of
steps counted from where it started: `StopAtStepHook(num_steps=N)`, not `last_step`. Adagrad;
each mini-batch fed from the global step it read."""

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--session", choices=["mts", "singular"], default="mts")


args = _base.parse(extra)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
hooks = [tf.compat.v1.train.StopAtStepHook(num_steps=args.steps), _base.DumpAtEnd(args.dump)]
if args.session == "mts":
    sess = tf.compat.v1.train.MonitoredTrainingSession(
        hooks=hooks, config=_base.config(), save_checkpoint_secs=None,
        save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None)
else:
    sess = tf.compat.v1.train.SingularMonitoredSession(hooks=hooks, config=_base.config())
with sess:
    step = _base.monitored_loop(sess, args, train, gs, x, y)
print(f"done at step {step}", flush=True)
