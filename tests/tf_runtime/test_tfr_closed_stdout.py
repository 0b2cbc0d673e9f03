"""A program started with its standard output closed (`python train.py >&-`, a launcher or a
daemon that closes its descriptors): Python then has no `sys.stdout` (None), and the shim's
exit on Gandiva's command flushed it before leaving. Every such exit (`gandiva kill`, a stop
for migration) raised AttributeError in the program's own session.run: a traceback, the
process failing with status 1 instead of 143 or 75, the helper left to end it. Real
TensorFlow, a real Runtime server."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from protos.gandiva.v1 import runtime_pb2 as pb
from tf_runtime import EXIT_KILLED, EXIT_MIGRATED

from .conftest import EXAMPLES

pytestmark = [pytest.mark.tf, pytest.mark.slow]


@pytest.mark.parametrize(("kind", "closed"), [("kill", ">&-"), ("migrate", ">&- 2>&-")],
                         ids=["kill-stdout", "migrate-stdout-and-stderr"])
def test_a_program_without_stdout_exits_on_command_with_the_shims_status(
        runtime_server: Any, launch: Any, tmp_path: Any, closed: str, kind: str) -> None:
    command = ["sh", "-c", f'exec "$0" "$@" {closed}', sys.executable, "-m", "tf_runtime.run",
               str(EXAMPLES / "mlp.py")]
    job = launch("mlp.py", "--steps", "100000", "--step-sleep", "0.01", command=command,
                 env={"GANDIVA_JOB_ID": "c", "GANDIVA_SCHEDULER": runtime_server.address})
    job.wait_event("first_step_done", 120)
    runtime_server.wait_for(lambda j, m: j == "c" and m.HasField("hello"), 60)
    if kind == "kill":
        ack = runtime_server.wait_ack(runtime_server.send("c", pb.COMMAND_KIND_KILL))
        expected = EXIT_KILLED
    else:
        ack = runtime_server.wait_ack(runtime_server.send("c", pb.COMMAND_KIND_STOP_FOR_MIGRATION,
                                                          str(tmp_path / "ck")))
        expected = EXIT_MIGRATED
    assert ack.ok, ack.message
    assert (job.wait(), job.log()) == (expected, job.log())  # (on main: 1, an AttributeError's traceback)
    assert "AttributeError" not in job.log()
