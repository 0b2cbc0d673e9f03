"""A small MLP regression (32-64-64-1, --hidden sets the width) trained with momentum.

Momentum slots make the optimizer state part of the checkpoint. Usage:
    python -m tf_runtime.run mlp.py --steps 200 --replicas 4 --dump out.npz
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import tensorflow as tf

from tf_runtime.examples.common import batch_seed, dense, run_example

DIM = 32
# A learning rate under which momentum (0.9) trains this model stably however long it runs.
# At 0.05 (mlp.py's default, kept: its tests' and docs' figures were taken with it; a long
# mlp.py run needs --lr 0.01, as `gandiva demo` passes) the weights grow
# geometrically from about step 150, once the tanh units saturate on the unnormalised 32-d
# input: the loss read 14 at step 200, 1e5 at 300, inf at 1,063 and NaN at 1,103 (seed 0), and
# mts_mlp's NanTensorHook failed the job. At 0.01 the loss falls from 1.0 to about 0.4-0.6
# and stays finite over 20,000 steps (seeds 0-3, --hidden 256, --batch 64 alike).
STABLE_LR = 0.01


def model(args: argparse.Namespace, gs: Any, tower: int) -> Any:
    x = tf.random.stateless_normal([args.batch, DIM], seed=batch_seed(args, tower, gs))
    teacher = tf.random.stateless_normal([DIM, 1], seed=[args.seed, 424242])
    target = tf.sin(tf.matmul(x, teacher))
    h = dense(x, "fc1", args.hidden, tf.nn.tanh)
    h = dense(h, "fc2", args.hidden, tf.nn.tanh)
    out = dense(h, "out", 1, act=None)
    return tf.reduce_mean(tf.square(out - target))


def hidden_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers")


def main(argv: list[str] | None = None) -> int:
    return run_example("MLP regression", model,
                       lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9), argv,
                       hidden_flag, steps=200, batch=16, lr=0.05)


if __name__ == "__main__":
    sys.exit(main())
