"""A checkpoint transfer to a peer helper that cannot be reached fails with one line
naming the peer (it lands in the job's history), not the gRPC error's multi-line repr."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from migration_helper.jobs import CommandFailed, JobTable
from protos.gandiva.v1 import helper_pb2


def test_a_transfer_to_an_unreachable_peer_fails_with_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "model.ckpt.index").write_bytes(b"x" * 64)
    table = JobTable(server="s1", scheduler="x:1", log_dir=tmp_path, on_exit=lambda p: None)
    req = helper_pb2.TransferCheckpoint(job_id="j-1", checkpoint_path=str(checkpoint),
                                        dest_address=f"127.0.0.1:{port}", checkpoint_name="resume-1")
    with pytest.raises(CommandFailed) as failed:
        asyncio.run(table.transfer(req))
    message = str(failed.value)
    assert message.startswith(f"transfer: could not send the checkpoint to the helper at 127.0.0.1:{port}: "
                              "UNAVAILABLE: "), message
    assert "\n" not in message and "AioRpcError" not in message and "debug_error_string" not in message, message
    # The scheduler acts on the field, not on these words (they may be reworded).
    assert failed.value.transfer_fault == helper_pb2.TRANSFER_FAULT_DEST_REFUSED


@pytest.mark.parametrize("empty", [False, True])
def test_a_transfer_of_a_checkpoint_this_helper_lacks_says_so_in_its_result(tmp_path: Path, empty: bool) -> None:
    """The checkpoint to send is not here (missing, or an empty directory): the failure is
    marked TRANSFER_FAULT_CHECKPOINT_MISSING (the scheduler then starts the job from step 0
    at once instead of asking this helper twice more), and its words name the directory."""
    checkpoint = tmp_path / "ck"
    if empty:
        checkpoint.mkdir()
    table = JobTable(server="s1", scheduler="x:1", log_dir=tmp_path, on_exit=lambda p: None)
    req = helper_pb2.TransferCheckpoint(job_id="j-1", checkpoint_path=str(checkpoint),
                                        dest_address="127.0.0.1:1", checkpoint_name="resume-1")
    with pytest.raises(CommandFailed) as failed:
        asyncio.run(table.transfer(req))
    assert failed.value.transfer_fault == helper_pb2.TRANSFER_FAULT_CHECKPOINT_MISSING
    assert str(checkpoint) in str(failed.value)
