"""GPU discovery and sampling: the CPU backend on real processes here, NVML where a
driver exists (skipped elsewhere, saying why)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from migration_helper.gpus import (
    CpuBackend,
    JobProcesses,
    NvmlBackend,
    NvmlUnavailable,
    open_backend,
    process_tree,
)


def _nvml_skip_reason() -> str | None:
    try:
        NvmlBackend().close()
        return None
    except NvmlUnavailable as exc:
        return f"no NVIDIA GPU here ({exc}); benchmarks/gpu_checks.py checks NVML on a GPU machine"


def test_virtual_gpus_and_per_job_memory_of_a_real_process() -> None:
    backend = CpuBackend(4, "s1")
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3] and gpus[0].uuid == "virtual-s1-0"
    # A child that holds 64 MiB, like a job holding GPU memory.
    child = subprocess.Popen([sys.executable, "-c",
                              "import time; x = bytearray(64 << 20); print(1, flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        jobs = {"j1": JobProcesses(process_tree(child.pid), (1, 2))}
        samples = backend.sample(jobs)
        per_job = {s.gpu_index: s for s in samples if s.job_id == "j1"}
        assert sorted(per_job) == [1, 2]
        # The job's memory is split over its two slots.
        assert sum(s.job_memory_bytes for s in per_job.values()) > 64 << 20
        idle = next(s for s in samples if s.gpu_index == 0 and not s.job_id)
        assert idle.memory_used_bytes == 0 and idle.utilization == 0.0
    finally:
        child.kill()
        child.wait()


def test_without_a_driver_the_helper_falls_back_to_virtual_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANDIVA_FORCE_VIRTUAL_GPUS", "1")
    backend = open_backend(2, "s1")
    assert backend.name == "cpu" and len(backend.gpus()) == 2


@pytest.mark.gpu
def test_nvml_reports_devices_and_samples() -> None:
    reason = _nvml_skip_reason()
    if reason:
        pytest.skip(reason)
    backend = NvmlBackend()
    try:
        gpus = backend.gpus()
        assert gpus and gpus[0].memory_total_bytes > 0 and gpus[0].uuid.startswith("GPU-")
        samples = backend.sample({})
        assert len(samples) == len(gpus) and all(0.0 <= s.utilization <= 1.0 for s in samples)
    finally:
        backend.close()
