"""A loop that clips each gradient by value (`tf.clip_by_value`) and checks the loss and the
gradients with `tf.debugging.check_numerics`, traces its training run every 3 steps
(`options=RunOptions(trace_level=FULL_TRACE)`, `run_metadata`), and writes a summary every
step with a `FileWriter` (`add_summary(s, step)`, `add_run_metadata` for the traced steps,
`flush` each step) into `--workdir`, each mini-batch fed from the step read. `--loop
session|mts`, `--optimizer momentum|adam`. `--keep N` (plain Session loop): its own
`Saver(max_to_keep=N)` saves every 3 steps into `--workdir` too (TensorFlow deletes all but
the last N and lists them in the directory's `checkpoint` file)."""

import os
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1
TRACE_EVERY = 3


def extra(p):
    p.add_argument("--loop", choices=["session", "mts"], default="session")
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")
    p.add_argument("--keep", type=int, default=0)


args, gs, x, y = _base.start(extra)
loss = tf.debugging.check_numerics(_base.classifier(x, y), "loss")
opt = (v1.train.MomentumOptimizer(0.05, 0.9) if args.optimizer == "momentum"
       else v1.train.AdamOptimizer(0.02))
pairs = [(tf.debugging.check_numerics(tf.clip_by_value(g, -0.05, 0.05), f"grad {v.op.name}"), v)
         for g, v in opt.compute_gradients(loss)]
train = opt.apply_gradients(pairs, global_step=gs)
summary = v1.summary.merge([v1.summary.scalar("loss", loss),
                            v1.summary.histogram("w", v1.trainable_variables()[0])])


def loop(sess, stop, writer, saver=None) -> None:
    step = int(sess.run(gs))
    while not stop(step):
        bx, by = _base.batch(step)
        if step % TRACE_EVERY == 0:
            meta = v1.RunMetadata()
            _, s = sess.run([train, summary], {x: bx, y: by},
                            options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
                            run_metadata=meta)
            writer.add_run_metadata(meta, f"step{step}", step)
        else:
            _, s = sess.run([train, summary], {x: bx, y: by})
        writer.add_summary(s, step)
        writer.flush()
        if saver is not None and (step + 1) % 3 == 0:
            saver.save(sess, os.path.join(args.workdir, "model.ckpt"), global_step=step + 1)
        if stop(step + 1):
            break
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)


writer = v1.summary.FileWriter(args.workdir, filename_suffix=f".{os.getpid()}")
if args.loop == "session":
    with v1.Session(config=_base.config()) as sess:
        sess.run(v1.global_variables_initializer())
        saver = v1.train.Saver(max_to_keep=args.keep) if args.keep else None
        loop(sess, lambda step: step >= args.steps, writer, saver)
        _base.dump(args.dump, sess)
else:
    with _base.monitored_session(args) as sess:
        loop(sess, lambda step: sess.should_stop(), writer)
writer.close()
