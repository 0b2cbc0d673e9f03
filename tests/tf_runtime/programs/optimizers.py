"""Adagrad / Ftrl / Momentum-Nesterov / RMSProp with a learning-rate schedule of the global
step, a `while step < N` loop that feeds each mini-batch from the step it read."""

import _base
import tensorflow as tf


def flags(p):
    p.add_argument("--opt", default="adagrad", choices=["adagrad", "ftrl", "nesterov", "rmsprop"])
    p.add_argument("--decay", default="exponential", choices=["exponential", "piecewise"])


args = _base.parse(flags)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
if args.decay == "exponential":
    lr = tf.compat.v1.train.exponential_decay(0.1, gs, 5, 0.7, staircase=False)
else:
    lr = tf.compat.v1.train.piecewise_constant(gs, [5, 12], [0.2, 0.05, 0.01])
opt = {"adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(lr),
       "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(lr, l1_regularization_strength=0.01),
       "nesterov": lambda: tf.compat.v1.train.MomentumOptimizer(lr, 0.9, use_nesterov=True),
       "rmsprop": lambda: tf.compat.v1.train.RMSPropOptimizer(lr, momentum=0.5)}[args.opt]()
train = opt.minimize(loss, global_step=gs)
_base.plain_loop(args, train, gs, x, y)
