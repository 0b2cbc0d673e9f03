"""`gandiva scheduler --runtime-connect-deadline S`: how long a launched job's processes
have to connect the Gandiva runtime before the job is marked not suspendable and not
migratable. Bad values are refused naming the flag; a given value is the one applied
(and quoted by `gandiva describe`). A real scheduler, a real `gandiva helper`, a real
job that never connects (bash, no TensorFlow)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gandiva_cli.main import main
from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]
DEADLINE_S = 2.5


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """`gandiva scheduler` run in-process configures the root logger onto this test's
    captured stderr; later tests must not log into that closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("flag", "value", "says"), [
    *[("--runtime-connect-deadline", v, "must be more than 0 seconds") for v in ("0", "-1", "nan", "inf")],
    *[("--checkpoint-wait", v, "must be 0 or more seconds") for v in ("-1", "nan", "inf")],
    *[(flag, v, "must be 0 or more seconds") for flag in ("--hang-after", "--hang-restart-after")
      for v in ("-1", "nan", "inf")],
])
def test_a_timing_flag_that_is_not_a_number_of_seconds_is_refused_naming_the_flag(
        flag: str, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:  # a usage error (argparse), on stderr
        main(["scheduler", flag, value, "--listen", "127.0.0.1:0",
              "--db", f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert f"argument {flag}: {says}" in err, err
    assert not (tmp_path / "g.db").exists(), "the database was touched before the flags were checked"


def test_the_deadline_given_on_the_command_line_is_the_one_applied(
        tmp_path: Path, wait_for: Any, capsys: pytest.CaptureFixture[str]) -> None:
    port_file = tmp_path / "port"
    sched = subprocess.Popen(
        [*GANDIVA, "scheduler", "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--tick", "0.2",
         "--db", f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", "--heartbeat-interval", "0.5",
         "--runtime-connect-deadline", str(DEADLINE_S)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    helper = None
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60)
        address = port_file.read_text().strip()
        helper = subprocess.Popen(
            [*GANDIVA, "helper", "--server-name", "s1", "--gpus", "1", "--virtual", "--scheduler", address,
             "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with grpc.insecure_channel(address) as ch:
            api = scheduler_pb2_grpc.SchedulerStub(ch)
            spec = common_pb2.JobSpec(name="never", command=["bash", "-c", "sleep 120"], workdir=str(tmp_path), gpus=1)
            job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
            get = lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=10)
            wait_for(lambda: get().state == common_pb2.JOB_STATE_RUNNING, 60)
            running_at = time.monotonic()
            assert get().suspendable, "marked uncontrollable before its deadline"
            wait_for(lambda: not get().suspendable, DEADLINE_S + 30)
            # Not before the deadline (the launch is confirmed before RUNNING is seen here).
            assert time.monotonic() - running_at > DEADLINE_S - 0.6
            assert not get().migratable
            assert main(["describe", "job", job_id, "--scheduler", address]) == 0
            described = capsys.readouterr().out
            assert re.search(rf"Suspendable:?\s+no \(no process of it connected the Gandiva runtime within "
                             rf"{DEADLINE_S:g}s", described), described
            api.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=10)
    finally:
        for proc in (helper, sched):
            if proc is not None:
                proc.terminate()
                proc.wait(20)

