"""TF1 as old programs run on TensorFlow 2: `import tensorflow.compat.v1 as tf` and
`tf.disable_v2_behavior()` (reference variables, v1 control flow), several updates per
session run in a `tf.while_loop` (as programs with `iterations_per_loop` do), each
iteration's input computed in the graph from the global step by stateless random ops.
`--control-flow v2` builds the loop as a functional While op instead."""

import _base
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()


def extra(p):
    p.add_argument("--per-run", type=int, default=3)
    p.add_argument("--control-flow", choices=["v1", "v2"], default="v1")
    p.add_argument("--opt", choices=["momentum", "sgd", "adam"], default="momentum")


args = _base.parse(extra)
if args.control_flow == "v2":
    tf.enable_control_flow_v2()
    tf.enable_resource_variables()
gs = tf.train.get_or_create_global_step()
with tf.variable_scope("net"):
    w = tf.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
        (_base.DIM, _base.CLASSES)).astype(np.float32) * 0.3)
    b = tf.get_variable("b", initializer=np.zeros(_base.CLASSES, np.float32))
opt = {"momentum": lambda: tf.train.MomentumOptimizer(0.05, 0.9),
       "sgd": lambda: tf.train.GradientDescentOptimizer(0.1),
       "adam": lambda: tf.train.AdamOptimizer(0.02)}[args.opt]()


def body(i):
    with tf.control_dependencies([i]):
        seed = tf.stack([tf.cast(tf.identity(gs), tf.int32), 7])
    x = tf.random.stateless_normal([8, _base.DIM], seed=seed)
    y = tf.random.stateless_uniform([8], seed=seed + 1, minval=0, maxval=_base.CLASSES,
                                    dtype=tf.int32)
    logits = tf.matmul(x, w) + b
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    with tf.control_dependencies([opt.minimize(loss, global_step=gs)]):
        return i + 1


train = tf.while_loop(lambda i: i < args.per_run, body, [tf.constant(0)])
with tf.Session(config=_base.config()) as sess:
    sess.run(tf.global_variables_initializer())
    step = _base.unfed_loop(sess, args, train, gs)
    _base.dump(args.dump, sess)
print(f"done at step {step}", flush=True)
