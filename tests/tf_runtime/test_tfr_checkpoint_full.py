"""A checkpoint written into a full file system (the ramdisk or shared mount full when
a job saves for a migration or a periodic checkpoint): the command fails with the
reason and the job trains on, untouched; nothing half-written is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import runtime_pb2 as pb

from ..migration_helper.test_ramdisk_transfer import small_tmpfs  # noqa: F401 - a fixture
from .test_tfr_end_to_end import hello_of

pytestmark = [pytest.mark.tf]


def test_a_save_into_a_full_file_system_fails_the_command_and_the_job_trains_on(
        runtime_server: Any, launch: Any, small_tmpfs: Path, tmp_path: Path) -> None:  # noqa: F811
    job = launch("mlp.py", "--steps", "400", "--hidden", "1024", "--step-sleep", "0.01",
                 env={"GANDIVA_JOB_ID": "full", "GANDIVA_SCHEDULER": runtime_server.address})
    job.wait_event("first_step_done", timeout=120)
    hello_of(runtime_server, "full", "")
    for kind in (pb.COMMAND_KIND_CHECKPOINT, pb.COMMAND_KIND_STOP_FOR_MIGRATION):
        ack = runtime_server.wait_ack(runtime_server.send("full", kind, str(small_tmpfs / "ck")), 60)
        assert not ack.ok, ack.message
        assert "No space left" in ack.message or "space" in ack.message.lower(), ack.message
        assert job.proc.poll() is None, job.log()
    assert list(small_tmpfs.iterdir()) == []  # nothing half-written left
    # Still trains, and still checkpoints where there is room.
    ack = runtime_server.wait_ack(runtime_server.send("full", pb.COMMAND_KIND_CHECKPOINT, str(tmp_path / "ok")), 60)
    assert ack.ok, ack.message
    assert job.wait() == 0, job.log()
