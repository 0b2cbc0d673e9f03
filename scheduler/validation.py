"""Validation of what users submit. Every error names the offending field.

The limits keep every stored row, and so every listing, of a bounded size: a job
whose spec is too large to list would break `gandiva get jobs` for everyone.
They also keep out what a database cannot store (PostgreSQL refuses NUL in text)
and what would garble a terminal (control characters in names).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence

from protos.gandiva.v1 import common_pb2, helper_pb2
from scheduler.errors import InvalidArgument

MAX_GPUS = 1024
MAX_SERVER_GPUS = 256       # GPUs one server registers (its helper's --gpus, or what NVML finds)
MAX_NAME = 256              # job and multi-job names
MAX_USER = 128
MAX_ID = 64                 # job ids, server names and other identifiers in requests
MAX_ARGS = 4096             # entries of a command
MAX_COMMAND_BYTES = 128 << 10  # a command's arguments, in total (Linux's ARG_MAX is 2 MiB)
MAX_WORKDIR = 4096
MAX_ENV_ENTRIES = 256
MAX_ENV_BYTES = 64 << 10    # names and values, in total
MAX_PARAMS = 64
MAX_PARAM_BYTES = 16 << 10  # names and values, in total
MAX_REASON = 1024           # free text a user attaches to an action
MAX_MEMBERS = 10_000        # jobs of one multi-job (sweep or array)
MAX_PRIORITY = 1_000_000
# A job's total mini-batches (JobSpec.steps): the largest whole number JSON carries exactly.
MAX_STEPS = 2**53
# What a job's runtime (inside the user's own process) or a helper reports of its pace:
# mini-batches a second, and one mini-batch's seconds. Outside these it is garbage or a
# lie (a mini-batch of a microsecond, or of more than a day), and is held to them.
MAX_RATE = 1e6
MAX_STEP_S = 86400.0
# The scheduler's receive limit: the largest valid request is a multi-job, whose
# members are checked one by one; this bounds the whole message before parsing.
MAX_REQUEST_BYTES = 16 << 20

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# C0 controls (tab included), DEL, C1 controls (U+009B is a terminal's CSI) and the Unicode
# bidirectional controls, with which a name displays as another (`\u202e` reverses the rest);
# and the line and paragraph separators, at which a listing's line was broken in two (a
# job named "x\u2028j-1  fake  RUNNING" showed a made-up row in `gandiva get jobs`).
_CONTROL_OR_TAB = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_text(field: str, value: str, limit: int, *, control_ok: bool = False) -> None:
    """A string field: at most `limit` bytes, no NUL, and no control characters
    unless `control_ok` (free text such as an argument or a variable's value)."""
    if _utf8_len(value) > limit:
        raise InvalidArgument(field, f"longer than {limit} bytes ({_utf8_len(value)})")
    if "\x00" in value:
        raise InvalidArgument(field, "contains a NUL character, which cannot be stored")
    if not control_ok and _CONTROL_OR_TAB.search(value):
        raise InvalidArgument(field, "contains control characters (or Unicode bidirectional controls); "
                                     "use printable text")


def clean_text(value: str, limit: int = 4096) -> str:
    """Free text a helper or runtime reports (an error message, an exit reason), made
    storable rather than refused: a refused report would be retried forever."""
    value = value.replace("\x00", "\ufffd")
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def clean_number(x: float, low: float = -math.inf, high: float = math.inf) -> float:
    """A number a helper or runtime reports, made storable rather than refused: NaN and
    infinities (SQLite turns NaN into NULL, PostgreSQL's JSON refuses it) become 0, and the
    rest is held to [low, high]."""
    return min(high, max(low, x)) if math.isfinite(x) else 0.0


def clean_rate(x: float) -> float:
    """A reported mini-batch rate, 0 (not measured) .. MAX_RATE. One under a mini-batch a
    day is taken as not measured: 5e-324 mini-batches a second passed the NaN check and
    made its job's ETA infinite, which broke every listing and view of that job."""
    x = clean_number(x, 0.0, MAX_RATE)
    return x if x >= 1.0 / MAX_STEP_S else 0.0


def clean_step_s(x: float) -> float:
    """A reported mini-batch time, 0 (not measured) .. MAX_STEP_S seconds; one under a
    microsecond (1 / MAX_RATE) is taken as not measured."""
    x = clean_number(x, 0.0, MAX_STEP_S)
    return x if x >= 1.0 / MAX_RATE else 0.0


def check_id(field: str, value: str, required: bool = True) -> None:
    """An identifier a request names (a job id, a server name)."""
    if required and not value:
        raise InvalidArgument(field, "required")
    check_text(field, value, MAX_ID)


# A server's name, as its helper's --server-name takes it: a host name. It is a path
# component under a peer's --shared-root (SHARED-ROOT/NAME/JOB/...: where a migration's source
# writes the checkpoint for server NAME), so never "..", "." or "a/b": a helper registered as
# "../../tmp/x" had each job migrated to it told to save its checkpoint outside its shared root.
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
SERVER_NAME_RULE = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit (a host name)"


def check_server_name(field: str, name: str) -> None:
    """A server's name a helper registers."""
    check_id(field, name)
    if not SERVER_NAME.fullmatch(name):
        raise InvalidArgument(field, f"{name!r} is not a server name: use {SERVER_NAME_RULE}, e.g. the "
                              "server's host name (gandiva helper --server-name)")


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_key(user: str, request_id: str) -> str | None:
    """What a submission's request id is remembered as: per user, so that one user's id
    never finds another's job. None without an id."""
    if not request_id:
        return None
    if not _REQUEST_ID.fullmatch(request_id):
        shown = request_id[:64] if request_id[:64].isprintable() else ascii(request_id[:64])
        raise InvalidArgument("request_id", f"{shown!r} ({len(request_id)} characters): give 1-128 of "
                                            "A-Z a-z 0-9 . _ : - (a UUID will do), or none")
    return f"{user}\n{request_id}"


def _check_map(field: str, mapping: Mapping[str, str], max_entries: int, max_bytes: int,
               key_pattern: re.Pattern[str] | None) -> None:
    if len(mapping) > max_entries:
        raise InvalidArgument(field, f"{len(mapping)} entries; at most {max_entries}")
    total = 0
    for key, value in mapping.items():
        if key_pattern is not None and not key_pattern.match(key):
            raise InvalidArgument(field, f"{key[:64]!r} is not a valid variable name")
        # The key as it is when printable, escaped otherwise: the error stays one line.
        shown = key[:64] if key[:64].isprintable() else ascii(key[:64])
        check_text(f"{field}[{shown}]", key, max_bytes)
        check_text(f"{field}[{shown}]", value, max_bytes, control_ok=True)
        total += _utf8_len(key) + _utf8_len(value)
    if total > max_bytes:
        raise InvalidArgument(field, f"{total} bytes in total; at most {max_bytes}")


def _check_command(field: str, command: Iterable[str]) -> None:
    args = list(command)
    if len(args) > MAX_ARGS:
        raise InvalidArgument(field, f"{len(args)} arguments; at most {MAX_ARGS}")
    total = 0
    for i, arg in enumerate(args):
        if "\x00" in arg:
            raise InvalidArgument(f"{field}[{i}]", "contains a NUL character, which no program can receive")
        total += _utf8_len(arg)
        if total > MAX_COMMAND_BYTES:
            raise InvalidArgument(
                field, f"the arguments exceed {MAX_COMMAND_BYTES} bytes in total; pass large "
                "inputs in a file on the server instead"
            )


def check_priority(field: str, priority: int) -> None:
    if priority < 0:
        raise InvalidArgument(field, f"{priority} is negative; use 0 or more")
    if priority > MAX_PRIORITY:
        raise InvalidArgument(field, f"{priority} exceeds {MAX_PRIORITY}")


# Variables the helper sets for each launch of a job (migration_helper/launch_rule.py).
LAUNCH_ENV_NAMES = frozenset({
    "GANDIVA_WARM", "GANDIVA_CONTROL_FD", "GANDIVA_STATUS_FD", "GANDIVA_RESTORE_CHECKPOINT", "GANDIVA_JOB_ID",
    "GANDIVA_INCARNATION", "GANDIVA_WARM_SIGNATURE", "GANDIVA_RUNTIME_PID", "GANDIVA_SOURCE_TOWERS",
    "GANDIVA_HELPER", "GANDIVA_LAUNCH",
})


def validate_spec(spec: common_pb2.JobSpec, field: str = "spec") -> None:
    """Raise InvalidArgument naming the first bad field of `spec`."""
    _check_command(f"{field}.command", spec.command)
    if not spec.command or not spec.command[0].strip():
        raise InvalidArgument(f"{field}.command", "empty command; give the program to run")
    if not is_power_of_two(spec.gpus):
        raise InvalidArgument(
            f"{field}.gpus", f"{spec.gpus} is not a power of two >= 1 (1, 2, 4, 8, ...)"
        )
    if spec.gpus > MAX_GPUS:
        raise InvalidArgument(f"{field}.gpus", f"{spec.gpus} exceeds the limit of {MAX_GPUS}")
    check_priority(f"{field}.priority", spec.priority)
    if not 0 <= spec.steps <= MAX_STEPS:
        raise InvalidArgument(f"{field}.steps", f"{spec.steps} is not a number of mini-batches from 1 to "
                                                f"{MAX_STEPS} (0: not known)")
    check_text(f"{field}.workdir", spec.workdir, MAX_WORKDIR)
    if spec.workdir and not os.path.isabs(spec.workdir):
        raise InvalidArgument(f"{field}.workdir", f"{spec.workdir!r} is not an absolute path")
    check_text(f"{field}.name", spec.name, MAX_NAME)
    check_text(f"{field}.user", spec.user, MAX_USER)
    if spec.multi_job_id:
        # Only the scheduler groups jobs: a client naming a multi-job would slip its job into
        # another's sweep (its listing, `gandiva wait`, an AutoML driver's ranking).
        raise InvalidArgument(f"{field}.multi_job_id", "is set by the scheduler (SubmitMultiJob's reply names "
                                                        "it); leave it empty")
    _check_map(f"{field}.env", spec.env, MAX_ENV_ENTRIES, MAX_ENV_BYTES, _ENV_NAME)
    for name in LAUNCH_ENV_NAMES.intersection(spec.env):
        # They steer one launch (restore from, hold for a pre-warm, its pipes): from a spec,
        # GANDIVA_RESTORE_CHECKPOINT made every launch restore from any path, and
        # GANDIVA_WARM=1 held the job before its first step for good.
        raise InvalidArgument(f"{field}.env", f"{name} is set by the helper for each launch; leave it out")
    _check_map(f"{field}.params", spec.params, MAX_PARAMS, MAX_PARAM_BYTES, None)
    if spec.index < 0:
        raise InvalidArgument(f"{field}.index", f"{spec.index} is negative")


# Exits a helper's registration carries (RegisterServerRequest.exits): those its stopped
# predecessor could not deliver, one per job process it ran. The helper sends no more
# (migration_helper/undelivered.py): refused, a registration is sent again as it was.
MAX_REGISTER_EXITS = 10_000


def check_exit(x: helper_pb2.ProcessExitRequest, prefix: str = "") -> None:
    """A process exit a helper reports (alone, or with its registration): its ids checked,
    its reason and steps cleaned in place."""
    check_id(f"{prefix}job_id", x.job_id)
    check_text(f"{prefix}incarnation", x.incarnation, 64)
    x.reason = clean_text(x.reason, 1024)
    x.steps = min(max(0, x.steps), MAX_STEPS)  # as a progress report's


def check_register_exits(server: str, exits: Sequence[helper_pb2.ProcessExitRequest]) -> None:
    """The exits a registration of `server` carries: its own, as many as a server can have
    had, each as ReportProcessExit takes it."""
    if len(exits) > MAX_REGISTER_EXITS:
        raise InvalidArgument("exits", f"{len(exits)} exits; at most {MAX_REGISTER_EXITS}")
    for i, x in enumerate(exits):
        if x.server != server:
            raise InvalidArgument(f"exits[{i}].server", f"{x.server!r}: not the registering server {server!r}")
        check_exit(x, f"exits[{i}].")


def validate_members(name: str, count: int) -> None:
    """A multi-job as a whole: its name and how many members it has."""
    check_text("name", name, MAX_NAME)
    if count == 0:
        raise InvalidArgument("jobs", "a multi-job needs at least one job")
    if count > MAX_MEMBERS:
        raise InvalidArgument("jobs", f"{count} members; at most {MAX_MEMBERS} in one multi-job")


def default_name(spec: common_pb2.JobSpec) -> str:
    """A job without a name is called after its program's script (e.g. `train`)."""
    if spec.name:
        return spec.name
    args = [a for a in spec.command if not a.startswith("-")]
    script = next((a for a in args[1:] if a.endswith(".py")), args[0] if args else "job")
    name = os.path.splitext(os.path.basename(script))[0] or "job"
    # Derived from an argument, which may hold anything: keep it a printable name.
    return _CONTROL_OR_TAB.sub("?", name)[:MAX_NAME] or "job"
