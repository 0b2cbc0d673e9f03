"""The MLP trained with tf.compat.v1.train.MonitoredTrainingSession and hooks.

MonitoredTrainingSession finalizes the graph, initialises or restores from its own
--checkpoint-dir, and stops through StopAtStepHook (driven by the global step).
The final variables are dumped by a hook's end(). Same flags as mlp.py plus
--checkpoint-dir.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import tensorflow as tf

from tf_runtime.examples.common import build_replicated, configure, parse_args, session_config
from tf_runtime.examples.mlp import STABLE_LR, hidden_flag, model


class DumpAtEnd(tf.compat.v1.train.SessionRunHook):
    """Writes every variable to an .npz when the session closes."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def begin(self) -> None:
        self.variables = tf.compat.v1.global_variables()

    def end(self, session: Any) -> None:
        if self.path:
            values = session.run(self.variables)
            np.savez(self.path, **{v.name: x for v, x in zip(self.variables, values)})


def main(argv: list[str] | None = None) -> int:
    def flags(p: argparse.ArgumentParser) -> None:
        hidden_flag(p)
        p.add_argument("--checkpoint-dir", default=None,
                       help="MonitoredTrainingSession's own checkpoints")

    args = parse_args("MLP under MonitoredTrainingSession", argv, flags, steps=200, batch=16,
                      lr=STABLE_LR)  # 0.05 ended in a NaN loss at step 1,103 (mlp.STABLE_LR)
    configure(args.seed)
    _, train, loss = build_replicated(lambda g, i: model(args, g, i), args,
                                      tf.compat.v1.train.MomentumOptimizer(args.lr, 0.9))
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps),
             tf.compat.v1.train.NanTensorHook(loss), DumpAtEnd(args.dump)]
    with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=args.checkpoint_dir, hooks=hooks, config=session_config(args),
            save_checkpoint_steps=25 if args.checkpoint_dir else None,
            save_summaries_steps=None, log_step_count_steps=None) as sess:
        while not sess.should_stop():
            step, _ = sess.run([train, loss])
            if args.step_sleep:
                time.sleep(args.step_sleep)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
