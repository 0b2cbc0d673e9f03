"""A whole secured cluster on real processes: a scheduler with --auth token, a helper
with its own token, and a job whose runtime reports progress with the token the
helper minted for it (never the helper's own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler import auth
from scheduler.transport import ClientSecurity

from .conftest import make_token

HERE = Path(__file__).resolve().parents[2] / "migration_helper"


def test_a_job_reports_progress_with_its_scoped_token(secured: Any, connect: Any, tmp_path: Path, wait_for: Any) -> None:
    fake = tmp_path / "fake-job"
    fake.write_text(f"#!{sys.executable}\n" + (HERE / "fake_job.py").read_text())
    fake.chmod(0o755)
    helper_token = make_token(secured.db_url, "s1", "helper")
    env = {**os.environ, "GANDIVA_TOKEN": helper_token, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "s1", "--gpus", "1",
         "--virtual", "--scheduler", secured.address, "--ramdisk", str(tmp_path / "rd"),
         "--log-dir", str(tmp_path / "logs")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        alice = scheduler_pb2_grpc.SchedulerStub(connect(secured.address, make_token(secured.db_url, "alice")))
        spec = common_pb2.JobSpec(command=[str(fake)], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEP_S": "0.05", "GANDIVA_TOKEN": "stolen?"})
        job_id = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).steps >= 10, 60)
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_runtime_token_a_helper_mints_is_for_one_launch() -> None:
    from migration_helper.jobs import JobTable

    table = JobTable(server="s1", scheduler="x:1", log_dir=Path("/tmp"), on_exit=lambda p: None,
                     security=ClientSecurity(token="gdv.s1.secret", tls_ca="ca.pem"))
    env = table.runtime_credentials("j-1", "inc1")
    assert env["GANDIVA_TOKEN"] == auth.runtime_token("gdv.s1.secret", "j-1", "inc1")
    assert "secret" not in env["GANDIVA_TOKEN"] and env["GANDIVA_TLS_CA"].endswith("ca.pem")
    assert table.runtime_credentials("j-1", "inc2")["GANDIVA_TOKEN"] != env["GANDIVA_TOKEN"]


async def test_commands_cannot_reach_outside_the_ramdisk_or_shared_root(tmp_path: Path) -> None:
    from migration_helper.jobs import JobTable
    from protos.gandiva.v1 import helper_pb2

    table = JobTable(server="s1", scheduler="x:1", log_dir=tmp_path, on_exit=lambda p: None,
                     roots=[tmp_path / "rd"])
    (tmp_path / "rd").mkdir()
    for path in ("/etc", str(tmp_path / "rd" / ".." / "elsewhere"), "/dev/shm/../etc"):
        result = await table.handle(helper_pb2.HelperCommand(command_id="c", transfer=helper_pb2.TransferCheckpoint(
            job_id="j-1", checkpoint_path=path, dest_address="127.0.0.1:9")))
        assert not result.ok and "outside this helper's ramdisk" in result.message
        result = await table.handle(helper_pb2.HelperCommand(command_id="d", launch=helper_pb2.LaunchJob(
            job_id="j-1", incarnation="i", restore_checkpoint=path,
            spec=common_pb2.JobSpec(command=["true"], gpus=1))))
        assert not result.ok and "outside" in result.message


async def test_a_checkpoint_over_the_cap_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    from migration_helper.ramdisk import Ramdisk, TransferTooLarge, checkpoint_chunks

    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.data").write_bytes(b"x" * 5000)
    ramdisk = Ramdisk(tmp_path / "rd", max_bytes=4096)
    ramdisk.prepare()

    async def chunks():  # type: ignore[no-untyped-def]
        for c in checkpoint_chunks(src, "j-1", chunk_bytes=1024):
            yield c

    import pytest

    with pytest.raises(TransferTooLarge):
        await ramdisk.receive(chunks())
    assert list((tmp_path / "rd").rglob("*.data")) == []


def test_the_transfer_cap_is_checked_by_the_helpers_settings(tmp_path: Path) -> None:
    """Whoever builds a HelperConfig (the CLI, a test, an embedding program) gets the
    same clear refusal of a cap that is not a positive size, naming the flag."""
    import pytest

    from migration_helper.config import ConfigError, HelperConfig

    for bad in (0, -1, -(64 << 30)):
        with pytest.raises(ConfigError, match="--max-transfer-gib.*must be positive"):
            HelperConfig(server_name="s1", ramdisk=tmp_path, max_transfer_bytes=bad)
    assert HelperConfig(server_name="s1", max_transfer_bytes=1).max_transfer_bytes == 1
    for flag in ("0", "-2", "nan", "-inf"):
        out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "s1",
                              f"--max-transfer-gib={flag}"], check=False, capture_output=True, text=True, timeout=60)
        # "must be positive" (a number <= 0) or "must be a positive number of GiB" (nan)
        assert out.returncode == 2 and f"--max-transfer-gib {flag}" in out.stderr, out
        assert "must be positive" in out.stderr or "must be a positive number" in out.stderr, out
