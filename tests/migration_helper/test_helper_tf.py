"""Real TensorFlow: the MLP example under the real shim, moved between two real
helpers by migrate(), through the shared mount and streamed over gRPC. The job
goes on at the destination from exactly the step its checkpoint holds."""

from __future__ import annotations

from pathlib import Path

import pytest

import tf_runtime.examples
from migration_helper.local_control import LocalControl
from migration_protocol.fast_path import MigrationPlan, Outcome, migrate
from protos.gandiva.v1 import common_pb2, helper_pb2

from .conftest import MakeHelper

MLP = str(Path(tf_runtime.examples.__file__).parent / "mlp.py")


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False], ids=["shared-mount", "streamed"])
async def test_real_tf_job_migrates_and_keeps_its_step(
    control: LocalControl, make_helper: MakeHelper, tmp_path: Path, shared: bool
) -> None:
    s1, s2 = await make_helper("s1", shared=shared), await make_helper("s2", shared=shared)
    spec = common_pb2.JobSpec(command=["python", MLP, "--replicas", "2", "--steps", "100000000"],
                              workdir=str(tmp_path), gpus=2)
    started = await control.helper_command("s1", helper_pb2.HelperCommand(launch=helper_pb2.LaunchJob(
        job_id="mlp", incarnation="i0", spec=spec, gpu_indices=[0, 1], wait_first_step=True)), 120)
    assert started.ok, started.message
    await control.wait_for(lambda: control.steps("mlp", "i0") >= 50, 60, "the job to train")
    plan = MigrationPlan(job_id="mlp", spec=spec, source=control.endpoint("s1"), source_incarnation="i0",
                         source_gpus=(0, 1), dest=control.endpoint("s2"), dest_gpus=(2, 3),
                         dest_incarnation="i1")
    result = await migrate(plan, control)
    assert result.outcome is Outcome.MIGRATED, result.reason
    assert result.step >= 50
    # The shim's manifest names the job and the step; one replica's state was saved.
    manifest = (Path(result.checkpoint_path) / "gandiva.json").read_text()
    assert '"mlp"' in manifest and str(result.step) in manifest
    await control.wait_for(lambda: control.exit_of("mlp", "i0"), 30, "the source to exit")
    exit_ = control.exit_of("mlp", "i0")
    assert exit_ is not None and (exit_.exit_code, exit_.reason) == (75, "migrated")
    await control.wait_for(lambda: control.steps("mlp", "i1") > result.step + 20, 60, "training at s2")
    assert [k for k, p in s1.jobs.processes.items() if p.alive] == []
    assert [k for k, p in s2.jobs.processes.items() if p.alive] == [("mlp", "i1")]
    log = (tmp_path / "logs" / "mlp.log").read_text()
    assert f"restored step {result.step}" in log
