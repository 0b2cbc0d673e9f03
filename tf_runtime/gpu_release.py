"""Pluggable release of accelerator memory while a job is suspended.

* `CpuBackend`: nothing to release (CPU-only TensorFlow, virtual GPUs).
* `CudaCheckpointBackend`: the CUDA driver's process checkpoint API (driver 550+,
  `cuCheckpointProcessLock/Checkpoint/Restore/Unlock` in libcuda). Checkpoint copies
  the process's device memory to host memory and frees the GPU; restore copies it
  back. NVIDIA's own tool (`cuda-checkpoint`) drives these calls from a separate
  process, so by default the backend does the same: it runs
  `python -m tf_runtime.gpu_release checkpoint|restore PID` and waits for it.
* `NoReleaseBackend`: a GPU is in use but the driver lacks the API; suspension then
  holds the memory (the controller says so in its ack) or, when the command names a
  checkpoint directory, checkpoints and exits so the scheduler restarts the job.

`select_backend()` picks one from GANDIVA_GPU_RELEASE (cpu | cuda | auto, default auto).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess
import sys
from typing import Protocol

log = logging.getLogger(__name__)

# CUprocessState values (cuda.h, CUDA 12.8+).
PROCESS_STATE_NAMES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class ReleaseError(RuntimeError):
    """The backend could not release or reacquire the device memory."""


class GpuReleaseBackend(Protocol):
    """What the controller calls around a suspension."""

    name: str
    releases_memory: bool

    def release(self) -> None: ...

    def reacquire(self) -> None: ...


class CpuBackend:
    """Nothing to release: the process holds no accelerator memory."""

    name = "cpu"
    releases_memory = True  # trivially: there is no device memory held

    def release(self) -> None:
        return None

    def reacquire(self) -> None:
        return None


class NoReleaseBackend:
    """A GPU is used but cannot be released in place (no driver checkpoint API)."""

    name = "none"
    releases_memory = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def release(self) -> None:
        return None

    def reacquire(self) -> None:
        return None


class CudaDriver:
    """ctypes binding of the driver's process checkpoint API."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        for fn in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                   "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                   "cuCheckpointProcessGetState"):
            if not hasattr(lib, fn):
                raise ReleaseError(f"libcuda has no {fn} (the driver predates CUDA 12.8's checkpoint API)")
            getattr(lib, fn).restype = ctypes.c_int
        self._check("cuInit", lib.cuInit(0))

    @classmethod
    def load(cls) -> CudaDriver:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            return cls(ctypes.CDLL(name))
        except OSError as exc:
            raise ReleaseError(f"no NVIDIA driver library ({name}): {exc}") from exc

    def _check(self, fn: str, rc: int) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self._lib.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise ReleaseError(f"{fn} failed with CUresult {rc}: {text}")

    def state(self, pid: int) -> str:
        st = ctypes.c_int()
        self._check("cuCheckpointProcessGetState",
                    self._lib.cuCheckpointProcessGetState(pid, ctypes.byref(st)))
        return PROCESS_STATE_NAMES.get(st.value, str(st.value))

    def checkpoint(self, pid: int) -> None:
        """Lock (waits for outstanding work) then move device memory to the host."""
        # NULL args: default lock timeout (wait for running work to finish).
        self._check("cuCheckpointProcessLock", self._lib.cuCheckpointProcessLock(pid, None))
        self._check("cuCheckpointProcessCheckpoint",
                    self._lib.cuCheckpointProcessCheckpoint(pid, None))

    def restore(self, pid: int) -> None:
        self._check("cuCheckpointProcessRestore", self._lib.cuCheckpointProcessRestore(pid, None))
        self._check("cuCheckpointProcessUnlock", self._lib.cuCheckpointProcessUnlock(pid, None))


class CudaCheckpointBackend:
    """Releases GPU memory with the driver's process checkpoint API."""

    name = "cuda-checkpoint"
    releases_memory = True

    def __init__(self, pid: int | None = None, in_process: bool = False,
                 timeout_s: float = 60.0) -> None:
        self.pid = pid or os.getpid()
        self.in_process = in_process
        self.timeout_s = timeout_s
        # Loaded either way: fail now, with the reason, rather than at the first suspend.
        driver = CudaDriver.load()
        self._driver = driver if in_process else None

    def _do(self, action: str) -> None:
        if self._driver is not None:
            getattr(self._driver, action)(self.pid)
            return
        proc = subprocess.run(
            [sys.executable, "-m", "tf_runtime.gpu_release", action, str(self.pid)],
            capture_output=True, text=True, timeout=self.timeout_s, check=False,
        )
        if proc.returncode != 0:
            raise ReleaseError(f"{action} of pid {self.pid}: {proc.stderr.strip()}")

    def release(self) -> None:
        self._do("checkpoint")

    def reacquire(self) -> None:
        self._do("restore")


def select_backend(choice: str | None = None) -> GpuReleaseBackend:
    """The backend for this process (GANDIVA_GPU_RELEASE: cpu | cuda | auto)."""
    choice = (choice or os.environ.get("GANDIVA_GPU_RELEASE", "auto")).lower()
    if choice == "cpu":
        return CpuBackend()
    if choice not in ("auto", "cuda"):
        raise ValueError(f"GANDIVA_GPU_RELEASE={choice!r}: expected cpu, cuda or auto")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if choice == "auto" and (not visible or visible in ("-1", "")):
        return CpuBackend()
    try:
        return CudaCheckpointBackend()
    except ReleaseError as exc:
        if choice == "cuda":
            raise
        if ctypes.util.find_library("cuda") is None:
            # Virtual GPUs on a machine without the driver: nothing to release.
            return CpuBackend()
        log.warning("GPU memory cannot be released on suspend: %s", exc)
        return NoReleaseBackend(str(exc))


def main(argv: list[str] | None = None) -> int:
    """`python -m tf_runtime.gpu_release checkpoint|restore|state PID` (used by the backend)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("checkpoint", "restore", "state"):
        print("usage: python -m tf_runtime.gpu_release checkpoint|restore|state PID", file=sys.stderr)
        return 2
    try:
        driver = CudaDriver.load()
        if args[0] == "state":
            print(driver.state(int(args[1])))
        else:
            getattr(driver, args[0])(int(args[1]))
    except ReleaseError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
