"""The GPUs a job's program sees when it sets CUDA_VISIBLE_DEVICES itself.

The helper launches each job with `CUDA_VISIBLE_DEVICES` set to the GPUs the scheduler gave
it. Many programs set it again themselves before importing TensorFlow (a tutorial's
`os.environ["CUDA_VISIBLE_DEVICES"] = "0"`, a `--gpu 1` flag), written for a machine of their
own: on a shared server that picked physical GPU 0, another job's, whatever GPU the job held
(and a GPU number beyond the server's left TensorFlow without a GPU: it trained on the CPU).
The shim keeps the job on its own GPUs, numbering them from 0 as a container of Kubernetes or
Slurm with ConstrainDevices does: before TensorFlow starts CUDA (at its import and at each
Session's creation), a program's list of GPU numbers is read within the job's list (its GPU 0
is the job's first; GPUs the job holds named as they are, "5" of its "3,5", are kept as
set), a list the job cannot satisfy (a number past its GPUs, a UUID it does not
hold, the variable removed) gives the job's own list back, and one that hides every GPU
(`""`, `-1`: train on the CPU) is kept. Each change is logged. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

log = logging.getLogger("tf_runtime")

ENV = "CUDA_VISIBLE_DEVICES"
# The job's list as the helper launched it (migration_helper.launch_rule.job_environment),
# then as `keep` settled it: inherited by every process of the job. Read first, so a python
# started by a wrapper that set CUDA_VISIBLE_DEVICES itself (a shell script's
# `CUDA_VISIBLE_DEVICES=0 python train.py`, a launcher's os.environ before its subprocess)
# is kept within the job's GPUs too; before, the wrapper's value was recorded as the
# launch's, and the job used the server's GPU 0.
GPUS_ENV = "GANDIVA_GPUS"
# [the launch's list (None: the process was started without one)], recorded once at the
# interpreter's start (tf_runtime.autoload's import), before the program's own code runs;
# then the last value `keep` settled on.
_LAUNCH: list[str | None] = []
_SETTLED: list[str | None] = []


def record(environ: MutableMapping[str, str] | None = None) -> None:
    """Remember the launch's list (the first call only)."""
    if not _LAUNCH:
        env = os.environ if environ is None else environ
        _LAUNCH.append(env.get(GPUS_ENV, env.get(ENV)))


def within(launch: str, wanted: str | None) -> tuple[str, str]:
    """(the value to use, why) for a program that set `wanted` in a job launched on `launch`."""
    held = [d.strip() for d in launch.split(",") if d.strip()]
    if wanted is not None and wanted.strip() in ("", "-1"):
        return wanted, f"the program hides every GPU ({ENV}={wanted!r}): it trains on the CPU"
    asked = [d.strip() for d in (wanted or "").split(",") if d.strip()]
    numbered = all(a.isdecimal() and int(a) < len(held) for a in asked)
    if asked and all(a in held for a in asked) and not numbered:
        # GPUs the job holds, by their own names: UUIDs, or a launcher's share of the job's
        # list ("5" of "3,5" for its second worker; 5 is no number within two GPUs).
        return ",".join(asked), ""
    if asked and numbered:
        mine = ",".join(held[int(a)] for a in asked)
        return mine, (f"the program set {ENV}={wanted!r}; the job holds GPU(s) {launch}, numbered "
                      f"from 0 within the job: it uses {mine}")
    what = (f"removed {ENV} (every GPU of the server)" if wanted is None else
            f"set {ENV}={wanted!r}, GPU(s) the job does not hold")
    return launch, f"the program {what}; it keeps the job's {ENV}={launch}"


def keep(environ: MutableMapping[str, str] | None = None) -> None:
    """Before TensorFlow starts CUDA: keep the program within the launch's GPUs."""
    env = os.environ if environ is None else environ
    if not _LAUNCH or _LAUNCH[0] is None:
        return  # not launched on GPUs of Gandiva's
    now = env.get(ENV)
    if now == _LAUNCH[0] or (_SETTLED and now == _SETTLED[0]):
        return
    value, why = within(_LAUNCH[0], now)
    env[ENV] = value
    _SETTLED[:] = [value]
    if value.strip() not in ("", "-1"):  # (a process on the CPU may start one on the job's GPUs)
        env[GPUS_ENV] = value  # its children's GPUs, numbered within these: "1" of "2,5" stays 5
    if why:
        log.warning("%s", why)
