"""A `tf.compat.v1.train.MonitoredSession` driven by hooks of the user's own, as TF1
input/training utilities did: a FeedHook whose `before_run` returns
`SessionRunArgs(fetches=..., feed_dict=...)` (the mini-batch of the step it read in
`after_create_session`, counted on in `after_run`), a LossStopHook that calls
`run_context.request_stop()` once the fetched loss is below --threshold (a data-dependent
end), with TensorFlow's StopAtStepHook(last_step), NanTensorHook and
CheckpointSaverHook(save_steps=...) into the program's own directory. The loop is only
`while not sess.should_stop(): sess.run(train_op)`. RMSProp."""
import argparse
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--threshold", type=float, default=0.02)
p.add_argument("--ckpt-dir", default="/tmp/user_hooks_ckpt")
p.add_argument("--save-steps", type=int, default=7)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--dump", default=None)
args = p.parse_args()

tf.compat.v1.disable_eager_execution()
tf.config.experimental.enable_op_determinism()

data = np.random.RandomState(2)
X = data.standard_normal((600, 10)).astype(np.float32)
W = data.standard_normal((10, 2)).astype(np.float32)
T = np.tanh(X @ W)

x = tf.compat.v1.placeholder(tf.float32, [None, 10])
t = tf.compat.v1.placeholder(tf.float32, [None, 2])
init = tf.compat.v1.glorot_uniform_initializer(seed=5)
w1 = tf.compat.v1.get_variable("w1", [10, 48], initializer=init)
b1 = tf.compat.v1.get_variable("b1", [48], initializer=tf.zeros_initializer())
w2 = tf.compat.v1.get_variable("w2", [48, 2], initializer=init)
loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) - t))
gs = tf.compat.v1.train.get_or_create_global_step()
train_op = tf.compat.v1.train.RMSPropOptimizer(0.003).minimize(loss, global_step=gs)


class FeedHook(tf.compat.v1.train.SessionRunHook):
    """Feeds the mini-batch of the step: read once when the session is made, then counted."""

    def after_create_session(self, session, coord):
        self.step = session.run(gs)

    def before_run(self, run_context):
        idx = np.random.RandomState(self.step).randint(0, 600, 24)
        return tf.compat.v1.train.SessionRunArgs({"loss": loss}, feed_dict={x: X[idx], t: T[idx]})

    def after_run(self, run_context, run_values):
        self.step += 1
        self.loss = run_values.results["loss"]


class LossStopHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, feed):
        self.feed = feed

    def after_run(self, run_context, run_values):
        if self.feed.loss < args.threshold:
            print(f"loss {self.feed.loss:.5f} below {args.threshold} at step {self.feed.step}",
                  flush=True)
            run_context.request_stop()


feed = FeedHook()
hooks = [feed, LossStopHook(feed), tf.compat.v1.train.StopAtStepHook(last_step=args.steps),
         tf.compat.v1.train.NanTensorHook(loss),
         tf.compat.v1.train.CheckpointSaverHook(args.ckpt_dir, save_steps=args.save_steps)]
with tf.compat.v1.train.MonitoredSession(
        session_creator=tf.compat.v1.train.ChiefSessionCreator(), hooks=hooks) as sess:
    while not sess.should_stop():
        sess.run(train_op)
        time.sleep(args.step_sleep)
    if args.dump:
        vs = tf.compat.v1.global_variables()
        raw = sess._tf_sess()
        np.savez(args.dump, **{v.name: a for v, a in zip(vs, raw.run(vs))})
