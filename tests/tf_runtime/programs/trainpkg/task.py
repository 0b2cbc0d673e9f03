"""Entry point: `python -m trainpkg.task --steps N [--step-sleep S] [--dump F]`."""

import argparse

import tensorflow as tf

from . import model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--dump", default=None)
    args = p.parse_args()
    tf.compat.v1.disable_eager_execution()
    tf.config.experimental.enable_op_determinism()
    model.run(args.steps, args.step_sleep, args.dump)


if __name__ == "__main__":
    main()
