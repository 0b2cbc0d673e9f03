"""A program that handles the end of its own process: `--sigterm ignore` ignores SIGTERM
(`signal.signal(SIGTERM, SIG_IGN)`, as programs that must not be cut by a terminal's hangup
or a supervisor do), `--sigterm save` turns it into a flag its loop checks after each step
(then saves its own checkpoint into `--workdir` and exits 0, as preemption-aware programs
do); `--atexit` registers `atexit` work that writes `exit.json` (the last step trained)
into `--workdir`; `--restore` restores the latest checkpoint of `--workdir` at its start
(where a preemption-aware program resumes from its own save). Each mini-batch fed from the
step read; Momentum."""

import atexit
import json
import os
import signal
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--sigterm", choices=["ignore", "save", "default"], default="ignore")
    p.add_argument("--atexit", action="store_true")
    p.add_argument("--restore", action="store_true")


args, gs, x, y = _base.start(extra)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(_base.classifier(x, y), global_step=gs)
saver = v1.train.Saver(max_to_keep=2)
stop = {"asked": False}
last = {"step": None}
if args.sigterm == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif args.sigterm == "save":
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(asked=True))
if args.atexit:
    def _at_exit() -> None:
        os.makedirs(args.workdir, exist_ok=True)
        with open(os.path.join(args.workdir, "exit.json"), "w") as fh:
            json.dump({"pid": os.getpid(), "step": last["step"]}, fh)
    atexit.register(_at_exit)

with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    latest = v1.train.latest_checkpoint(args.workdir) if args.restore else None
    if latest:
        saver.restore(sess, latest)
        print(f"restored its own {os.path.basename(latest)}", flush=True)
    step = int(sess.run(gs))
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        last["step"] = step
        if stop["asked"]:
            saver.save(sess, os.path.join(args.workdir, "model"), global_step=step)
            print(f"SIGTERM: saved at step {step}", flush=True)
            break
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
