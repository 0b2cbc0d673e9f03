"""The launch a process belongs to: the helper's mark, its pipes, the wrappers around it.

The Migration Helper starts a job's command with two pipes (GANDIVA_STATUS_FD,
GANDIVA_CONTROL_FD) and marks it with GANDIVA_LAUNCH, which every descendant inherits.
Two things follow here (no TensorFlow import):

- `helper_pipe`: a Python driver between the helper and the trainer
  (`subprocess.run([sys.executable, "train.py"])`, close_fds by default) leaves the trainer
  without the pipes' descriptors, or with those numbers naming its own files. The pipe is
  then reopened through the nearest process of the same launch that still holds it
  (/proc/PID/fd/N): the trainer used to exit 2 at `import tensorflow` ("not an open file
  descriptor") behind any wrapper that did not import TensorFlow itself.
- `end_launch`: a process that the shim ends on Gandiva's command (a stop for migration, a
  park, a kill, a pre-warm called off) stops the wrappers of its launch (its ancestors with
  the same mark) before it exits, and tells the helper on the status pipe
  (`{"event": "launch_end", "code": 75, ...}`), which ends the launch with that status once
  this process is gone. A wrapper without `exec` (`python train.py; python eval.py`) used
  to go on with the rest of its script on the source as if training had ended, while the
  destination trained: an evaluation of a half-trained model holding the source's GPUs,
  run again when the job really ended, and the launch's exit reported as the script's.
- `mark_trained` / `trainer_of_launch`: a process of the launch that trains leaves its pid in
  a file (removed by the helper when the launch ends). One started after it ended (the
  wrapper's `python eval.py` once training is done) knows it runs after the training: it
  answers the scheduler's suspend, checkpoint and migration at once, refusing them
  (tf_runtime.controller), instead of never (it reaches no training boundary): a migration
  tried then used to time out, fail, and re-queue the finished job from its last checkpoint.
  One started while it lives (`python train.py & python eval.py`) is a secondary, as a
  descendant of it is (tf_runtime.runtime): it used to take the job's stream from the
  trainer, so that the job's commands never reached it.
- `stream_standing`: one started before the trainer's first step (both launched at once)
  connected as a first process too, and whichever connected last held the job's stream;
  now it leaves the stream to the trainer once the trainer trains.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import tempfile
from collections.abc import Mapping

from .checkpoint import _alive  # (no TensorFlow import)

log = logging.getLogger(__name__)

LAUNCH_ENV = "GANDIVA_LAUNCH"


def carries(pid: int, item: bytes) -> bool:
    """Whether process `pid` has `item` (b"NAME=value") in its environment (False when gone or not ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return item in f.read().split(b"\0")
    except OSError:
        return False


def stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after COMM (STATE, PPID, ... : field N of proc(5) at index
    N - 3); empty when the process is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return []


def _parent(pid: int) -> int:
    fields = stat_fields(pid)
    try:
        return int(fields[1])
    except (ValueError, IndexError):
        return 0


def wrappers(env: Mapping[str, str]) -> list[int]:
    """This process's ancestors of the same launch, nearest first (none without a mark)."""
    mark = env.get(LAUNCH_ENV)
    if not mark:
        return []
    item = f"{LAUNCH_ENV}={mark}".encode()
    found: list[int] = []
    pid = os.getppid()
    while pid > 1 and pid not in found and carries(pid, item):
        found.append(pid)
        pid = _parent(pid)
    return found


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def helper_pipe(fd: int, write: bool, env: Mapping[str, str]) -> int | None:
    """A descriptor on the helper's pipe numbered `fd`: this process's own when it is that
    pipe, else one opened through the nearest ancestor of the launch that holds it at that
    number; None when neither does. (A driver's child may hold another pipe at that number,
    one of its own: its stdout's.)"""
    found = wrappers(env)
    try:  # the pipe the helper gave the launch's first process (the farthest wrapper)
        given = os.readlink(f"/proc/{found[-1]}/fd/{fd}") if found else ""
    except OSError:
        given = ""
    if _is_pipe(fd):
        try:
            own = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            own = ""
        if not given or own == given:
            return fd
    for pid in found:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            link = os.readlink(path)
            if not link.startswith("pipe:") or (given and link != given):
                continue
            opened = os.open(path, (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC)
        except OSError:
            continue
        log.info("the helper's %s pipe (fd %d) reached through pid %d of this launch (a "
                 "wrapper that did not pass it on)", "status" if write else "control", fd, pid)
        return opened
    return None


def end_launch(code: int, status_fd: int | None, env: Mapping[str, str]) -> list[int]:
    """Stop this launch's wrappers and tell the helper the launch ends with `code` (see
    the module docstring); returns the pids stopped. Nothing without the helper's mark or
    a status pipe to tell it on: a wrapper stopped with nobody told would hang for good."""
    found = wrappers(env)
    if not found:
        return []
    if status_fd is None:
        raw = env.get("GANDIVA_STATUS_FD", "")
        status_fd = helper_pipe(int(raw), True, env) if raw.isdigit() else None
    if status_fd is None:
        return []
    for pid in found:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass
    line = json.dumps({"event": "launch_end", "code": code, "pid": os.getpid(), "wrappers": found})
    try:
        os.write(status_fd, (line + "\n").encode())
    except OSError as exc:
        log.warning("could not tell the helper that this launch ends (%s): its wrappers go on", exc)
        for pid in found:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        return []
    return found


# The launch's files in the user's scratch folder: the pid of its latest process that
# trained, and that of the latest process that connected the job's control stream.
_KINDS = ("trained", "stream", "program")


def _launch_file(mark: str, kind: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", mark):
        return None
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, f"gandiva-scratch-{os.getuid()}", f"launch-{mark}.{kind}")


def _trained_flag(mark: str) -> str | None:
    return _launch_file(mark, "trained")


def _write_pid(env: Mapping[str, str], kind: str) -> None:
    path = _launch_file(env.get(LAUNCH_ENV, ""), kind)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not write this launch's %s mark (%s)", kind, exc)


def _read_pid(env: Mapping[str, str], kind: str) -> int | None:
    path = _launch_file(env.get(LAUNCH_ENV, ""), kind)
    if path is None:
        return None
    try:
        with open(path) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def mark_trained(env: Mapping[str, str]) -> None:
    """Leave the launch's mark that this process trains (its pid; see the docstring), and
    which program it runs (its command line)."""
    _write_pid(env, "trained")
    path = _launch_file(env.get(LAUNCH_ENV, ""), "program")
    if path is None:
        return
    try:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(_command_line())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not write this launch's program mark (%s)", exc)


def _command_line() -> bytes:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def runs_trainers_program(env: Mapping[str, str]) -> bool:
    """Whether this process runs the program the launch's latest trainer ran (the same
    command line: a wrapper that retries it), not another one (`python pretrain.py;
    python finetune.py`), whose checkpoints a restart of the launch could not use."""
    path = _launch_file(env.get(LAUNCH_ENV, ""), "program")
    if path is None:
        return False
    try:
        with open(path, "rb") as f:
            program = f.read()
    except OSError:
        return False
    return bool(program) and program == _command_line()


def trainer_of_launch(env: Mapping[str, str]) -> int | None:
    """The pid of the latest process of this launch that trained, if one did (alive or
    not), but this one."""
    pid = _read_pid(env, "trained")
    return pid if pid != os.getpid() else None


def alive(pid: int) -> bool:
    """Whether process `pid` lives (a zombie does not)."""
    return _alive(pid) and not gone(pid)


def gone(pid: int) -> bool:
    """Whether a process has exited (a zombie its stopped parent has not reaped counts)."""
    fields = stat_fields(pid)
    return not fields or fields[0] in (b"Z", b"X")


HOLD, RETAKE, LEAVE = "hold", "retake", "leave"


def claim_stream(env: Mapping[str, str]) -> None:
    """The launch's trainer connects the job's control stream, or a process that does not
    train has closed its own (see stream_standing)."""
    _write_pid(env, "stream")


def stream_standing(env: Mapping[str, str], trained: bool) -> tuple[str, int | None]:
    """What this process does with the job's control stream, and the launch's latest
    trainer (its pid, or None). Two processes of a launch started together (`python
    train.py & python eval.py`) are both first processes of the job: the job's stream is
    the one connected last, and it used to be the evaluation's as often as not, so the
    job's commands went to a process that never trains. The stream belongs to the
    launch's latest trainer (the mark `trained`): LEAVE, a process that has not trained
    while that trainer lives: it closes its stream for good, then claims the stream (the
    mark `stream`: its pid) so that the trainer connects again; RETAKE, that trainer's,
    once another process claimed it (the trainer's stream may have been replaced by the
    one just closed); HOLD otherwise (nothing to do; also without a mark)."""
    if not env.get(LAUNCH_ENV):
        return HOLD, None
    trainer = _read_pid(env, "trained")
    if trainer is None:
        return HOLD, None
    me = os.getpid()
    if trained:
        holder = _read_pid(env, "stream")
        return (RETAKE if trainer == me and holder not in (None, me) else HOLD), trainer
    if trainer != me and alive(trainer):
        return LEAVE, trainer
    return HOLD, trainer


def forget_launch(mark: str) -> None:
    """The launch ended: remove its marks (the helper)."""
    for kind in _KINDS:
        path = _launch_file(mark, kind)
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass


def forget_launches_but(live: set[str], before: float) -> list[str]:
    """Remove the marks of launches none of whose processes lives any more (`live`: the
    marks that live processes carry, read after `before`, a time.time()), written before
    `before` (one written since may be a launch started after the processes were read);
    returns the marks removed. A helper killed outright never removed its launches' marks
    (the helper, restarted, sweeps them: tf_runtime's marks are per user, so the marks of
    other helpers' live launches are among `live`)."""
    flag = _launch_file("x", "trained")
    if flag is None:
        return []
    folder = os.path.dirname(flag)
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        found = re.fullmatch(r"launch-([A-Za-z0-9_.-]{1,128}?)\.(?:trained|stream|program)(\.[0-9]+)?", name)
        if not found or found.group(1) in live:
            continue
        path = os.path.join(folder, name)
        try:
            if os.stat(path).st_mtime >= before:
                continue
            os.unlink(path)
        except OSError:
            continue
        removed.append(found.group(1))
    return removed
