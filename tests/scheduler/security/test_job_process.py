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
        # GANDIVA_HELPER is "PID.START:RAMDISK" (migration_helper.process.owner_mark).
        probe = ('h=${GANDIVA_HELPER%%:*}; e=/proc/${h%%.*}/environ; if [ ! -e "$e" ]; then echo no-helper; '
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


def test_the_ramdisk_is_the_helpers_users_only(tmp_path: Path) -> None:
    """The checkpoints are the users' models. The default ramdisk /dev/shm/gandiva-SERVER was
    created 755 (every local user read them), and one that another user had made first (/dev/shm
    is everyone's) was used as it was, so that user read and could replace every checkpoint.
    Now a new ramdisk is 700, an existing one of this user's is made 700, and one of another
    user's stops the helper with one line naming it."""
    import stat

    from migration_helper.ramdisk import Ramdisk

    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh"
        Ramdisk(fresh).prepare()
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
        opened = tmp_path / "opened"
        opened.mkdir(mode=0o755)
        Ramdisk(opened).prepare()
        assert stat.S_IMODE(opened.stat().st_mode) == 0o700
    finally:
        os.umask(old)
    if os.geteuid() != 0:
        return  # making a directory another user's needs root
    squatted = tmp_path / "squatted"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, NOBODY, NOBODY)
    done = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "s1", "--gpus", "1", "--virtual",
         "--scheduler", "127.0.0.1:1", "--ramdisk", str(squatted), "--log-dir", str(tmp_path / "logs")],
        env={**os.environ, "PYTHONPATH": str(ROOT), "GANDIVA_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gandiva helper: ramdisk {squatted} belongs to another user (uid {NOBODY}, this helper runs as 0): it would "
        "hold the jobs' checkpoints; remove it, or give --ramdisk a directory of this user's"), done.stderr
