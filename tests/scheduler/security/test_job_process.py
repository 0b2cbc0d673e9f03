"""What a job's own process can do on its server: it runs as the helper's user (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .conftest import make_token

ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534


def test_a_job_cannot_read_its_helpers_token_from_proc(secured: Any, connect: Any, wait_for: Any) -> None:
    """A job runs as its helper's user, so it read the helper's token from
    /proc/HELPER/environ - and with it could act as that server (register another agent
    address, be sent other servers' checkpoints). Now the helper is not dumpable: its
    environment and memory are root's only. Run as a user other than root (as root, the
    helper runs as nobody), since root reads every process's environment anyway."""
    as_other: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to run the helper as a user other than root")
        as_other = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    work = Path(tempfile.mkdtemp(prefix="gandiva-hostile-"))  # nobody may write here
    work.chmod(0o777)
    token = make_token(secured.db_url, "s1", "helper")
    helper = subprocess.Popen(
        [*as_other, sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "s1", "--gpus", "1",
         "--virtual", "--scheduler", secured.address, "--ramdisk", str(work / "rd"), "--log-dir", str(work / "logs")],
        env={**os.environ, "GANDIVA_TOKEN": token, "PYTHONPATH": str(ROOT), "GANDIVA_HOME": str(work)},
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        alice = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "alice")))
        probe = ('e=/proc/${GANDIVA_HELPER%%:*}/environ; if [ ! -e "$e" ]; then echo no-helper; '
                 'elif grep -qa "$TOKEN_START" "$e"; then echo read; elif cat "$e" >/dev/null; then echo no-token; '
                 'else echo refused; fi > out.tmp; mv out.tmp seen')
        alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["/bin/sh", "-c", probe], workdir=str(work), gpus=1, env={"TOKEN_START": token[:20]})))
        seen = work / "seen"
        wait_for(seen.exists, 60)
        assert seen.read_text().strip() == "refused"
    finally:
        os.killpg(helper.pid, 15)
        helper.wait(20)
        shutil.rmtree(work, ignore_errors=True)
