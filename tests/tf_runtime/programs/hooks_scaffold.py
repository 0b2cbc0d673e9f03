"""A MonitoredSession built by hand with a Scaffold and most of TensorFlow's hooks: a custom
`init_fn`, a `local_init_op`, LoggingTensorHook, NanTensorHook, StepCounterHook,
SummarySaverHook, CheckpointSaverHook (its own directory), StopAtStepHook(last_step),
FinalOpsHook; a streaming mean of the loss (`tf.compat.v1.metrics.mean`, local variables)
updated in the training run; `--custom-collection`: a trainable scale kept in a collection of
its own, not among the global variables, initialised by the Scaffold's `init_op`. Each
mini-batch fed from the global step it read."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--custom-collection", action="store_true")


args, gs, x, y = _base.start(extra)
loss = _base.classifier(x, y)
extra_vars = []
if args.custom_collection:
    scale = v1.get_variable("scale", initializer=np.float32(1.0),
                            collections=["model", v1.GraphKeys.TRAINABLE_VARIABLES])
    extra_vars.append(scale)
    loss = loss * scale + 0.01 * tf.square(scale - 2.0)
mean_loss, update_mean = v1.metrics.mean(loss)
train = tf.group(v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs), update_mean)
tf.compat.v1.summary.scalar("mean_loss", mean_loss)  # hooks run with every run, feeds or not
seeded = {}


def init_fn(scaffold, session):
    seeded["init_fn"] = True


scaffold = v1.train.Scaffold(
    init_op=tf.group(v1.global_variables_initializer(), v1.variables_initializer(extra_vars)),
    ready_op=tf.constant([], tf.string),
    local_init_op=tf.group(v1.local_variables_initializer(), v1.tables_initializer()),
    init_fn=init_fn)
work = args.workdir or "/tmp/hooks_scaffold"
hooks = [v1.train.LoggingTensorHook({"mean_loss": mean_loss, "step": gs}, every_n_iter=10),
         v1.train.NanTensorHook(mean_loss),
         v1.train.StepCounterHook(every_n_steps=10, output_dir=work),
         v1.train.SummarySaverHook(save_steps=10, output_dir=work, scaffold=scaffold),
         v1.train.CheckpointSaverHook(work, save_steps=10, scaffold=scaffold),
         v1.train.StopAtStepHook(last_step=args.steps)]
final = v1.train.FinalOpsHook([mean_loss] + v1.global_variables() + extra_vars)
creator = v1.train.ChiefSessionCreator(scaffold=scaffold, config=_base.config())
with v1.train.MonitoredSession(session_creator=creator, hooks=hooks + [final]) as sess:
    step = _base.monitored_loop(sess, args, train, gs, x, y)
if args.dump:
    names = [v.name for v in v1.global_variables() + extra_vars]
    np.savez(args.dump + ".tmp.npz", mean_loss=final.final_ops_values[0],
             **dict(zip(names, final.final_ops_values[1:])))
    import os
    os.replace(args.dump + ".tmp.npz", args.dump)
print(f"done at step {step}", flush=True)
