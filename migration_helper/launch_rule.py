"""How a job's command line becomes the process the helper starts, and its environment.

The rule: a command whose program is a Python interpreter (``python``,
``python3``, ``python3.11``, or a path to one) runs under the tf_runtime shim:
``python [interpreter options] -m tf_runtime.run SCRIPT ARGS``; ``python -m MODULE``
and ``python -c CODE`` run as they are (tf_runtime.run runs a script file; the
autoload below reaches them). A bare ``python``/``python3`` means the helper's own interpreter, where
tf_runtime is installed; an explicit path is kept. Any other program runs
as it is, and so does everything a wrapper starts (``env FOO=1 python train.py``,
``bash -c '...'``, a shell script that runs python): the shim reaches their Python
processes through the ``sitecustomize`` of tf_runtime.autoload, which the job's
environment puts first on PYTHONPATH (the job's own PYTHONPATH follows, and a
sitecustomize of its own still runs). A job none of whose processes connects a
runtime is marked uncontrollable by the scheduler (docs/tf_runtime.md). A leading
``setsid`` is dropped (see ``_without_setsid``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib
from collections.abc import Mapping, Sequence

from scheduler.transport import ENV_TLS_CERT, ENV_TLS_KEY, ENV_TOKEN
from scheduler.validation import LAUNCH_ENV_NAMES
from tf_runtime.autoload import DIRECTORY, PYTHON_ENV, path_with_autoload

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# Interpreter options that take a separate value (python -W ignore, -X dev).
_OPTS_WITH_VALUE = {"-W", "-X"}
_LONG_OPTS_WITH_VALUE = {"--check-hash-based-pycs"}
# Variables only the helper may set for a launch; never inherited from its own environment.
_HELPER_ONLY = (
    "GANDIVA_WARM",
    "GANDIVA_CONTROL_FD",
    "GANDIVA_STATUS_FD",
    "GANDIVA_RESTORE_CHECKPOINT",
    "GANDIVA_JOB_ID",
    "GANDIVA_INCARNATION",
    "GANDIVA_WARM_SIGNATURE",
    # Set by a job's first runtime process for its descendants (tf_runtime.runtime): a new
    # launch is never the descendant of one, whatever environment it was submitted from.
    "GANDIVA_RUNTIME_PID",
    "GANDIVA_GPUS",  # the job's CUDA_VISIBLE_DEVICES, for every process of it (tf_runtime.launch_devices)
    PYTHON_ENV,  # the PYTHON* variables a `python -E` / `-I` launch set aside (isolated_launch)
    # The helper's own credentials (named where they are read): a job gets a token scoped
    # to itself instead, and the CA only.
    ENV_TOKEN,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
)


def is_python(program: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(program)))


def _split_options(args: list[str]) -> tuple[list[str], list[str]]:
    """(the interpreter's options, the rest: SCRIPT ARGS, or -m MODULE / -c CODE / - and
    theirs), read as CPython reads its command line: short options combine (`-u -m pkg` may
    be written `-um pkg`, `-uc CODE`, `-uX dev`), one that takes a value takes the rest of
    its word or the next word (`-Xdev`, `-X dev`), and `--` ends the options. A word taken
    whole as an option used to swallow its `m` or `c` (`python -um trainpkg.task` started
    `python -um -m tf_runtime.run trainpkg.task`, which fails: "No module named -m")."""
    i, opts = 0, list[str]()
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        word = args[i]
        if word == "--":  # the script follows; the rest is its own
            return opts, args[i + 1:]
        if word.startswith("--"):  # --check-hash-based-pycs MODE, --version, ...
            opts.append(word)
            if word in _LONG_OPTS_WITH_VALUE and i + 1 < len(args):
                opts.append(args[i + 1])
                i += 1
            i += 1
            continue
        for j, char in enumerate(word[1:], start=1):
            if char in "mc":  # the module or code: the rest is the program's
                if j > 1:
                    opts.append(word[:j])
                value = word[j + 1:]
                tail = [value, *args[i + 1:]] if value else args[i + 1:]
                return opts, [f"-{char}", *tail]
            if f"-{char}" in _OPTS_WITH_VALUE:
                opts.append(word)
                if j == len(word) - 1 and i + 1 < len(args):  # `-X dev`, `-uX dev`
                    opts.append(args[i + 1])
                    i += 1
                break
        else:
            opts.append(word)
        i += 1
    return opts, args[i:]


def _same_version(program: str) -> bool:
    """Whether a bare `python`, `python3` or `python3.11` names the helper's own version: one
    that names another (`python3.9`) used to be run by the helper's interpreter all the same,
    silently; it is now looked up on PATH as given (and runs without the shim if it lacks
    tf_runtime, as behind a wrapper)."""
    version = _PYTHON.match(os.path.basename(program))
    wanted = version.group(1) if version else None
    return not wanted or [int(p) for p in wanted.split(".")] == list(sys.version_info[:wanted.count(".") + 1])


# util-linux setsid's options (-c/--ctty, -f/--fork, -w/--wait); -h and -V run nothing.
_SETSID_OPTS = {"-c", "--ctty", "-f", "--fork", "-w", "--wait"}


def _without_setsid(command: Sequence[str]) -> list[str]:
    """The command `setsid [OPTIONS] COMMAND...` runs. The helper starts every job in a
    session of its own already, as its process group's leader, and setsid run by a group
    leader forks its command and exits at once (`-f` always does): the launch ended there,
    its program killed with it, the job "finished" in a second without a step."""
    words = list(command[1:])
    while words and words[0].startswith("-"):
        word = words.pop(0)
        if word == "--":
            break
        if word not in _SETSID_OPTS and not (len(word) > 2 and word[1] != "-"
                                             and all(f"-{c}" in _SETSID_OPTS for c in word[1:])):
            raise ValueError(f"command {list(command)!r}: setsid option {word!r} is not one of -c, -f, -w: "
                             "give the program and its arguments (every job runs in a session of its own, "
                             "setsid adds nothing)")
    if not words:
        raise ValueError(f"command {list(command)!r}: setsid runs no program; give the program and its "
                         "arguments (every job runs in a session of its own, setsid adds nothing)")
    return words


def shim_command(command: Sequence[str], interpreter: str = sys.executable) -> list[str]:
    """The argv to start for a job's command (see the module docstring)."""
    if not command:
        raise ValueError("command: empty; give the program and its arguments")
    if os.path.basename(command[0]) == "setsid":
        return shim_command(_without_setsid(command), interpreter)
    program = command[0]
    if not is_python(program):
        return list(command)
    python = interpreter if os.sep not in program and _same_version(program) else program
    opts, rest = _split_options(list(command[1:]))
    if rest[:2] == ["-m", "tf_runtime.run"]:  # already wrapped by the user
        rest = rest[2:]
    if not rest:
        raise ValueError(f"command {list(command)!r}: no script, module or -c code to run; "
                         "give e.g. python train.py ARGS or python -m package.module ARGS")
    if rest[0] in ("-c", "-m", "-"):
        # tf_runtime.run runs a script file (runpy.run_path); a module, -c code or stdin
        # has none: it runs as it is, and the autoload's sitecustomize starts the shim in
        # it when it imports TensorFlow, as behind any wrapper.
        return [python, *opts, *rest]
    return [python, *opts, "-m", "tf_runtime.run", *rest]


def job_environment(
    base: Mapping[str, str],
    job_env: Mapping[str, str],
    *,
    job_id: str,
    incarnation: str,
    scheduler: str,
    server: str,
    gpu_indices: Sequence[int],
    restore_checkpoint: str = "",
) -> dict[str, str]:
    """The server's environment, the job's own variables on top, then Gandiva's."""
    env = {k: v for k, v in base.items() if k not in _HELPER_ONLY}
    # Nor from the job's own variables (a scheduler refuses them in a spec; an older one did
    # not): GANDIVA_RESTORE_CHECKPOINT there made a launch without one restore from it.
    env.update({k: v for k, v in job_env.items() if k not in LAUNCH_ENV_NAMES and k != PYTHON_ENV})
    env["PYTHONPATH"] = path_with_autoload(env.get("PYTHONPATH"))
    # Every incarnation of a job hashes strings alike (a vocabulary built as
    # `list(set(words))` keeps its word ids across a migration or restart), whatever the
    # server's own setting; the job's own value wins.
    if "PYTHONHASHSEED" not in job_env:
        env["PYTHONHASHSEED"] = str(zlib.crc32(job_id.encode()))
    # Logs are followed live (gandiva logs -f); a block-buffered stdout would hide them.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(
        GANDIVA_JOB_ID=job_id,
        GANDIVA_INCARNATION=incarnation,
        GANDIVA_SCHEDULER=scheduler,
        GANDIVA_SERVER=server,
        CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpu_indices),
    )
    env["GANDIVA_GPUS"] = env["CUDA_VISIBLE_DEVICES"]
    if restore_checkpoint:
        env["GANDIVA_RESTORE_CHECKPOINT"] = restore_checkpoint
    return env


def _drop_isolation(opts: list[str]) -> tuple[list[str], bool, bool]:
    """(the options less -E and -I, whether -E was given, whether -I was), reading short
    options combined as `_split_options` does (`-uE`, `-IB`; a -W/-X value is kept whole)."""
    out, ignore_env, isolated, value_next = list[str](), False, False, False
    for word in opts:
        if value_next or word.startswith("--") or not word.startswith("-"):
            out.append(word)
            value_next = False
            continue
        kept = "-"
        for j, char in enumerate(word[1:], start=1):
            if f"-{char}" in _OPTS_WITH_VALUE:
                kept += word[j:]
                value_next = j == len(word) - 1
                break
            if char == "E":
                ignore_env = True
            elif char == "I":
                isolated = True
            else:
                kept += char
        if kept != "-":
            out.append(kept)
    return out, ignore_env, isolated


def isolated_launch(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """`python -E` / `-I` as the helper starts it (`argv` from shim_command, `env` from
    job_environment). Both make Python ignore every PYTHON* variable, so the autoload on
    PYTHONPATH and the job's PYTHONHASHSEED never reached such a process: under `python -E
    -m pkg.train` no shim started (the job uncontrollable), and each incarnation hashed
    strings with another random seed (a vocabulary built as `list(set(words))` numbered
    its words anew after a migration or restart). The option is carried out in the
    environment instead: the process starts without it and with no PYTHON* variable but
    the autoload's PYTHONPATH, the job's hash seed and PYTHONUNBUFFERED (for -I also
    PYTHONNOUSERSITE and PYTHONSAFEPATH: no user site, no script directory on sys.path);
    the variables set aside travel in GANDIVA_PYTHON_ENV, and the autoload puts them back
    into its os.environ at start-up, so its children inherit them as they would have."""
    argv = list(argv)
    if not argv or not is_python(argv[0]):
        return argv, dict(env)
    opts, rest = _split_options(argv[1:])
    opts, ignore_env, isolated = _drop_isolation(opts)
    if not (ignore_env or isolated):
        return argv, dict(env)
    aside = {k: v for k, v in env.items() if k.startswith("PYTHON")}
    out = {k: v for k, v in env.items() if not k.startswith("PYTHON")}
    out["PYTHONPATH"] = DIRECTORY
    for name in ("PYTHONHASHSEED", "PYTHONUNBUFFERED"):
        if name in env:
            out[name] = env[name]
    if isolated:
        out.update(PYTHONNOUSERSITE="1", PYTHONSAFEPATH="1")
    out[PYTHON_ENV] = json.dumps(aside)
    return [argv[0], *opts, *rest], out
