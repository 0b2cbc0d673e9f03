"""Validation of what users submit. Every error names the offending field."""

from __future__ import annotations

import os
import re

from protos.gandiva.v1 import common_pb2
from scheduler.errors import InvalidArgument

MAX_GPUS = 1024
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def validate_spec(spec: common_pb2.JobSpec, field: str = "spec") -> None:
    """Raise InvalidArgument naming the first bad field of `spec`."""
    if not spec.command or not spec.command[0].strip():
        raise InvalidArgument(f"{field}.command", "empty command; give the program to run")
    if not is_power_of_two(spec.gpus):
        raise InvalidArgument(
            f"{field}.gpus", f"{spec.gpus} is not a power of two >= 1 (1, 2, 4, 8, ...)"
        )
    if spec.gpus > MAX_GPUS:
        raise InvalidArgument(f"{field}.gpus", f"{spec.gpus} exceeds the limit of {MAX_GPUS}")
    if spec.priority < 0:
        raise InvalidArgument(f"{field}.priority", f"{spec.priority} is negative; use 0 or more")
    if spec.workdir and not os.path.isabs(spec.workdir):
        raise InvalidArgument(f"{field}.workdir", f"{spec.workdir!r} is not an absolute path")
    if len(spec.name) > 256:
        raise InvalidArgument(f"{field}.name", "longer than 256 characters")
    for key in spec.env:
        if not _ENV_NAME.match(key):
            raise InvalidArgument(f"{field}.env", f"{key!r} is not a valid environment variable name")


def default_name(spec: common_pb2.JobSpec) -> str:
    """A job without a name is called after its program's script (e.g. `train`)."""
    if spec.name:
        return spec.name
    args = [a for a in spec.command if not a.startswith("-")]
    script = next((a for a in args[1:] if a.endswith(".py")), args[0] if args else "job")
    return os.path.splitext(os.path.basename(script))[0] or "job"
