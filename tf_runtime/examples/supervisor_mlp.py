"""The MLP trained the tf.train.Supervisor way (a TF1 pattern the shim must cope with).

The Supervisor finalizes the graph, initialises or restores from its own --logdir,
and runs background threads (summaries, step counter, periodic checkpoints) that
call Session.run() concurrently with the training loop. Same flags as mlp.py plus
--logdir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import tensorflow as tf

from tf_runtime.examples.common import (
    build_replicated,
    configure,
    dump,
    parse_args,
    session_config,
    train_loop,
)
from tf_runtime.examples.mlp import STABLE_LR, hidden_flag, model


def main(argv: list[str] | None = None) -> int:
    def flags(p: argparse.ArgumentParser) -> None:
        hidden_flag(p)
        p.add_argument("--logdir", default=None, help="the Supervisor's own directory")

    args = parse_args("MLP under tf.train.Supervisor", argv, flags, steps=200, batch=16,
                      lr=STABLE_LR)  # 0.05 diverged past step ~200 (mlp.STABLE_LR)
    configure(args.seed)
    gs, train, loss = build_replicated(lambda g, i: model(args, g, i), args,
                                       tf.compat.v1.train.MomentumOptimizer(args.lr, 0.9))
    tf.compat.v1.summary.scalar("loss", loss)
    logdir = args.logdir or tempfile.mkdtemp(prefix="supervisor-")
    sv = tf.compat.v1.train.Supervisor(logdir=logdir, global_step=gs,
                                       save_summaries_secs=0.05, save_model_secs=0.2)
    with sv.managed_session(config=session_config(args)) as sess:
        step = train_loop(args, gs, train, loss, sess)
        dump(args, sess)
        sv.request_stop()
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
