"""Fixtures for the tf_runtime tests: a fake session world for the wrapper chain,
a real local Runtime gRPC server, and launching example jobs as real processes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tf_runtime.examples as examples_pkg
from tf_runtime.testing import FakeWorld

EXAMPLES = Path(examples_pkg.__file__).parent
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def world() -> FakeWorld:
    return FakeWorld()


@pytest.fixture
def runtime_server() -> Iterator[Any]:
    from tf_runtime.testing import LocalRuntimeServer

    server = LocalRuntimeServer()
    yield server
    server.stop(0)


class Job:
    """A real training process under `python -m tf_runtime.run`, with the helper's pipes."""

    def __init__(self, script: str, args: list[str], env: dict[str, str], warm: bool = False,
                 log_path: Path | None = None, status: bool = True,
                 command: list[str] | None = None) -> None:
        self.status_r, status_w = os.pipe()
        pass_fds = [status_w]
        base = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
        full_env = {**base, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
        if status:
            full_env["GANDIVA_STATUS_FD"] = str(status_w)
        control_r = None
        if warm:
            control_r, self.control_w = os.pipe()
            pass_fds.append(control_r)
            full_env.update(GANDIVA_WARM="1", GANDIVA_CONTROL_FD=str(control_r))
        self.log_path = log_path
        with open(log_path or os.devnull, "w") as out:  # the child keeps its own copy
            # `command`: the job's own command line (a wrapper), instead of tf_runtime.run.
            argv = command or [sys.executable, "-m", "tf_runtime.run", str(EXAMPLES / script)]
            self.proc = subprocess.Popen(
                [*argv, *args],
                env=full_env, pass_fds=pass_fds, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        os.close(status_w)
        if control_r is not None:
            os.close(control_r)
        self.events: list[dict[str, Any]] = []
        self._eof = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with os.fdopen(self.status_r) as fh:
            for line in fh:
                with self._cond:
                    self.events.append(json.loads(line))
                    self._cond.notify_all()
        with self._cond:
            self._eof = True  # the process (and every child holding the pipe) is gone
            self._cond.notify_all()

    def wait_event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if e["event"] == name:
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise TimeoutError(f"no {name} event (exit {self.proc.poll()}); "
                                       f"got {self.events}; log:\n{self.log()}")
                self._cond.wait(min(left, 0.5))

    def send_control(self, msg: dict[str, Any]) -> None:
        os.write(self.control_w, (json.dumps(msg) + "\n").encode())

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"job did not finish in {timeout} s; log:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text()[-4000:] if self.log_path and self.log_path.exists() else ""


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def _launch(script: str, *args: str, env: dict[str, str] | None = None,
                warm: bool = False, status: bool = True, command: list[str] | None = None) -> Job:
        job = Job(script, list(args), env or {}, warm, tmp_path / f"job{len(jobs)}.log", status,
                  command)
        jobs.append(job)
        return job

    yield _launch
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


# -- the feed_step program family, driven through every interruption --------------------

FEED_SCRIPT = "feed_step.py"


def feed_args(loop: str, optimizer: str, replicas: int, steps: int = 60) -> list[str]:
    """feed_step.py: each mini-batch fed from the global step the program read."""
    return ["--loop", loop, "--optimizer", optimizer, "--replicas", str(replicas),
            "--steps", str(steps), "--seed", "7", "--step-sleep", "0.05"]


def load_variables(path: Path) -> dict[str, bytes]:
    import numpy as np

    with np.load(path) as data:
        return {k: data[k].tobytes() for k in data.files}


def assert_same_variables(base: Path, run: Path) -> None:
    b, r = load_variables(base), load_variables(run)
    assert b.keys() == r.keys()
    assert [k for k in b if b[k] != r[k]] == [], "final variables differ from the uninterrupted run"


class FeedJob:
    """One job of the feed_step family under a real Runtime server, moved between real
    processes the way the scheduler and helpers do it. Between operations the current
    process is suspended, so nothing depends on timing; `pause` lets it train a little.
    Every command must succeed; the checkpoints' and hellos' steps are checked."""

    def __init__(self, launch: Any, server: Any, job_id: str, args: list[str], out: Path,
                 work: Path, script: str = FEED_SCRIPT, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        from protos.gandiva.v1 import runtime_pb2 as pb

        self.pb = pb
        self.script = script
        self.command_line = command  # the job's own command line (a wrapper), if any
        self.launch, self.server, self.job_id = launch, server, job_id
        self.args = [*args, "--dump", str(out)]
        self.towers = int(args[args.index("--replicas") + 1]) if "--replicas" in args else 1
        self.env = {**(env or {}), "GANDIVA_JOB_ID": job_id, "GANDIVA_SCHEDULER": server.address}
        self.work = work
        self.incarnation = -1
        self.proc: Any = None
        self.last_checkpoint: Any = None  # the ack of the latest CHECKPOINT
        self._dirs = itertools.count()
        # Devices the program's towers run on (feed_step --devices); None: one per tower.
        # A migration or restart given `devices` is a grow or a shrink.
        self.devices: int | None = None

    def _hello(self, incarnation: int) -> Any:
        return self.server.wait_for(lambda j, m: j == self.job_id and m.HasField("hello")
                                    and m.hello.incarnation == str(incarnation), 60).hello

    def command(self, kind: int, arg: str = "") -> Any:
        ack = self.server.wait_ack(self.server.send(self.job_id, kind, arg), 60)
        assert ack.ok, ack.message
        return ack

    def _spawn(self, extra: dict[str, str], warm: bool = False, devices: int | None = None) -> Any:
        self.incarnation += 1
        self.devices = devices or self.devices
        env = {**self.env, **extra, "GANDIVA_INCARNATION": str(self.incarnation)}
        on = ["--devices", str(self.devices)] if self.devices else []
        return self.launch(self.script, *self.args, *on, env=env, warm=warm,
                           command=self.command_line)

    def _dir(self, kind: str) -> str:
        return str(self.work / f"{kind}{next(self._dirs)}")

    def start(self) -> None:
        self.proc = self._spawn({})
        self.proc.wait_event("first_step_done", 120)
        self._hello(self.incarnation)
        self.command(self.pb.COMMAND_KIND_SUSPEND)

    def pause(self, seconds: float, steps: int = 1) -> Any:
        """Resume, train for about `seconds` and at least `steps` steps, suspend again;
        returns the suspend's ack. Under load a time alone could train no step at all (a
        suspend that arrives before the training thread runs again is applied at the very
        boundary the resume was): it then resumes again until the step has advanced,
        which costs nothing when it has (the suspend's ack carries the step)."""
        start = self.command(self.pb.COMMAND_KIND_RESUME).step
        time.sleep(seconds)
        deadline = time.monotonic() + 120
        while True:
            ack = self.command(self.pb.COMMAND_KIND_SUSPEND)
            if ack.step >= start + steps:
                return ack
            assert time.monotonic() < deadline, (
                f"trained {ack.step - start} of {steps} steps in 120 s; log:\n{self.proc.log()}")
            self.command(self.pb.COMMAND_KIND_RESUME)
            time.sleep(0.05)

    def checkpoint(self) -> None:
        self.last_checkpoint = self.command(self.pb.COMMAND_KIND_CHECKPOINT, self._dir("periodic"))

    def migrate_warm(self, rehearse: bool = True, signature: bool = True, devices: int | None = None,
                     rehearsed: bool | None = None) -> Any:
        """Pre-warm the next process (with the source's signature, as the scheduler
        passes it; on `devices` devices: a grow or shrink), stop this one for
        migration, activate the warm one. `rehearsed`: whether the warm process must
        have rehearsed a step (by default, when it had a signature and was let)."""
        from tf_runtime import EXIT_MIGRATED

        extra = {} if rehearse else {"GANDIVA_WARM_STEP": "0"}
        if signature:
            reported = self.server.of_kind(self.job_id, "train_signature")
            assert reported, "the source never reported its first training run"
            extra["GANDIVA_WARM_SIGNATURE"] = reported[-1].json
        old, nxt = self.proc, self._spawn(extra, warm=True, devices=devices)
        ready = nxt.wait_event("warm_ready", 120)
        # The rehearsal ran, or was switched off, or had no signature to go by.
        assert ("warm_step_s" in ready) == (rehearse and signature if rehearsed is None
                                            else rehearsed)
        ack = self.command(self.pb.COMMAND_KIND_STOP_FOR_MIGRATION, self._dir("migrate"))
        nxt.send_control({"cmd": "activate", "restore_checkpoint": ack.checkpoint_path})
        assert nxt.wait_event("restored")["step"] == ack.step
        assert self._hello(self.incarnation).restored_step == ack.step
        self.command(self.pb.COMMAND_KIND_SUSPEND)
        assert old.wait() == EXIT_MIGRATED
        self.proc = nxt
        return ack

    def migrate_naive(self, devices: int | None = None) -> Any:
        """Stop for migration, then a cold start (on `devices` devices) that restores the checkpoint."""
        from tf_runtime import EXIT_MIGRATED

        ack = self.command(self.pb.COMMAND_KIND_STOP_FOR_MIGRATION, self._dir("naive"))
        assert self.proc.wait() == EXIT_MIGRATED
        self._restart_from(ack, devices)
        return ack

    def crash_and_restart(self, devices: int | None = None) -> None:
        """The host is lost (the process killed): restart from the last checkpoint
        (on `devices` devices)."""
        from tf_runtime import EXIT_KILLED

        if self.last_checkpoint is None:
            self.checkpoint()
            self.pause(0.1)  # steps after it are lost with the host, and redone
        self.command(self.pb.COMMAND_KIND_KILL)
        assert self.proc.wait() == EXIT_KILLED
        self._restart_from(self.last_checkpoint, devices)

    def _restart_from(self, ack: Any, devices: int | None = None) -> None:
        self.proc = self._spawn({"GANDIVA_RESTORE_CHECKPOINT": ack.checkpoint_path}, devices=devices)
        assert self.proc.wait_event("restored", 120)["step"] == ack.step
        assert self._hello(self.incarnation).restored_step == ack.step
        self.command(self.pb.COMMAND_KIND_SUSPEND)

    def finish(self) -> None:
        self.command(self.pb.COMMAND_KIND_RESUME)
        assert self.proc.wait() == 0
