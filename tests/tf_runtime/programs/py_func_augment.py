"""Augmentation in NumPy inside the graph, as TF1 programs did before tf.image had it: a
`tf.compat.v1.py_func` given the fed mini-batch adds noise and flips rows at random.
`--draw global`: from numpy's global generator, seeded once; `own`: from a
`np.random.RandomState(5)` the function closes over; `step`: from a generator seeded by the
global step, passed in as a second input (a restarted copy repeats it)."""


import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--draw", choices=["global", "own", "step"], default="global")


args, gs, x, y = _base.start(extra)
np.random.seed(3)
own = np.random.RandomState(5)


def augment(batch, step=None):
    rng = np.random if args.draw == "global" else own if args.draw == "own" else \
        np.random.RandomState(int(step))
    flip = rng.uniform(size=(len(batch), 1)) < 0.5
    noise = rng.normal(scale=0.1, size=batch.shape)
    return (np.where(flip, -batch, batch) + noise).astype(np.float32)


inputs = [x, gs] if args.draw == "step" else [x]
augmented = tf.reshape(v1.py_func(augment, inputs, tf.float32), [-1, _base.DIM])
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(_base.classifier(augmented, y),
                                                       global_step=gs)
_base.plain_loop(args, train, gs, x, y)
