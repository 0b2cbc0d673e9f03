"""migrate() end to end with real helpers and real job processes (the fake job
speaks the shim's protocols): the fast path with and without a shared mount, and
its faults. Every test checks that the job runs exactly once afterwards, from the
step it had reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from migration_helper.daemon import HelperDaemon
from migration_helper.local_control import LocalControl
from migration_protocol.fast_path import MigrationPlan, MigrationTimeouts, Outcome, migrate
from protos.gandiva.v1 import common_pb2, helper_pb2

from .conftest import MakeHelper


async def start_job(control: LocalControl, fake_job: str, tmp_path: Path) -> common_pb2.JobSpec:
    spec = common_pb2.JobSpec(command=[fake_job], workdir=str(tmp_path), gpus=1)
    result = await control.helper_command("s1", helper_pb2.HelperCommand(launch=helper_pb2.LaunchJob(
        job_id="j1", incarnation="i0", spec=spec, gpu_indices=[0])), 10)
    assert result.ok, result.message
    await control.wait_for(lambda: control.steps("j1", "i0") >= 20, 15, "the job to train")
    return spec


def _spec_with(spec: common_pb2.JobSpec, env: dict[str, str]) -> common_pb2.JobSpec:
    out = common_pb2.JobSpec()
    out.CopyFrom(spec)
    out.env.update(env)
    return out


def running(helper: HelperDaemon) -> list[tuple[str, str]]:
    return sorted(k for k, p in helper.jobs.processes.items() if p.alive)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-mount", "streamed"])
async def test_job_moves_and_continues_from_its_step(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path, shared: bool
) -> None:
    s1, s2 = await make_helper("s1", shared=shared), await make_helper("s2", shared=shared)
    spec = await start_job(control, fake_job, tmp_path)
    result = await migrate(_plan(control, spec), control)
    assert result.outcome is Outcome.MIGRATED, result.reason
    assert result.step >= 20 and result.checkpoint_path.startswith(str(tmp_path / "ramdisks" / "s2"))
    await control.wait_for(lambda: control.exit_of("j1", "i0"), 10, "the source's exit")
    exit_ = control.exit_of("j1", "i0")
    assert exit_ is not None and (exit_.exit_code, exit_.reason) == (75, "migrated")
    await control.wait_for(lambda: control.steps("j1", "i1") >= result.step + 10, 10, "training at s2")
    assert running(s1) == [] and running(s2) == [("j1", "i1")]
    phases = {p for _, p, _, _ in control.phases}
    assert {"prewarm", "save", "transfer", "restore", "first_step", "total"} <= phases


@pytest.mark.parametrize("old_shim", [False, True], ids=["shim", "old_shim"])
async def test_a_wrapper_does_not_go_on_after_its_program_stopped_for_the_migration(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path, old_shim: bool
) -> None:
    """`bash -c 'python train.py; python eval.py'` (no exec): after the program's exit for
    the migration, the source's wrapper used to go on with its script as if training had
    ended (an evaluation of the half-trained model on the source's GPUs while the
    destination trains, run again at the real end) and the launch's exit was the script's
    (0, "finished"). Now the shim stops the wrapper as it exits and the helper ends the
    launch with 75; the destination runs the whole command. Behind a process the shim's
    stop does not reach (old_shim), the wrapper goes on, as before."""
    s1, s2 = await make_helper("s1", shared=True), await make_helper("s2", shared=True)
    marker = tmp_path / "after-the-program"
    spec = common_pb2.JobSpec(command=["bash", "-c", f"{fake_job}; echo evaluated on $GANDIVA_SERVER >> {marker}"],
                              workdir=str(tmp_path), gpus=1, env={"FAKE_OLD_SHIM": "1"} if old_shim else {})
    started = await control.helper_command("s1", helper_pb2.HelperCommand(launch=helper_pb2.LaunchJob(
        job_id="j1", incarnation="i0", spec=spec, gpu_indices=[0])), 10)
    assert started.ok, started.message
    await control.wait_for(lambda: control.steps("j1", "i0") >= 5, 15, "the job to train")
    result = await migrate(_plan(control, spec), control)
    assert result.outcome is Outcome.MIGRATED, result.reason
    await control.wait_for(lambda: control.exit_of("j1", "i0"), 30, "the source's exit")
    exit_ = control.exit_of("j1", "i0")
    assert exit_ is not None
    if old_shim:
        assert (exit_.exit_code, exit_.reason) == (0, "finished")
        assert marker.read_text() == "evaluated on s1\n"
        return
    assert (exit_.exit_code, exit_.reason) == (75, "migrated")
    assert not marker.exists()
    assert running(s1) == [] and running(s2) == [("j1", "i1")]
    log = (tmp_path / "logs" / "j1.log").read_text()
    assert "its program exited with 75 (migrated); the rest of the launch's command is not run here" in log


def _plan(control: LocalControl, spec: common_pb2.JobSpec, **env: str) -> MigrationPlan:
    return MigrationPlan(job_id="j1", spec=_spec_with(spec, env), source=control.endpoint("s1"),
                         source_incarnation="i0", source_gpus=(0,), dest=control.endpoint("s2"),
                         dest_gpus=(1,), dest_incarnation="i1", fallback_incarnation="i2")


@pytest.mark.parametrize("mode", ["die_warm", "hang_warm"])
async def test_destination_failing_to_prewarm_leaves_the_job_untouched(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path, mode: str
) -> None:
    s1, s2 = await make_helper("s1"), await make_helper("s2")
    spec = await start_job(control, fake_job, tmp_path)
    result = await migrate(_plan(control, spec, FAKE_MODE=mode), control, MigrationTimeouts(prewarm_s=2))
    assert result.outcome is Outcome.STAYED and (result.server, result.incarnation) == ("s1", "i0")
    before = control.steps("j1", "i0")
    await control.wait_for(lambda: control.steps("j1", "i0") >= before + 10, 10, "the source to go on")
    await control.wait_for(lambda: running(s2) == [], 10, "the destination process to be gone")
    assert running(s1) == [("j1", "i0")] and control.exit_of("j1", "i0") is None


async def test_destination_dying_in_restore_restarts_at_the_source_from_the_checkpoint(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    s1, s2 = await make_helper("s1"), await make_helper("s2")
    spec = await start_job(control, fake_job, tmp_path)
    result = await migrate(_plan(control, spec, FAKE_MODE="die_restore"), control)
    assert result.outcome is Outcome.RESTARTED_AT_SOURCE, result.reason
    assert (result.server, result.incarnation) == ("s1", "i2")
    # The restarted process begins exactly at the checkpoint's step, then trains on.
    await control.wait_for(lambda: control.connected("j1", "i2"), 10, "the restarted job")
    log = (tmp_path / "logs" / "j1.log").read_text()
    assert log.count("=== gandiva: job j1") == 3  # source, destination, restart
    await control.wait_for(lambda: control.steps("j1", "i2") >= result.step + 10, 10, "training")
    assert running(s2) == [] and running(s1) == [("j1", "i2")]
    exit_ = control.exit_of("j1", "i0")
    assert exit_ is not None and exit_.reason == "migrated"
