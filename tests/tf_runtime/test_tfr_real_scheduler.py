"""The shim against the real scheduler service (scheduler/api/runtime_api.py) over gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2
from protos.gandiva.v1 import runtime_pb2 as pb
from tf_runtime import EXIT_KILLED
from tf_runtime.checkpoint import validate

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_real_scheduler_sees_progress_and_commands_work(scheduler_server: Any, launch: Any,
                                                        wait_for: Any, tmp_path: Path) -> None:
    core = scheduler_server.server.core
    detail = scheduler_server.call(core.submit(common_pb2.JobSpec(
        command=["python", "mlp.py"], gpus=1, name="shim-e2e")))
    job_id = detail.job.id
    job = launch("mlp.py", "--steps", "100000", "--step-sleep", "0.01", "--eval-every", "5",
                 env={"GANDIVA_JOB_ID": job_id, "GANDIVA_SCHEDULER": scheduler_server.address})
    wait_for(lambda: core.runtimes.connected(job_id))

    def call(kind: int, directory: str = "") -> Any:
        return scheduler_server.call(core.runtimes.call(job_id, kind, 60, checkpoint_dir=directory))

    assert call(pb.COMMAND_KIND_SUSPEND).ok
    assert call(pb.COMMAND_KIND_RESUME).ok
    ack = call(pb.COMMAND_KIND_CHECKPOINT, str(tmp_path / "ck"))
    assert ack.ok and validate(ack.checkpoint_path)["global_step"] == ack.step
    # The rate is measured from two mini-batches in a row since the last pause (the
    # checkpoint just applied is one), so the report at ack.step may still carry 0.
    row = wait_for(lambda: (j := scheduler_server.call(core.get_job(job_id)).job).steps > ack.step
               and j.rate > 0 and j)
    assert "loss" in row.metrics and row.migratable
    # tf_runtime.report() from the program; its evaluation runs are not counted as steps.
    row = wait_for(lambda: "eval_loss" in (j := scheduler_server.call(core.get_job(job_id)).job).metrics
               and j)
    assert call(pb.COMMAND_KIND_KILL).ok
    assert job.wait() == EXIT_KILLED
