"""Mixed precision written by hand: the model computes in float16 from float16 copies of
float32 master weights, the loss scaled by a dynamic loss scale kept in variables, a state
machine: a step whose float16 gradients are not all finite is skipped (no apply, the scale
halved, `overflows` incremented, a bool variable `last_overflowed` set), and after 3 good
steps in a row (an int64 counter) the scale doubles; a string variable records the last
event ("grew", "skipped", "ok"). The masters are updated by Momentum's `apply_gradients`
of the unscaled float32 gradients inside the `tf.cond`. The float16 copies are refreshed from the masters in the
training run (`--copy train`) or in a run of their own after it (`--copy apart`). The scale
starts at 2**20, so the first steps overflow. Each mini-batch fed from the step read."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--copy", default="apart", choices=["train", "apart"])


args, gs, x, y = _base.start(extra)
rng = np.random.RandomState(3)
masters = [v1.get_variable("master/w1", initializer=rng.standard_normal((_base.DIM, 16)).astype(np.float32) * 0.3),
           v1.get_variable("master/w2", initializer=rng.standard_normal((16, _base.CLASSES)).astype(np.float32) * 0.3)]
halves = [v1.get_variable(f"half/w{i + 1}", initializer=tf.cast(m.initial_value, tf.float16), trainable=False)
          for i, m in enumerate(masters)]
scale = v1.get_variable("loss_scale/scale", initializer=np.float32(2.0 ** 20), trainable=False)
good = v1.get_variable("loss_scale/good_steps", initializer=np.int64(0), trainable=False)
overflows = v1.get_variable("loss_scale/overflows", initializer=np.int32(0), trainable=False)
last_overflowed = v1.get_variable("loss_scale/last_overflowed", initializer=False, trainable=False)
event = tf.Variable("start", name="loss_scale/event", trainable=False)
h = tf.nn.relu(tf.matmul(tf.cast(x, tf.float16), halves[0]))
logits = tf.matmul(h, halves[1])
loss16 = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
loss = tf.cast(loss16, tf.float32)
grads16 = tf.gradients(loss16 * tf.cast(scale, tf.float16), halves)
grads = [tf.cast(g, tf.float32) / scale for g in grads16]
finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
opt = v1.train.MomentumOptimizer(0.05, 0.9)


def on_good():
    with tf.control_dependencies([opt.apply_gradients(list(zip(grads, masters)))]):
        grow = tf.equal(good + 1, 3)
        return tf.group(
            scale.assign(tf.where(grow, scale * 2.0, scale)),
            good.assign(tf.where(grow, tf.constant(0, tf.int64), good + 1)),
            last_overflowed.assign(False),
            event.assign(tf.where(grow, "grew", "ok")))


def on_overflow():
    return tf.group(scale.assign(scale * 0.5), good.assign(0), overflows.assign_add(1),
                    last_overflowed.assign(True), event.assign("skipped"))


def refresh():
    return tf.group(*[hv.assign(tf.cast(m, tf.float16)) for hv, m in zip(halves, masters)])


with tf.control_dependencies([tf.cond(finite, on_good, on_overflow)]):
    train = gs.assign_add(1)
if args.copy == "train":
    with tf.control_dependencies([train]):
        train = tf.group(refresh(), train)
else:
    copy = refresh()
_base.plain_loop(args, train, gs, x, y,
                 after=(lambda sess, feed: sess.run(copy)) if args.copy == "apart" else None)
