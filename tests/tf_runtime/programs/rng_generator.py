"""Random numbers from a `tf.random.Generator` in graph mode, whose state (a Philox counter)
is an int64 variable of the graph that the generator's ops advance: dropout on the hidden
layer from `gen.uniform` in the training run (`--draw train`), or input noise drawn by
`gen.normal` in a run of its own before the training run and fed to it with the mini-batch
(`--draw apart`, as a GAN's loop draws its z). `--generator seeded` makes it
`Generator.from_seed(7)`; `global` takes `tf.random.get_global_generator()` after
`tf.random.set_global_generator(Generator.from_seed(7))`. Momentum; each mini-batch fed from
the global step read."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--draw", default="apart", choices=["train", "apart"])
    p.add_argument("--generator", default="seeded", choices=["seeded", "global"])


args, gs, x, y = _base.start(extra)
if args.generator == "seeded":
    gen = tf.random.Generator.from_seed(7)
else:
    tf.random.set_global_generator(tf.random.Generator.from_seed(7))
    gen = tf.random.get_global_generator()
noise = v1.placeholder(tf.float32, [None, _base.DIM])
w1 = v1.get_variable("w1", initializer=np.random.RandomState(3).standard_normal(
    (_base.DIM, 16)).astype(np.float32) * 0.3)
w2 = v1.get_variable("w2", initializer=np.random.RandomState(4).standard_normal(
    (16, _base.CLASSES)).astype(np.float32) * 0.3)
hidden = tf.nn.relu(tf.matmul(x + noise, w1))
if args.draw == "train":
    keep = tf.cast(gen.uniform(tf.shape(hidden)) < 0.8, tf.float32)
    hidden = hidden * keep / 0.8
logits = tf.matmul(hidden, w2)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
draw = gen.normal([8, _base.DIM]) * 0.1
zeros = np.zeros((8, _base.DIM), np.float32)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        bx, by = _base.batch(step)
        z = sess.run(draw) if args.draw == "apart" else zeros
        sess.run(train, {x: bx, y: by, noise: z})
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
