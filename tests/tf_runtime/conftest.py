"""Fixtures for the tf_runtime tests: a fake session world for the wrapper chain,
a real local Runtime gRPC server, and launching example jobs as real processes."""

from __future__ import annotations

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
                 log_path: Path | None = None, status: bool = True) -> None:
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
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tf_runtime.run", str(EXAMPLES / script), *args],
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
                warm: bool = False, status: bool = True) -> Job:
        job = Job(script, list(args), env or {}, warm, tmp_path / f"job{len(jobs)}.log", status)
        jobs.append(job)
        return job

    yield _launch
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
