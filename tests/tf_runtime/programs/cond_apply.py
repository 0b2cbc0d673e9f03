"""An update applied inside a `tf.cond`: TensorFlow's own dynamic loss scaling
(`MixedPrecisionLossScaleOptimizer`, which skips a step whose gradients are not finite and
keeps its scale and its count of good steps in variables), or `--skip manual`: the same
written by hand, the optimizer's update (and the global step's increment) in the branch taken
when the loss is finite. TensorFlow 2's functional control flow by default (`If` ops whose
branches are functions); `--control-flow v1` builds Switch/Merge with reference variables.
Each mini-batch fed from the global step it read."""

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--skip", choices=["lossscale", "manual"], default="lossscale")
    p.add_argument("--control-flow", choices=["v1", "v2"], default="v2")


args = _base.parse(extra)
if args.control_flow == "v1":
    tf.compat.v1.disable_control_flow_v2()
    tf.compat.v1.disable_resource_variables()
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
momentum = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
if args.skip == "lossscale":
    opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        momentum, loss_scale=tf.compat.v1.mixed_precision.DynamicLossScale(
            initial_loss_scale=2.0 ** 10, increment_period=4))
    train = opt.minimize(loss, global_step=gs)
else:
    params = tf.compat.v1.trainable_variables()
    grads = tf.gradients(loss, params)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    skipped = tf.compat.v1.get_variable("skipped", initializer=0, trainable=False)

    def apply():
        with tf.control_dependencies([momentum.apply_gradients(zip(grads, params),
                                                               global_step=gs)]):
            return tf.constant(True)

    def skip():
        with tf.control_dependencies([skipped.assign_add(1)]):
            return tf.constant(False)

    train = tf.cond(finite, apply, skip)
_base.plain_loop(args, train, gs, x, y)
