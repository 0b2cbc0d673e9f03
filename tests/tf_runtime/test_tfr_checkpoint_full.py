"""A checkpoint written into a full file system, or damaged before its restore (the ramdisk or shared mount full when
a job saves for a migration or a periodic checkpoint): the command fails with the
reason and the job trains on, untouched; nothing half-written is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import runtime_pb2 as pb

from ..migration_helper.test_ramdisk_transfer import small_tmpfs  # noqa: F401 - a fixture
from .test_tfr_end_to_end import hello_of
from .test_tfr_tf_session import controller, saved_after_one_step, session, trainable_graph  # noqa: F401 - controller: a fixture

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


def test_a_checkpoint_damaged_after_it_was_written_is_refused_as_damaged(
        controller: Any, tmp_path: Path) -> None:  # noqa: F811
    """Bytes of the data file changed (same size: the manifest's sizes still match) before
    the restore: refused as damaged, not as "does not fit this graph", nothing restored."""
    import numpy as np

    from tf_runtime.checkpoint import CheckpointError

    g, gs, train, init, variables = trainable_graph(replicas=1)
    with session(g) as sess:
        adapter, data = saved_after_one_step(sess, init, train, tmp_path / "ck")
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        sess.run(train)
        before = {v.name: sess.run(v) for v in variables}
        with pytest.raises(CheckpointError, match=r"is damaged .* Checksum does not match") as err:
            adapter.restore(str(tmp_path / "ck"))
        assert "does not fit" not in str(err.value) and "\n" not in str(err.value)
        for v in variables:
            np.testing.assert_array_equal(sess.run(v), before[v.name])
        assert sess.run(gs) == 2
