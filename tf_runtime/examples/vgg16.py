"""A VGG16 (13 convolutions, 3 dense layers, about 138M parameters, 553 MB) on tiny images.

The real VGG16 variable sizes: the 32x32 input leaves a 1x1x512 feature map, which
is tiled to the 7x7x512 that fc6 (25088x4096) expects, so every weight is trained
while a step stays cheap on a CPU. Plain SGD: the checkpoint is the weights.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import tensorflow as tf

from tf_runtime.examples.common import batch_seed, dense, run_example
from tf_runtime.examples.resnet50 import conv

CLASSES = 1000
CONVS = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def model(args: argparse.Namespace, gs: Any, tower: int) -> Any:
    x = tf.random.stateless_uniform([args.batch, 32, 32, 3], seed=batch_seed(args, tower, gs))
    labels = tf.random.stateless_uniform([args.batch], seed=batch_seed(args, tower, gs, 1),
                                         minval=0, maxval=CLASSES, dtype=tf.int32)
    h = x
    for s, (channels, n) in enumerate(CONVS):
        for c in range(n):
            h = conv(h, f"conv{s + 1}_{c + 1}", 3, channels)
        h = tf.nn.max_pool2d(h, 2, 2, "SAME")
    h = tf.reshape(tf.tile(h, [1, 7, 7, 1]), [args.batch, 7 * 7 * 512])
    h = dense(h, "fc6", 4096)
    h = dense(h, "fc7", 4096)
    logits = dense(h, "fc8", CLASSES, act=None)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))


def main(argv: list[str] | None = None) -> int:
    return run_example("VGG16-sized training", model,
                       tf.compat.v1.train.GradientDescentOptimizer, argv,
                       steps=10, batch=2, lr=0.001, threads=2)


if __name__ == "__main__":
    sys.exit(main())
