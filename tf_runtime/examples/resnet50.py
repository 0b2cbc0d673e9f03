"""A ResNet-50 (bottleneck blocks 3-4-6-3, about 25.5M parameters, 102 MB) on tiny images.

The real ResNet-50 topology and variable sizes, without batch normalisation (biases
instead) and on 32x32 inputs, so one training step costs little on a CPU while the
checkpoint has the real model's size. Plain SGD: the checkpoint is the weights.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import tensorflow as tf

from tf_runtime.examples.common import batch_seed, run_example

CLASSES = 1000
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # bottleneck width, blocks, stride


def conv(x: Any, name: str, k: int, c_out: int, stride: int = 1, scale: float = 1.0,
         act: bool = True) -> Any:
    c_in = int(x.shape[-1])
    std = scale * (2.0 / (k * k * c_in)) ** 0.5
    w = tf.compat.v1.get_variable(f"{name}/w", [k, k, c_in, c_out],
                                  initializer=tf.compat.v1.truncated_normal_initializer(stddev=std))
    b = tf.compat.v1.get_variable(f"{name}/b", [c_out], initializer=tf.compat.v1.zeros_initializer())
    y = tf.nn.conv2d(x, w, [1, stride, stride, 1], "SAME") + b
    return tf.nn.relu(y) if act else y


def bottleneck(x: Any, name: str, width: int, stride: int) -> Any:
    out = 4 * width
    shortcut = x
    if stride != 1 or int(x.shape[-1]) != out:
        shortcut = conv(x, f"{name}/proj", 1, out, stride, act=False)
    h = conv(x, f"{name}/a", 1, width, stride)
    h = conv(h, f"{name}/b", 3, width)
    # A small last layer keeps the un-normalised residual sum stable.
    h = conv(h, f"{name}/c", 1, out, scale=0.1, act=False)
    return tf.nn.relu(h + shortcut)


def model(args: argparse.Namespace, gs: Any, tower: int) -> Any:
    size = args.image_size
    x = tf.random.stateless_uniform([args.batch, size, size, 3], seed=batch_seed(args, tower, gs))
    labels = tf.random.stateless_uniform([args.batch], seed=batch_seed(args, tower, gs, 1),
                                         minval=0, maxval=CLASSES, dtype=tf.int32)
    h = conv(x, "stem", 7, 64, 2)
    h = tf.nn.max_pool2d(h, 3, 2, "SAME")
    for s, (width, blocks, stride) in enumerate(STAGES):
        for b in range(blocks):
            h = bottleneck(h, f"stage{s + 2}/block{b}", width, stride if b == 0 else 1)
    h = tf.reduce_mean(h, axis=[1, 2])
    w = tf.compat.v1.get_variable("fc/w", [2048, CLASSES],
                                  initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable("fc/b", [CLASSES], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(h, w) + bias
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))


def main(argv: list[str] | None = None) -> int:
    def flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--image-size", type=int, default=32, help="input height and width")

    return run_example("ResNet-50-sized training", model,
                       tf.compat.v1.train.GradientDescentOptimizer, argv, flags,
                       steps=20, batch=2, lr=0.01, threads=2)


if __name__ == "__main__":
    sys.exit(main())
