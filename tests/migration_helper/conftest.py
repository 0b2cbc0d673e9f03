"""Fixtures for the helper's tests: the in-memory control plane over real gRPC,
helper daemons in this process (their jobs are real child processes), and the
fake job program."""

from __future__ import annotations

import contextlib
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
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


@contextlib.contextmanager
def failing_ext4(where: Path) -> Iterator[Path]:
    """An ext4 file system of its own (64 MiB, on a loop device) mounted at ``where``
    with errors=remount-ro, as a disk's usually is; yields the file that makes it fail
    (ext4's trigger_fs_error: the kernel records an error and turns the file system
    read-only, as it does on a disk's I/O error). Unmounted after. Skips where it cannot
    be made (root only; mkfs.ext4 and loop devices needed)."""
    if shutil.which("mkfs.ext4") is None or shutil.which("findmnt") is None:
        pytest.skip("mkfs.ext4 or findmnt is not installed: no ext4 file system of the test's own")
    where.mkdir(parents=True, exist_ok=True)
    image = where.with_name(f"{where.name}.ext4")
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-qF", str(image)], check=True, capture_output=True)
    made = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(where)],
                          check=False, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a loop device here (root only): {made.stderr.strip()}")
    try:
        dev = Path(subprocess.run(["findmnt", "-no", "SOURCE", str(where)], check=True, capture_output=True,
                                  text=True).stdout.strip()).name
        trigger = Path(f"/sys/fs/ext4/{dev}/trigger_fs_error")
        if not trigger.exists():
            pytest.skip(f"{trigger} is not there: this kernel cannot make ext4 fail on demand")
        yield trigger
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)
        image.unlink(missing_ok=True)
