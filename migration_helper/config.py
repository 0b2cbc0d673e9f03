"""The helper's settings, with their defaults, validated in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from migration_protocol.host_memory import server_host_memory
from scheduler.config import gandiva_home, scheduler_address
from scheduler.transport import ClientSecurity, ServerTls
from scheduler.validation import MAX_SERVER_GPUS, SERVER_NAME, SERVER_NAME_RULE

DEFAULT_LISTEN = "127.0.0.1:0"
DEFAULT_VIRTUAL_GPUS = 4
# The shortest --sample-interval taken (seconds).
MIN_SAMPLE_S = 0.01


class ConfigError(ValueError):
    """A setting is invalid; the message names it."""


def default_ramdisk(server: str) -> Path:
    """/dev/shm where it exists (a RAM-backed tmpfs on Linux), else under GANDIVA_HOME."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else gandiva_home() / "ramdisk"
    return base / f"gandiva-{server}"


def default_log_dir() -> Path:
    return gandiva_home() / "logs"


@dataclass(frozen=True)
class HelperConfig:
    """What one helper daemon needs to know. ``gpus`` None means: NVML if a driver
    exists, else DEFAULT_VIRTUAL_GPUS virtual GPUs."""

    server_name: str
    scheduler: str = field(default_factory=lambda: scheduler_address(None))
    listen: str = DEFAULT_LISTEN
    gpus: int | None = None
    ramdisk: Path | None = None
    shared_root: Path | None = None
    log_dir: Path | None = None
    sample_interval_s: float = 1.0
    report_interval_s: float = 5.0
    stop_grace_s: float = 10.0
    # Old checkpoints stay this long in the ramdisk (a migration may fall back on one);
    # one the scheduler still names as a job's restore point stays as long as it does.
    checkpoint_retain_s: float = 600.0
    # A shorter lease than the scheduler's (None: the scheduler's, sent at registration).
    lease_s: float | None = None
    # The helper's token and TLS trust, towards the scheduler and its peers' agents.
    security: ClientSecurity = field(default_factory=ClientSecurity)
    # The agent port's certificate (and client CA: only cluster members may connect).
    tls: ServerTls | None = None
    insecure: bool = False
    # The largest checkpoint a peer may stream in.
    max_transfer_bytes: int = 64 << 30
    # The host memory this server's jobs may hold, reported at registration: None
    # measures it (MemTotal, or the cgroup's memory.max when lower); 0 reports nothing
    # (the scheduler does not check host memory on this server).
    host_memory_bytes: int | None = None
    # Virtual GPUs even where NVML finds real ones (`gandiva helper --virtual`).
    virtual: bool = False

    def __post_init__(self) -> None:
        if not SERVER_NAME.fullmatch(self.server_name):  # the scheduler refuses any other
            raise ConfigError(f"--server-name {self.server_name!r}: use {SERVER_NAME_RULE}")
        if self.gpus is not None and self.gpus < 1:
            raise ConfigError(f"--gpus {self.gpus}: must be at least 1")
        if self.gpus is not None and self.gpus > MAX_SERVER_GPUS:  # the scheduler would refuse it, again and again
            raise ConfigError(f"--gpus {self.gpus}: a server has at most {MAX_SERVER_GPUS}")
        if ":" not in self.listen:
            raise ConfigError(f"--listen {self.listen!r}: expected HOST:PORT")
        # `not x > 0` and isfinite: NaN compares false with everything and passed `x <= 0`.
        if self.lease_s is not None and not (self.lease_s > 0 and math.isfinite(self.lease_s)):
            raise ConfigError(f"--lease {self.lease_s}: must be a positive number of seconds")
        for flag, value in (("--sample-interval", self.sample_interval_s), ("report interval", self.report_interval_s)):
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{flag} {value}: must be a positive number of seconds")
        if self.sample_interval_s < MIN_SAMPLE_S:
            # 1e-9 was taken: a report was due every round(5 s / 1e-9) samples, so none was
            # ever sent (no GPU figures, no job profiles) while the loop sampled flat out.
            raise ConfigError(f"--sample-interval {self.sample_interval_s:g}: at least {MIN_SAMPLE_S} s "
                              "(a GPU's figures change no faster; default 1)")
        if not self.max_transfer_bytes > 0:
            raise ConfigError(f"--max-transfer-gib {self.max_transfer_bytes / (1 << 30):g} "
                              f"(max_transfer_bytes {self.max_transfer_bytes}): must be positive; "
                              "it caps the checkpoint a peer may stream in")
        if not self.checkpoint_retain_s > 0:
            raise ConfigError(f"--checkpoint-retain {self.checkpoint_retain_s}: must be positive (seconds)")
        if self.host_memory_bytes is not None and self.host_memory_bytes < 0:
            raise ConfigError(f"--host-memory {self.host_memory_bytes}: must not be negative")

    @property
    def reported_host_memory(self) -> int:
        """What registration reports: the flag's value, else this machine's (or cgroup's)."""
        if self.host_memory_bytes is not None:
            return self.host_memory_bytes
        return server_host_memory()

    @property
    def housekeeping_s(self) -> float:
        """How often the ramdisk is pruned: every minute, or a quarter of a shorter retention."""
        return min(60.0, max(0.5, self.checkpoint_retain_s / 4))

    @property
    def ramdisk_dir(self) -> Path:
        return (self.ramdisk or default_ramdisk(self.server_name)).resolve()

    @property
    def logs_dir(self) -> Path:
        return (self.log_dir or default_log_dir()).resolve()
