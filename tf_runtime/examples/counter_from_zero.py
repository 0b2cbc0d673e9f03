"""An MLP whose loop counts in Python from 0 and never reads the global step.

Such a program cannot continue from a restored step (it would redo all its steps),
so the shim reports it as not migratable. Same flags as mlp.py.
"""

from __future__ import annotations

import sys

import tensorflow as tf

from tf_runtime.examples.common import build_replicated, configure, dump, parse_args, session_config
from tf_runtime.examples.mlp import hidden_flag, model


def main(argv: list[str] | None = None) -> int:
    args = parse_args("MLP with a Python loop counter", argv, hidden_flag, steps=200, batch=16,
                      lr=0.05)
    configure(args.seed)
    _, train, _ = build_replicated(lambda g, i: model(args, g, i), args,
                                   tf.compat.v1.train.MomentumOptimizer(args.lr, 0.9))
    step_op = tf.group(train)  # runs the step without fetching the global step's value
    with tf.compat.v1.Session(config=session_config(args)) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(args.steps):
            sess.run(step_op)
            if args.log_every and (i + 1) % args.log_every == 0:
                print(f"iteration {i + 1}", flush=True)
        dump(args, sess)
    print(f"done after {args.steps} iterations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
