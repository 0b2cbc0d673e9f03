"""A program that re-executes itself after setting its environment, as launchers do that
need a variable in place before a library reads it (`os.execv(sys.executable, ...)` with
`TF_DETERMINISTIC_OPS`, a hash seed, a library path): `--when before` execs before it
imports TensorFlow; `--when after` imports TensorFlow at its top (the shim then started)
and execs from its main; `--argv orig` re-executes `sys.orig_argv` (the interpreter's own
command line), `--argv script` `[sys.executable, *sys.argv]`. The second image trains: a
plain Session loop fed from the step read, Momentum."""

import os
import sys

if "--when" in sys.argv and sys.argv[sys.argv.index("--when") + 1] == "after":
    import tensorflow  # noqa: F401  (at the top, as most scripts do)


def reexec() -> None:
    if os.environ.get("REEXEC_DONE") == "1":
        return
    os.environ["REEXEC_DONE"] = "1"
    os.environ["TF_DETERMINISTIC_OPS"] = "1"
    sys.stdout.flush()
    argv = sys.orig_argv if "orig" in sys.argv else [sys.executable, *sys.argv]
    os.execv(sys.executable, argv)


def main() -> None:
    reexec()
    import _base

    args, gs, x, y = _base.start(lambda p: (p.add_argument("--when", default="before"),
                                            p.add_argument("--argv", default="script")))
    loss = _base.classifier(x, y)
    train = _base.tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
    _base.plain_loop(args, train, gs, x, y)


main()
