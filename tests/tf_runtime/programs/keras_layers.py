"""TF1 training written with Keras layers in graph mode: `tf.keras.Sequential` of Dense
layers (Keras 3, whose variables are TensorFlow variables in the graph's collections), a
`tf.compat.v1.train` optimizer, a plain Session loop fed from the global step it read.
`--optimizer` picks Adam, momentum or RMSProp."""

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--optimizer", choices=["adam", "momentum", "rmsprop"], default="adam")


args, gs, x, y = _base.start(extra)
model = tf.keras.Sequential([
    tf.keras.layers.Dense(8, activation="tanh",
                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=4)),
    tf.keras.layers.Dense(_base.CLASSES,
                          kernel_initializer=tf.keras.initializers.GlorotUniform(seed=5)),
])
logits = model(x)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
opt = {"adam": lambda: v1.train.AdamOptimizer(0.05),
       "momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
       "rmsprop": lambda: v1.train.RMSPropOptimizer(0.02, momentum=0.5)}[args.optimizer]()
train = opt.minimize(loss, global_step=gs)
_base.plain_loop(args, train, gs, x, y)
