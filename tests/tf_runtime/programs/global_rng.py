"""TF1 code as GAN and VAE programs write it: the generator's noise drawn with
`np.random.uniform(-1, 1, [batch, z_dim])` in every step, the mini-batch picked with
`np.random.randint`, from numpy's global generator seeded once at the start
(`--draw numpy`), or from Python's `random` (`--draw python`). A restarted copy draws other
numbers than an uninterrupted run. `--draw generator`: from the program's own
`np.random.default_rng(7)`; `--draw trainer`: from a `np.random.RandomState(7)` a trainer
object keeps as `self.rng`, its method calling `Session.run`. `--draw reseed`: the global
generator reseeded from the global step in every step (`np.random.seed(step)`), which a
restarted copy repeats; seeded 0 at its start, as its first step reseeds it (a copy restored
at the step its start seed names used to be taken for one drawing from that seed)."""

import random
import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
Z = 4


def extra(p):
    p.add_argument("--draw", choices=["numpy", "python", "generator", "trainer", "reseed"], default="numpy")


args, gs, x, y = _base.start(extra)
np.random.seed(0 if args.draw == "reseed" else 7)
random.seed(7)
z = v1.placeholder(tf.float32, [None, Z])
with v1.variable_scope("net"):
    wz = v1.get_variable("wz", initializer=np.random.RandomState(2).standard_normal(
        (Z, _base.DIM)).astype(np.float32) * 0.3)
loss = _base.classifier(x + tf.matmul(z, wz), y)
train = v1.train.AdamOptimizer(0.02).minimize(loss, global_step=gs)
POOL_X, POOL_Y = _base.batch(0, 64)

rng = np.random.default_rng(7)


class Trainer:
    def __init__(self, sess):
        self.sess, self.rng = sess, np.random.RandomState(7)

    def step(self):
        idx = self.rng.randint(0, 64, size=8)
        noise = self.rng.uniform(-1, 1, [8, Z]).astype(np.float32)
        self.sess.run(train, {x: POOL_X[idx], y: POOL_Y[idx], z: noise})


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    trainer = Trainer(sess)
    step = sess.run(gs)
    while step < args.steps:
        if args.draw == "reseed":
            np.random.seed(int(step))
        if args.draw == "trainer":
            trainer.step()
        else:
            if args.draw == "python":
                idx = np.array([random.randrange(64) for _ in range(8)])
                noise = np.array([[random.uniform(-1, 1) for _ in range(Z)] for _ in range(8)],
                                 np.float32)
            elif args.draw == "generator":
                idx = rng.integers(0, 64, size=8)
                noise = rng.uniform(-1, 1, [8, Z]).astype(np.float32)
            else:
                idx = np.random.randint(0, 64, size=8)
                noise = np.random.uniform(-1, 1, [8, Z]).astype(np.float32)
            sess.run(train, {x: POOL_X[idx], y: POOL_Y[idx], z: noise})
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
