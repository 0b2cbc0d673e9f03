"""Fixtures for the helper's tests: the in-memory control plane over real gRPC,
helper daemons in this process (their jobs are real child processes), and the
fake job program."""

from __future__ import annotations

import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl
from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

HERE = Path(__file__).parent


@pytest.fixture
async def control() -> AsyncIterator[LocalControl]:
    ctl = LocalControl(heartbeat_interval_s=0.2)
    await ctl.start()
    yield ctl
    await ctl.stop()


MakeHelper = Callable[..., Awaitable[HelperDaemon]]


@pytest.fixture
async def make_helper(control: LocalControl, tmp_path: Path) -> AsyncIterator[MakeHelper]:
    started: list[HelperDaemon] = []

    async def make(name: str, shared: bool = False, **kw: object) -> HelperDaemon:
        config = HelperConfig(
            server_name=name, scheduler=control.address, ramdisk=tmp_path / "ramdisks" / name,
            shared_root=(tmp_path / "ramdisks") if shared else None, log_dir=tmp_path / "logs",
            sample_interval_s=0.1, report_interval_s=0.3, stop_grace_s=3.0, **kw,  # type: ignore[arg-type]
        )
        daemon = HelperDaemon(config, CpuBackend(4, name))
        await daemon.start()
        started.append(daemon)
        await control.wait_for(lambda: name in control.servers, 10, f"{name} to register")
        return daemon

    yield make
    for daemon in started:
        await daemon.stop()


@pytest.fixture
def fake_job(tmp_path: Path) -> str:
    """The fake job as an executable whose name is not python (so it runs without the shim)."""
    path = tmp_path / "fake-job"
    path.write_text(f"#!{sys.executable}\n" + (HERE / "fake_job.py").read_text())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


SubmitEndless = Callable[[scheduler_pb2_grpc.SchedulerStub], tuple[str, Callable[[], common_pb2.Job]]]


@pytest.fixture
def submit_endless(fake_job: str, tmp_path: Path) -> SubmitEndless:
    """Submits, through a scheduler's API, a 1-GPU fake job that trains until it is stopped
    (a step every 20 ms); returns its id and a reader of the job as the scheduler has it."""
    def submit(api: scheduler_pb2_grpc.SchedulerStub) -> tuple[str, Callable[[], common_pb2.Job]]:
        spec = common_pb2.JobSpec(name="f", command=[fake_job], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEPS": "0", "FAKE_STEP_S": "0.02"})
        job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id
        return job_id, lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=5)
    return submit
