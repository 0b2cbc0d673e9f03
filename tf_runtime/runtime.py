"""The per-process runtime: settings from the helper's environment, wiring, report().

Environment (set by the Migration Helper; all optional):
  GANDIVA_JOB_ID, GANDIVA_INCARNATION, GANDIVA_SERVER   identity in RuntimeHello
  GANDIVA_SCHEDULER          host:port of the scheduler; absent => no control stream
  GANDIVA_RESTORE_CHECKPOINT checkpoint directory restored after the session exists
  GANDIVA_WARM=1             hold before the first training step (pre-warmed migration)
  GANDIVA_WARM_STEP=0        warm mode without the rehearsed first step (hold at the
                             restore point; the first step then builds the executors)
  GANDIVA_SOURCE_TOWERS      warm mode: the tower copies in the source's graph; another
                             number here refuses before holding (exit 76)
  GANDIVA_WARM_SIGNATURE     warm mode: the source's first training run (JSON, from its
                             TrainSignature), rehearsed when the program reads the global
                             step (or anything) before its first training run
  GANDIVA_PREBUILD_SAVE=0    no scratch save after the first step (the first real save
                             then builds the save op's executors)
  GANDIVA_CONTROL_FD / GANDIVA_STATUS_FD   pipes shared with the helper
  GANDIVA_GPU_RELEASE        cpu | cuda | auto (tf_runtime.gpu_release)
  GANDIVA_LEASE_FILE         the helper's lease: runs hold while it has run out
                             (tf_runtime.lease)
With none of them set, nothing is installed and the program runs untouched.

Set by the runtime itself for the job's other processes:
  GANDIVA_RUNTIME_PID        the pid of the job's process that started the runtime first.
                             A descendant that imports TensorFlow while that process lives
                             (an evaluation or export script the training program runs with
                             `subprocess`) is a *secondary*: the pipes are not its own (a
                             Python subprocess has them closed, and their numbers may name
                             its own files), and it connects to the scheduler only once it
                             trains, so one that never trains never takes the job's stream
                             from the process that does.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import launch
from .checkpoint import validate
from .controller import Controller, Settings
from .gpu_release import select_backend
from .lease import LEASE_ENV
from .pipes import StatusPipe

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    controller: Controller
    client: object | None = None  # tf_runtime.client.StreamClient

    def finish(self) -> None:
        """The program ended on its own: send the last progress, close the stream.

        Not in a child the program forked (os.fork, a multiprocessing pool): the stream,
        the pipes and the queued commands are the parent's, and gRPC is unusable after
        a fork (closing its channel there hung the child, and with it a parent that
        waits for it)."""
        if self.controller.in_forked_child:
            return
        self.controller.finish()
        # The helper reports it with the process's exit: the last progress reports may
        # never reach the scheduler (away for an upgrade, its database down), and a job
        # that ended then was recorded SUCCEEDED with the steps it last heard (70 of 80).
        if self.controller.status is not None:
            self.controller.status.event("last_step", steps=self.controller.meter.steps)
        if self.client is not None:
            self.client.close(timeout_s=2.0)  # type: ignore[attr-defined]


_RUNTIME: list[Runtime] = []


def current() -> Runtime | None:
    return _RUNTIME[0] if _RUNTIME else None


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    """An on-by-default switch: 0, false, no or off turn it off."""
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def _owner(env: Mapping[str, str]) -> int | None:
    """The pid of a live ancestor that started this job's runtime first, or None (this
    process is the first, or that one has ended)."""
    try:
        pid = int(env.get("GANDIVA_RUNTIME_PID", ""))
    except ValueError:
        return None
    if pid == os.getpid() or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's: not ours, but alive all the same
    return pid


def start(env: Mapping[str, str] | None = None) -> Runtime | None:
    """Set up the shim for this process from `env`; None when nothing is asked for."""
    env = os.environ if env is None else env
    scheduler = env.get("GANDIVA_SCHEDULER") or None
    restore = env.get("GANDIVA_RESTORE_CHECKPOINT") or None
    warm = env.get("GANDIVA_WARM") == "1"
    warm_step = _flag(env, "GANDIVA_WARM_STEP")
    prebuild_save = _flag(env, "GANDIVA_PREBUILD_SAVE")
    status_fd = _int_env(env, "GANDIVA_STATUS_FD")
    control_fd = _int_env(env, "GANDIVA_CONTROL_FD")
    if not (scheduler or restore or warm or status_fd is not None):
        return None  # standalone: a transparent pass-through
    owner = _owner(env)
    # A process of the same launch that trained (tf_runtime.launch): alive, it is this
    # one's sibling (`python train.py & python eval.py`), which must not take the job's
    # stream from it; ended, this one runs after the training (`...; python eval.py`).
    trainer = launch.trainer_of_launch(env) if owner is None else None
    ended = trainer is not None and _owner({"GANDIVA_RUNTIME_PID": str(trainer)}) is None
    if trainer is not None and not ended:
        owner = trainer
    if ended and restore and not warm:
        # `python pretrain.py; python finetune.py` restarted from a checkpoint: the first
        # program restored it and trained; the second used to try the same checkpoint,
        # which does not fit its graph, and the job failed after a lost server.
        log.info("this launch's trainer (pid %d) has ended: the checkpoint %s was its to "
                 "restore; this process (pid %d) starts as its program does", trainer,
                 restore, os.getpid())
        restore = None
    secondary = owner is not None
    warm_launch = warm
    if secondary:
        log.info("another process (pid %d) runs this job's Gandiva runtime: this one "
                 "connects only if it trains, and leaves the helper's pipes alone", owner)
        status_fd = control_fd = None
        warm = False
    else:
        # Behind a Python driver that did not pass them on (subprocess closes them), the
        # helper's pipes are reached through the driver (tf_runtime.launch).
        if status_fd is not None:
            status_fd = launch.helper_pipe(status_fd, True, env) or status_fd
        if control_fd is not None:
            control_fd = launch.helper_pipe(control_fd, False, env) or control_fd
    warm_signature = env.get("GANDIVA_WARM_SIGNATURE", "")
    if warm_signature:
        try:
            json.loads(warm_signature)
        except ValueError:
            raise ValueError("GANDIVA_WARM_SIGNATURE is not JSON (it is the TrainSignature "
                             "the source's shim reported)") from None
    if scheduler and not env.get("GANDIVA_JOB_ID"):
        raise ValueError("GANDIVA_SCHEDULER is set but GANDIVA_JOB_ID is empty: the scheduler "
                         "needs the job id in the runtime hello")
    restored_step = 0
    if restore and not warm:
        # Refuse to start at all rather than train from step 0 by mistake.
        restored_step = int(validate(restore)["global_step"])
    source_towers = _int_env(env, "GANDIVA_SOURCE_TOWERS") or 0
    settings = Settings(job_id=env.get("GANDIVA_JOB_ID", ""), restore_dir=restore,
                        warm=warm, control_fd=control_fd, warm_step=warm and warm_step,
                        prebuild_save=prebuild_save, warm_signature=warm_signature,
                        source_towers=source_towers if warm else 0,
                        lease_file=env.get(LEASE_ENV, ""))
    status = StatusPipe.from_fd(status_fd) if status_fd is not None else None
    rt = Runtime(controller=None)  # type: ignore[arg-type]
    after_training = ""
    if ended and not warm:
        after_training = (f"this process (pid {os.getpid()}) started after its launch's training "
                          "had ended (the rest of the job's command: an evaluation, an export, "
                          "a second training program); it runs to its end where it is: a "
                          "restart runs the launch's first program, which its checkpoint "
                          "would not fit, so it is never checkpointed or migrated (once it "
                          "trains it can be suspended and resumed in place)")

    if scheduler is not None:
        # Imported now, not at a warm process's activation: gRPC's import is not on the
        # migration's critical path, and the script's directory (sys.path[0] once the
        # program runs) cannot shadow the installed protos.
        from .client import Identity, StreamClient

    def connect(step: int) -> None:
        if scheduler is None:
            return

        ident = Identity(settings.job_id, env.get("GANDIVA_INCARNATION", ""), os.getpid(),
                         env.get("GANDIVA_SERVER", ""), step)

        def standing() -> str:
            # The job's stream belongs to the launch's trainer (tf_runtime.launch).
            return launch.stream_standing(env, rt.controller.trained)[0]

        def claim() -> None:
            # Before each connect of the launch's trainer, and once a process that does
            # not train has left the stream to it (tf_runtime.launch.stream_standing).
            if rt.controller.trained or client.left:
                launch.claim_stream(env)

        client = StreamClient(scheduler, ident, rt.controller.meter, rt.controller.enqueue,
                              standing=standing, claim=claim)
        rt.controller.channel = client
        rt.client = client.start()
        if after_training:
            client.send_migratability(False, after_training)

    retry = bool(after_training) and launch.runs_trainers_program(env)

    def first_training(step: int) -> None:
        if retry:  # the trainer run again by its wrapper: a trainer from its first step
            rt.controller.after_training = ""
        launch.mark_trained(env)
        if not secondary:
            return
        if warm_launch:
            # A pre-warmed launch holds only in the process that has the helper's pipes:
            # a child training here would train beside the source.
            log.error("this pre-warmed launch trains in a child process (pid %d) of the one "
                      "that started the Gandiva runtime (pid %s), which cannot be held for "
                      "the migration: exiting before its first step; the job stays where it "
                      "is", os.getpid(), owner)
            os._exit(2)
        connect(step)

    def end_launch(code: int) -> None:
        # Ended on Gandiva's command: the wrappers of its launch do not go on with the
        # rest of their script as if training had ended (tf_runtime.launch).
        stopped = launch.end_launch(code, None if secondary else status_fd, env)
        if stopped:
            log.info("exiting with %d: this launch's wrappers (pids %s) stopped; the helper "
                     "ends the launch", code, stopped)

    rt.controller = Controller(settings, status=status, backend=select_backend(),
                               on_activate=connect, on_exit=end_launch,
                               on_first_training=first_training, after_training=after_training)
    if not warm and not secondary:
        connect(restored_step)
    if env is os.environ and not secondary:
        os.environ["GANDIVA_RUNTIME_PID"] = str(os.getpid())  # for its descendants
    from . import shim

    shim.install(rt.controller)
    _RUNTIME[:] = [rt]
    return rt


def report(**metrics: float) -> None:
    """Publish metrics (e.g. validation accuracy) with the next progress report.

    Values must be finite numbers; without a scheduler this only logs them.
    """
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"tf_runtime.report: {name}={value!r} is not a number") from None
        if not math.isfinite(v):
            raise ValueError(f"tf_runtime.report: {name}={value!r} is not finite")
        clean[name] = v
    rt = current()
    if rt is None:
        log.debug("report (no runtime): %s", clean)
        return
    rt.controller.meter.add_metrics(clean)
