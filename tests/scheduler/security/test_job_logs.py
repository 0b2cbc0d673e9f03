"""`gandiva logs`: a job's output, read through the scheduler from the server that ran
it, only by the job's owner and operators (--auth token); real scheduler, real helper
process, real job process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from gandiva_cli import main as gandiva_main
from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from ...in_process import run_gandiva
from .conftest import make_token

HERE = Path(__file__).resolve().parents[2] / "migration_helper"
ROOT = Path(__file__).resolve().parents[3]
GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]


def test_only_the_owner_and_operators_read_a_jobs_output(secured: Any, connect: Any, tmp_path: Path,
                                                          wait_for: Any, capsys: pytest.CaptureFixture[str]) -> None:
    def logs(address: str, job_id: str, token: str) -> subprocess.CompletedProcess[str]:
        """`gandiva logs JOB --scheduler ADDRESS --token TOKEN` through its entry function in
        this process (not a Python start per command), its output captured as a pipe does."""
        return run_gandiva(capsys, "logs", job_id, "--scheduler", address, "--token", token)

    fake = tmp_path / "fake-job"
    fake.write_text(f"#!{sys.executable}\n" + (HERE / "fake_job.py").read_text())
    fake.chmod(0o755)
    env = {**os.environ, "GANDIVA_TOKEN": make_token(secured.db_url, "s1", "helper"), "PYTHONPATH": str(ROOT)}
    helper = subprocess.Popen(
        [*GANDIVA, "helper", "--server-name", "s1", "--gpus", "1", "--virtual", "--scheduler", secured.address,
         "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tokens = {"alice": make_token(secured.db_url, "alice"), "bob": make_token(secured.db_url, "bob"),
              "root": make_token(secured.db_url, "root", "operator")}
    try:
        alice = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, tokens["alice"]))
        spec = common_pb2.JobSpec(command=[str(fake)], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEPS": "5", "FAKE_STEP_S": "0.01"})
        job_id = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
        # Finished: no placement any more; the log is found on the server that ran it.
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).state
                 == common_pb2.JOB_STATE_SUCCEEDED, 60)

        own = logs(secured.address, job_id, tokens["alice"])
        assert own.returncode == 0 and f"=== gandiva: job {job_id} incarnation" in own.stdout, own.stderr

        other = logs(secured.address, job_id, tokens["bob"])
        assert other.returncode != 0 and "belongs to another user" in other.stderr
        assert job_id not in other.stdout
        bob = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, tokens["bob"]))
        with pytest.raises(grpc.RpcError) as err:
            bob.ReadJobLog(scheduler_pb2.ReadJobLogRequest(id=job_id))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

        # An operator reads every job's output; in pages, it is the same bytes.
        root = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, tokens["root"]))
        pages, offset = [], 0
        while True:
            page = root.ReadJobLog(scheduler_pb2.ReadJobLogRequest(id=job_id, offset=offset, max_bytes=64))
            if not page.data:
                break
            assert len(page.data) <= 64 and page.server == "s1"
            pages.append(page.data)
            offset = page.next_offset
        assert b"".join(pages).decode() == own.stdout == (tmp_path / "logs" / f"{job_id}.log").read_text()
        assert logs(secured.address, job_id, tokens["root"]).stdout == own.stdout

        for bad, field in ((scheduler_pb2.ReadJobLogRequest(id=job_id, offset=-1), "offset"),
                           (scheduler_pb2.ReadJobLogRequest(id=job_id, max_bytes=(1 << 20) + 1), "max_bytes")):
            with pytest.raises(grpc.RpcError) as err:
                alice.ReadJobLog(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (err.value.details() or "")

        # A job's output with escape sequences, read by an operator on a terminal: before, printed as
        # it was, it set the terminal's title and clipboard (OSC 0, OSC 52). Now only its colours, line
        # ends and carriage returns act; piped (into a file) it stays byte for byte.
        shown = "\x1b[31mred\x1b[0m \x1b]52;c;cHduZWQ=\x07 \x1b]0;owned\x07 \u202eevil\rbar\n"
        hostile = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=[sys.executable, "-c", f"import sys; sys.stdout.write({shown!r})"], workdir=str(tmp_path),
            gpus=1))).job.id
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(id=hostile)).state
                 == common_pb2.JOB_STATE_SUCCEEDED, 60)
        assert shown in logs(secured.address, hostile, tokens["root"]).stdout  # piped: as it is, byte for byte
        assert _on_a_terminal("logs", hostile, "--scheduler", secured.address, "--token", tokens["root"]).count(
            "\x1b[31mred\x1b[0m \\x1b]52;c;cHduZWQ=\\x07 \\x1b]0;owned\\x07 \\u202eevil\rbar") == 1
    finally:
        helper.terminate()
        helper.wait(20)


def _on_a_terminal(*argv: str) -> str:
    """What `gandiva ARGV` prints to a terminal (a pseudo-terminal of its own), as raw text."""
    import pty

    leader, follower = pty.openpty()
    out = os.fdopen(follower, "w", encoding="utf-8", closefd=True)
    saved, sys.stdout = sys.stdout, out
    try:
        assert gandiva_main.main(list(argv)) == 0
    finally:
        sys.stdout = saved
        out.close()
    got = b""
    try:
        while chunk := os.read(leader, 1 << 16):
            got += chunk
    except OSError:  # EIO: every writer closed
        pass
    os.close(leader)
    return got.decode().replace("\r\n", "\n")
