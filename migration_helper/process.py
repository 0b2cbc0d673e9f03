"""One job process started by the helper: its pipes to the shim, its log, its exit.

The shim and the helper talk over two pipes (the pre-warm protocol agreed with
tf_runtime): the helper writes JSON command lines to GANDIVA_CONTROL_FD
({"cmd": "activate", "restore_checkpoint": DIR} or {"cmd": "exit"}), the shim
writes JSON event lines to GANDIVA_STATUS_FD (session_ready, warm_ready,
restored, first_step_done, checkpoint; launch_end: see tf_runtime.launch).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migration_helper.files import open_regular
from scheduler.pace import Pace
from tf_runtime import (  # the shim's exit codes (no TensorFlow import)
    EXIT_KILLED,
    EXIT_MIGRATED,
    EXIT_TOWERS_CHANGED,
)
from tf_runtime.checkpoint import _alive  # whether a pid lives (no TensorFlow import either)
from tf_runtime.launch import LAUNCH_ENV, carries, forget_launch, forget_launches_but, stat_fields
from tf_runtime.launch import gone as _gone

log = logging.getLogger(__name__)

# The status events the helper waits for; a job's shim writes a few of them per launch.
STATUS_EVENTS = frozenset({"session_ready", "warm_ready", "restored", "first_step_done", "launch_end"})
# A job's status pipe is read at STATUS_RATE lines a second past a burst of STATUS_BURST (the
# job's writes then wait on the full pipe), and at most STATUS_KEPT of its events are kept:
# the job is the user's own program, and one writing event lines as fast as it could held the
# helper's event loop (its heartbeats, every job's commands) and grew its memory without end.
STATUS_RATE, STATUS_BURST, STATUS_KEPT = 20, 200, 1000
# How long an exit waits for the rest of its status pipe (the runtime's last_step, written
# at its program's end) once the process and what it left running are gone.
STATUS_DRAIN_S = 1.0
# The most a last_step may say and still fit the exit report's int64 (the scheduler holds
# it to what a job's steps may be, as it does a progress report's).
MAX_LAST_STEP = 2**63 - 1


def _status_event(line: bytes) -> dict[str, Any] | None:
    """A status line's event: a JSON object whose "event" is a word; None for any other
    line. The job's process writes the pipe, and may write anything: a line whose event was
    a list (unhashable), or one nested 50,000 deep (RecursionError), ended the helper's
    reading of it, and the job's next write to it failed (BrokenPipeError: the job died)."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


# A shell says 128 + N for a command it ran that signal N killed. A job's script whose last
# line runs its python (`bash run.sh`: a script's last command is not exec'd) exited 137 when
# the kernel's OOM killer took that python, read "failed with exit code 137" and FAILED at
# once, where the same python launched alone (-9) is re-queued to resume from its restore
# point (scheduler/core.py KILLED_RESTARTS). A shell's 137 is reported as -9. (A program
# that itself exits 137 behind a shell reads as killed too, as container runtimes read it.)
SHELL_SIGKILLED = 128 + signal.SIGKILL
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"})
# env's options whose value is the next word (`env -u HOME bash run.sh`: HOME is no command).
ENV_VALUED = frozenset({"-u", "--unset", "-C", "--chdir"})


def _env_command(words: Sequence[str]) -> list[str]:
    """The command word of `env [OPTION]... [NAME=VALUE]... COMMAND [ARG]...` (``words[0]``
    is env), as a list of one; [] when it names none."""
    rest = iter(words[1:])
    for word in rest:
        if word in ENV_VALUED:
            next(rest, None)
        elif word in ("-S", "--split-string"):  # (its value is the command line, one word or many)
            return _env_command(["env", *" ".join(rest).split()])
        elif not word.startswith("-") and "=" not in word:
            return [word]
    return []


def runs_a_shell(argv: Sequence[str], workdir: str) -> bool:
    """Whether a job's command runs a shell: `bash run.sh`, `env X=1 sh -c ...`, or a
    script (`./run.sh`) whose first line names one (`#!/bin/bash`, `#!/usr/bin/env bash`)."""
    words = list(argv)
    for _ in range(2):  # the command, then a script's interpreter line
        while words and os.path.basename(words[0]) == "env":  # env [-OPTIONS] [NAME=VALUE]... COMMAND
            words = _env_command(words)
        if not words:
            return False
        if os.path.basename(words[0]) in SHELLS:
            return True
        try:  # (the job's own file: a regular one only, never a pipe that would block)
            with open_regular(Path(workdir or ".") / words[0]) as f:
                first = f.readline(256)
        except OSError:
            return False
        if not first.startswith(b"#!"):
            return False
        words = first[2:].decode(errors="replace").split()
    return False


def exit_reason(code: int, stopped: bool) -> str:
    """The word the scheduler records for an exit status (negative: killed by that signal)."""
    if code == 0:
        # A program that handles the helper's SIGTERM by exiting 0 (saves and exits
        # cleanly, as many do on preemption) has not finished: it was stopped.
        return "stopped" if stopped else "finished"
    if code == EXIT_MIGRATED:
        return "migrated"
    if code == EXIT_TOWERS_CHANGED:
        return ("refused to restore a checkpoint of another tower count (one tower per device: "
                "training on would change the result)")
    if stopped:
        return "stopped"
    if code == EXIT_KILLED:
        return "killed"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name if -code in signal.valid_signals() else -code}"
    return f"failed with exit code {code}"


class ProcessExited(RuntimeError):
    """The process ended while the helper was waiting for one of its events."""

    def __init__(self, code: int, waiting_for: str) -> None:
        super().__init__(f"the job process exited with code {code} before {waiting_for}")
        self.code = code


# If the helper dies (even by SIGKILL) its jobs get SIGTERM instead of living on
# unsupervised, holding GPUs nobody reports. util-linux's setpriv sets the parent-death
# signal and execs the job; a Python preexec_fn cannot do it safely: between fork and
# exec in a process with gRPC threads it can deadlock (seen here, one launch in ten).
_SETPRIV = shutil.which("setpriv")


# Every job process carries "HELPER-PID.START:RAMDISK" of the helper that launched it (START:
# the helper's start time in clock ticks since boot, /proc/PID/stat's 22nd field, so that
# another process given the same pid later is not taken for it); its descendants inherit it
# (a python behind `bash -c`, the workers it forks). "HELPER-PID:RAMDISK" (no start) is read
# too.
OWNER_ENV = "GANDIVA_HELPER"
# And a mark of its own launch (LAUNCH_ENV, GANDIVA_LAUNCH), which no other launch carries
# (the same job and incarnation may be launched again, a retried pre-warm, while the first
# one's exit is still being handled): what is signalled as this launch's processes carries
# it. The shim finds the wrappers of its launch by it too (tf_runtime.launch).
# How long a launch's wrappers, stopped by its trainer's shim as it exits on Gandiva's
# command, wait for that process to be gone before the helper ends them.
LAUNCH_END_WAIT_S = 30.0
# How long processes a launch left running when its own process ended on its own may take
# to end by themselves before they are named in its log (JobProcess._left_behind).
LEFT_SETTLE_S = 0.5
# A child in the middle of its exec (bash's `nohup python train.py &` as the script ends)
# reads an empty /proc/PID/environ for an instant, its launch's mark unseen: a scan that
# finds nothing of the launch looks again this much later, and one that finds some looks
# again after LEFT_SETTLE_S (JobProcess._left_behind).
LEFT_RESCAN_S = 0.05


# A kill of a launch's processes found by a look at /proc missed those forked between that
# look and the signal to their parent (a worker that forks on, a supervisor that starts its
# child again as it dies, a daemon forking itself away mid-kill): they trained on,
# unsupervised. `_stop_passes` (the lease's freeze, and a kill's first part) stops and looks
# again until every process it finds is stopped (SIGSTOP: a stopped process forks no more);
# `kill_all` then kills and looks again until a look finds nothing new. Each gives up after
# STOP_CONVERGE_S.
STOP_CONVERGE_S = 2.0
_STILL = (b"T", b"t", b"Z", b"X")  # stopped, traced, or ended


def _ours(pid: int) -> bool:
    """Whether this process may signal process `pid` (root, or the same user; a setuid
    program a job runs, `sudo`, is not)."""
    try:
        return os.geteuid() == 0 or os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def _stop_passes(find: Callable[[], Sequence[int]], group: int, seen: set[int]) -> Iterator[float]:
    """A freeze's looks, one at a time: SIGSTOP process group `group` (when given), then
    every process `find` returns not yet stopped; after each look that found one, yields how
    long to wait before the next (the driver sleeps, or lets the event loop run: JobProcess).
    Adds every pid found to `seen`."""
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_CONVERGE_S
    while True:
        running = []
        for pid in find():
            seen.add(pid)
            fields = stat_fields(pid)
            if fields and fields[0] not in _STILL:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:  # gone, or not ours to signal (a setuid program): not waited for
                    continue
                running.append(pid)
        if not running:
            return
        if time.monotonic() >= deadline:
            log.warning("processes %s did not stop within %.0f s", running, STOP_CONVERGE_S)
            return
        yield 0.001  # (a signal lands as the process next runs)


def _kill_passes(find: Callable[[], Sequence[int]], group: int, killed: set[tuple[int, bytes]],
                 group_lives: Callable[[], bool] = lambda: True) -> Iterator[float]:
    """`kill_all`'s looks, one at a time (as `_stop_passes`); adds (pid, start time) of each
    process killed to `killed`. The group is killed only while `group_lives()`: its id is
    its leader's pid, which another process may be given once the leader is reaped."""
    yield from _stop_passes(find, group, set())
    if group and group_lives():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + STOP_CONVERGE_S
    while True:
        new = 0
        for pid in find():
            fields = stat_fields(pid)
            if len(fields) <= 19 or fields[0] in (b"Z", b"X") or (pid, fields[19]) in killed:
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            killed.add((pid, fields[19]))
            new += 1
        if not new:
            return
        if time.monotonic() >= deadline:
            log.warning("processes still forking after %.0f s of killing them", STOP_CONVERGE_S)
            return
        yield 0.0


def _block_through(passes: Iterator[float]) -> None:
    """Run a freeze's or kill's looks to their end, sleeping each pause between them (no
    event loop to turn: kill_all, a JobProcess signalled outside one)."""
    for pause in passes:
        time.sleep(pause)


def kill_all(find: Callable[[], Sequence[int]], group: int = 0) -> set[int]:
    """`_stop_passes` first (a stopped parent's children are not orphaned: a supervisor does not
    start them again), then SIGKILL process group `group` (when given) and every process
    `find` returns, looking again until a look finds none not yet killed; returns the pids
    killed. A process with SIGKILL pending forks no more (the kernel abandons a fork whose
    parent has it pending), and a child attached before it is found by the next look.
    Blocks up to twice STOP_CONVERGE_S: a helper's launches converge through JobProcess
    instead, between turns of its event loop."""
    killed: set[tuple[int, bytes]] = set()  # (pid, start time)
    _block_through(_kill_passes(find, group, killed))
    return {pid for pid, _ in killed}


def owner_mark(ramdisk: Path) -> str:
    pid = os.getpid()
    start = _started_at(pid)
    return f"{pid}.{start}:{ramdisk.resolve()}" if start else f"{pid}:{ramdisk.resolve()}"


def _started_at(pid: int) -> str:
    """The process's start time (clock ticks since boot: proc(5)'s field 22), "" when it
    is gone or unreadable."""
    fields = stat_fields(pid)
    return fields[19].decode() if len(fields) > 19 else ""


def _owner_lives(owner: str) -> bool | None:
    """Whether the helper an OWNER_ENV value names ("PID.START" or "PID") still runs; None
    when it names no helper. A pid alone alive may be another process that took a dead
    helper's pid (pids are reused quickly on a busy host, pid_max 32768 by default): then
    its orphans were left running, two copies of their jobs."""
    pid, _, start = owner.partition(".")
    if not pid.isdigit() or (start and not start.isdigit()):
        return None
    if not _alive(int(pid)):
        return False
    return not start or _started_at(int(pid)) == start


def kill_left_behind(ramdisk: Path) -> list[tuple[int, str]]:
    """Kill the processes an earlier run of this helper (same ramdisk, now dead) left
    running; returns (pid, job id) of each. The parent-death signal reaches only a job's
    own process: a helper killed with -9 left a program behind a wrapper (`bash -c
    'python train.py; ...'`) training on, unsupervised, while the scheduler placed the
    job again: two copies. A live helper's processes (another helper started on the
    same ramdisk by mistake) are left alone. Then the launch marks (tf_runtime.launch) of
    launches no live process carries are removed: a helper killed outright never removed
    those of its launches."""
    ramdisk = ramdisk.resolve()
    left: dict[int, str] = {}  # pid: job id, in the order found
    groups: set[int] = set()
    scanned_at = time.time()
    live_launches: set[str] = set()

    def scan() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                           if b"=" in kv)
            except OSError:
                continue
            owner, _, root = env.get(OWNER_ENV.encode(), b"").decode(errors="replace").partition(":")
            if root != str(ramdisk) or _owner_lives(owner) is not False:
                if LAUNCH_ENV.encode() in env:
                    live_launches.add(env[LAUNCH_ENV.encode()].decode(errors="replace"))
                continue
            found.append(int(entry))
            left.setdefault(int(entry), env.get(b"GANDIVA_JOB_ID", b"?").decode(errors="replace"))
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(int(entry)))
        return found

    # (killed until a look finds none not yet killed: one forked meanwhile is not let through)
    kill_all(scan)
    for group in groups - {os.getpgrp()}:  # (a process of it that cleared the marks)
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    forget_launches_but(live_launches, scanned_at)
    return list(left.items())


def _with_parent_death_signal(argv: Sequence[str]) -> list[str]:
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]


@dataclass
class JobProcess:
    job_id: str
    incarnation: str
    argv: Sequence[str]
    workdir: str
    env: dict[str, str]
    gpu_indices: tuple[int, ...]
    log_path: Path
    warm: bool = False
    pid: int = 0
    started_at: float = 0.0
    exit_code: int | None = None
    stopped: bool = False
    activated: bool = False
    frozen: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    status_lines: int = 0  # lines read from its status pipe
    _proc: subprocess.Popen[bytes] | None = None
    _exited: asyncio.Future[int] | None = None
    _control_fd: int = -1
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    launch_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The status its trainer's shim exited with on Gandiva's command, reported as the
    # launch's once the helper has ended the wrappers it stopped (tf_runtime.launch).
    ended_with: int | None = None
    # The mini-batches its runtime said it had done at its program's end (the largest
    # last_step status event of the launch: `python train.py; python eval.py` writes two),
    # sent with its exit; 0: not said (an older shim, a process that died).
    last_step: int = 0
    _reader: asyncio.Task[None] | None = None
    # When the grace of a stop's SIGTERM runs out (monotonic), None when no stop gave one:
    # the launch's processes that outlive their wrapper may use the rest of it (_grace).
    _grace_until: float | None = None
    # pid: start time (clock ticks since boot) of each process found as the launch's (_marked)
    _known: dict[int, bytes] = field(default_factory=dict)
    # A freeze's or kill's looks still to come (_converge): "stop" or "kill", and its task.
    _converging: tuple[str, asyncio.Task[None]] | None = None

    async def start(self, on_exit: Callable[[JobProcess], None]) -> None:
        """Spawn the process; ``on_exit`` is called once when it ends."""
        ctrl_r, ctrl_w = os.pipe()
        status_r, status_w = os.pipe()
        env = dict(self.env, GANDIVA_CONTROL_FD=str(ctrl_r), GANDIVA_STATUS_FD=str(status_w))
        env[LAUNCH_ENV] = self.launch_id
        if self.warm:
            env["GANDIVA_WARM"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Opening a local log file is quick; the child keeps its own copy of the descriptor.
        with open_regular(self.log_path, "ab") as logf:
            logf.write(
                f"=== gandiva: job {self.job_id} incarnation {self.incarnation} "
                f"on {env.get('GANDIVA_SERVER', '?')} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{' '.join(self.argv)}\n".encode()
            )
            logf.flush()
            try:
                # subprocess (vfork + exec), not the event loop's spawn: uvloop forks, and
                # gRPC's fork handlers then abort or hang the child before its exec.
                self._proc = subprocess.Popen(  # noqa: ASYNC220
                    _with_parent_death_signal(self.argv),
                    cwd=self.workdir or None,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    pass_fds=(ctrl_r, status_w),
                    # Its own process group: stopping the job reaches the workers it forks,
                    # and a Ctrl-C at the helper's terminal does not.
                    start_new_session=True,
                )
            except BaseException as exc:
                for fd in (ctrl_r, ctrl_w, status_r, status_w):
                    os.close(fd)
                logf.write(self._end_line(f"did not start ({exc})").lstrip(b"\n"))
                raise
        # The child holds its ends now; the parent keeps only the write end of control
        # and the read end of status (so EOF arrives when the child exits).
        os.close(ctrl_r)
        os.close(status_w)
        self._control_fd = ctrl_w
        self.pid = self._proc.pid
        self.started_at = time.monotonic()
        log.info("job %s/%s started: pid %d%s", self.job_id, self.incarnation, self.pid,
                 " (warm)" if self.warm else "")
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read_status(status_r))
        self._tasks.append(self._reader)
        self._tasks.append(loop.create_task(self._wait_exit(on_exit)))

    def _end_line(self, reason: str) -> bytes:
        """The line after this process's output (`gandiva logs --local -f` reads it), with
        a newline first for output that did not end with one."""
        return (f"\n=== gandiva: end of job {self.job_id} incarnation {self.incarnation}: {reason} "
                f"at {time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode()

    async def _read_status(self, fd: int) -> None:
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        pace, unreadable = Pace(STATUS_RATE, STATUS_BURST), 0
        try:
            left = STATUS_BURST  # lines looked at once it has exited, past the burst
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the reader's limit (64 KiB): no shim's line
                    line = b"\xff"  # (what came of it is dropped; the rest is the next line)
                if not line:
                    break
                self.status_lines += 1
                if self.exit_code is not None and self.status_lines > STATUS_BURST:
                    # It has exited, after more lines than a shim writes: not worth the wait,
                    # but for its last_step among what it left in the pipe (a long job's
                    # checkpoint lines passed the burst long ago).
                    self._last_step_in(line)
                    left -= 1
                    if left <= 0:
                        break
                    continue
                await pace.take()
                event = _status_event(line)
                if event is None:
                    unreadable += 1
                    if unreadable == 1:  # once: a job can write such lines without end
                        log.warning("job %s: unreadable status line %r", self.job_id, line[:200])
                    continue
                if event["event"] == "last_step":
                    self._take_last_step(event)
                    continue
                if event["event"] not in STATUS_EVENTS:
                    continue  # one the helper does not wait for (a checkpoint's): nothing to keep
                if len(self.events) >= STATUS_KEPT:
                    if len(self.events) == STATUS_KEPT:
                        log.warning("job %s: more than %d status events; the rest are dropped", self.job_id,
                                    STATUS_KEPT)
                        self.events.append({"event": "dropped"})  # said once
                    continue
                event.setdefault("received_at", time.monotonic())
                self.events.append(event)
                log.debug("job %s event %s", self.job_id, event)
                if event["event"] == "launch_end":
                    self._tasks.append(asyncio.get_running_loop().create_task(self._end_launch(event)))
                self._notify()
        finally:
            transport.close()

    def _last_step_in(self, line: bytes) -> None:
        """The count of a last_step status line (its runtime's at its program's end), kept
        when larger than one said before; any other line is no count."""
        if b"last_step" not in line:
            return
        event = _status_event(line)
        if event is not None and event["event"] == "last_step":
            self._take_last_step(event)

    def _take_last_step(self, event: dict[str, Any]) -> None:
        """A last_step status event's count, kept when larger than one said before."""
        steps = event.get("steps")
        if type(steps) is int and 0 <= steps <= MAX_LAST_STEP:
            self.last_step = max(self.last_step, steps)

    async def _end_launch(self, event: dict[str, Any]) -> None:
        """The trainer's shim exits on Gandiva's command (a stop for migration, a park, a
        kill) and has stopped the wrappers around it (`bash -c 'python train.py; python
        eval.py'`): once it is gone, the launch ends with its status, the rest of the
        wrapper's script not run (the job's next launch runs the command from the start)."""
        code, pid = event.get("code"), event.get("pid")
        if not isinstance(code, int) or not isinstance(pid, int) or pid == self.pid:
            return
        deadline = time.monotonic() + LAUNCH_END_WAIT_S
        while not _gone(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if not self.alive:
            return
        self.ended_with = code
        log.info("job %s/%s: its program (pid %d) exited with %d on Gandiva's command; ending "
                 "its launch (wrappers %s), the rest of its command not run", self.job_id,
                 self.incarnation, pid, code, event.get("wrappers"))
        try:
            with open_regular(self.log_path, "ab") as logf:  # one short local append
                logf.write(f"\n=== gandiva: its program exited with {code} ({exit_reason(code, self.stopped)}); "
                           f"the rest of the launch's command is not run here\n".encode())
        except OSError:
            pass
        self._signal_group(signal.SIGKILL)

    async def _wait_exit(self, on_exit: Callable[[JobProcess], None]) -> None:
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        try:
            pidfd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): a thread waits
            code = await asyncio.to_thread(self._proc.wait)
        else:
            # The pidfd becomes readable when the process ends: no thread, no SIGCHLD handler.
            readable: asyncio.Future[None] = loop.create_future()

            def ready() -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(pidfd, ready)
            try:
                await readable
            finally:
                loop.remove_reader(pidfd)
                os.close(pidfd)
            self._end_converging()  # (before the reap: the group's id is the leader's pid)
            code = self._proc.wait()
        if self.ended_with is not None:
            code = self.ended_with  # killed by _end_launch: the trainer's status is the launch's
        elif code == SHELL_SIGKILLED and runs_a_shell(self.argv, self.workdir):
            code = -signal.SIGKILL  # (see SHELL_SIGKILLED)
        self.exit_code = code
        # Its launch is over: what it left running (a worker in its group or in a session
        # of its own) goes with it, or it would train on unsupervised, beside the job's
        # next launch (a migration's destination, a restart). Found by this launch's own
        # mark, not by its process group: the group's id is the reaped leader's pid, which
        # another process may be given now.
        await self._grace()
        left, named = await self._left_behind()
        # (not its group: its id is the reaped leader's pid; the event loop runs between looks)
        for pause in _kill_passes(self._marked, 0, set()):
            await asyncio.sleep(pause)
        forget_launch(self.launch_id)  # the mark its trainer left (tf_runtime.launch)
        # The pipe's last lines (the runtime's last_step, written as its program ended) are
        # read before the exit is told: its end comes once nothing of the launch holds it.
        if self._reader is not None and not self._reader.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._reader), STATUS_DRAIN_S)
        # The log says where this process's output ends (`gandiva logs --local -f` stops
        # there), before anyone is told of the exit: whoever reads on then has it all.
        try:
            with open_regular(self.log_path, "ab+") as logf:  # one short local append
                end = self._end_line(exit_reason(code, self.stopped))
                if named:
                    end = (f"\n=== gandiva: its command ended (status {code}) while {left} of its processes "
                           f"still ran, killed with it: {'; '.join(named)}. A job lasts as long as its command: "
                           f"run the trainer in the foreground (no `&` at the end of the line, or `wait` for "
                           f"it)").encode() + end
                size = logf.seek(0, os.SEEK_END)
                if not size or (logf.seek(size - 1) >= 0 and logf.read(1) == b"\n"):
                    end = end[1:]  # (appended at the end whatever was read)
                logf.write(end)
        except OSError as exc:
            log.warning("job %s: cannot write the end of its log %s (%s)", self.job_id, self.log_path, exc)
        if self._control_fd >= 0:
            os.close(self._control_fd)
            self._control_fd = -1
        log.info("job %s/%s exited: %s", self.job_id, self.incarnation, exit_reason(code, self.stopped))
        self._exited.set_result(code)
        self._notify()
        on_exit(self)

    async def _grace(self) -> None:
        """A stop's SIGTERM ended the leader, a wrapper (`bash run.sh` whose python is its
        child, not exec'd: bash dies at once), while its program handles the signal (saves
        its own checkpoint, then exits): the program has the rest of the stop's grace, as
        it has when it is the leader. It used to be SIGKILLed at once, its save never made."""
        left = self._marked() if self._grace_until is not None else []
        # (re-read each time: kill_now, a fence, ends it; stop() sends no SIGKILL here, its
        # exit_code already set: the grace ends by this deadline, the rest killed by _wait_exit)
        while left and self._grace_until is not None and time.monotonic() < self._grace_until:
            await asyncio.sleep(0.05)
            left = [pid for pid in left if not _gone(pid)]

    async def _left_behind(self) -> tuple[int, list[str]]:
        """How many of the launch's processes still run after its own process ended on its
        own, and the first 3 of them ("PID: COMMAND"): a trainer put in the background
        (`nohup python train.py &` as a script's last line, the habit of a login shell) is
        killed as the launch ends, and the job used to read "finished" at once, with no
        word of it in its output. Those that end within half a second (a multiprocessing
        resource tracker reading its pipe's end) are not counted."""
        if self.stopped or self.ended_with is not None:
            return 0, []
        left = self._marked()
        if not left:  # (or a child mid-exec, its mark unread: such launches read "finished")
            await asyncio.sleep(LEFT_RESCAN_S)
            left = self._marked()
        deadline = time.monotonic() + LEFT_SETTLE_S
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            left = [pid for pid in left if not _gone(pid)]
        if left:  # (one mid-exec at the first look: "4 of its processes" for 5)
            left = sorted(set(left) | set(self._marked()))
        named = []
        for pid in left[:3]:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
            except OSError:
                continue
            named.append(f"{pid}: {argv.decode(errors='replace')[:120]}")
        return len(left), named

    async def _wait(self, timeout_s: float) -> bool:
        """True once the process has exited (within ``timeout_s``)."""
        while self._exited is None:  # the exit watcher has not run yet
            await asyncio.sleep(0)
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self.exit_code is None

    def last_event(self, kind: str) -> dict[str, Any] | None:
        for event in reversed(self.events):
            if event.get("event") == kind:
                return event
        return None

    async def wait_event(self, kind: str, timeout_s: float, after: int = 0) -> dict[str, Any]:
        """The first ``kind`` event at index >= ``after``; raises ProcessExited or TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events[after:]:
                if event.get("event") == kind:
                    return event
            if self.exit_code is not None:
                raise ProcessExited(self.exit_code, f"'{kind}'")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no '{kind}' from job {self.job_id} within {timeout_s:.0f} s")
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def _signal_group(self, sig: int) -> None:
        """Signal every process of this launch: its process group, and those that left
        it (``escaped``). SIGSTOP and SIGKILL look again until all they find are stopped
        (``_stop_passes``, ``_kill_passes``): one forked as its parent was signalled is not
        let through."""
        if sig == signal.SIGKILL:
            self._converge("kill", _kill_passes(self.escaped, self.pid, set(),
                                                lambda: self._proc is None or self._proc.returncode is None))
            return
        if sig == signal.SIGSTOP:
            self._converge("stop", _stop_passes(self.escaped, self.pid, set()))
            return
        escaped = self.escaped()  # (first: one whose parent the group's signal ends is found by it)
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        for pid in escaped:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _converge(self, kind: str, passes: Iterator[float]) -> None:
        """A freeze's ("stop") or a kill's ("kill") looks: the first now, the rest between
        turns of the event loop, each after the pause `passes` yields. Run through at once,
        they held the helper's event loop up to STOP_CONVERGE_S a freeze and twice that a
        kill (a process in uninterruptible sleep never reads stopped; one scan of /proc took
        0.2-0.5 s beside 2,000 processes on a loaded host), launch after launch: its
        heartbeats unsent meanwhile, its other jobs' lease running out. Those of an earlier
        freeze or kill of this launch end here (this one looks again from the start)."""
        self._end_converging()
        pause = next(passes, None)
        if pause is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (no event loop: blocks, as kill_all does)
            time.sleep(pause)
            _block_through(passes)
            return
        self._converging = (kind, loop.create_task(self._converge_rest(passes, pause)))

    async def _converge_rest(self, passes: Iterator[float], first: float) -> None:
        try:
            await asyncio.sleep(first)
            for pause in passes:
                await asyncio.sleep(pause)
        except Exception:  # (never raised so far: a launch must not end the helper)
            log.exception("job %s/%s: looking for the rest of its launch failed", self.job_id, self.incarnation)

    def _end_converging(self, kind: str | None = None) -> None:
        """Stop the pending looks (only those of `kind`, when given)."""
        if self._converging is not None and kind in (None, self._converging[0]):
            self._converging[1].cancel()
            self._converging = None

    def escaped(self) -> list[int]:
        """This launch's processes outside its process group: a worker started in a
        session of its own (`setsid`, a shell's job control `set -m`, a launcher that
        starts its workers with start_new_session). A signal to the group missed them:
        the lease's freeze left them training while the job was placed again, and a
        stop or a stale launch's kill left them training on, unsupervised."""
        found = []
        for pid in self._marked():
            try:
                if os.getpgid(pid) != self.pid:
                    found.append(pid)
            except OSError:  # gone meanwhile
                continue
        return found

    def _marked(self) -> list[int]:
        """Every live process of this launch but the leader: those carrying its mark
        (LAUNCH_ENV), which all its descendants inherit; those whose parent is of the
        launch (or is the leader, not yet reaped): a worker started with an environment
        built from scratch (`env -i`, `subprocess.Popen(env={...})`), a child mid-exec
        (its environment reads empty for an instant); and those found so before that still
        run (the same pid started at the same time: such a worker once orphaned)."""
        if not self.pid:
            return []
        mark = f"{LAUNCH_ENV}={self.launch_id}".encode()
        found: set[int] = set()
        others: dict[int, int] = {}  # pid: parent, of the live processes without the mark
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (self.pid, os.getpid()):
                continue
            pid = int(entry)
            if carries(pid, mark):  # (False when gone meanwhile, or not ours to read)
                found.add(pid)
                continue
            fields = stat_fields(pid)
            if len(fields) > 19 and fields[0] not in (b"Z", b"X") and _ours(pid):
                if self._known.get(pid) == fields[19]:
                    found.add(pid)
                else:
                    others[pid] = int(fields[1])
        parents = found | ({self.pid} if self.exit_code is None else set())  # (a reaped leader's pid may be another's)
        while True:  # their descendants, generation by generation
            children = {pid for pid, parent in others.items() if parent in parents and pid not in found}
            if not children:
                break
            found |= children
            parents = children
        for pid in found:
            if pid not in self._known and len(fields := stat_fields(pid)) > 19:
                self._known[pid] = fields[19]
        return sorted(found)

    def freeze(self) -> None:
        """Stop every process of the job where it stands (SIGSTOP): it trains no further
        until thawed, and spends no CPU time. Used when the helper's lease runs out. A
        process being stopped is left to handle its SIGTERM (SIGKILL follows the grace)."""
        if self.alive and not self.frozen and not self.stopped:
            self._signal_group(signal.SIGSTOP)
            self.frozen = True
            log.warning("job %s/%s frozen: lease with the scheduler ran out", self.job_id, self.incarnation)

    def thaw(self) -> None:
        # A freeze still looking would stop again what this continues; a kill under way
        # (stop()'s SIGKILL) is not undone: what it stopped waits for its SIGKILL.
        self._end_converging("stop")
        killing = self._converging is not None and not self._converging[1].done()
        if self.alive and self.frozen and not killing:  # a stopping process too: it must see its SIGTERM
            self._signal_group(signal.SIGCONT)
            log.info("job %s/%s thawed", self.job_id, self.incarnation)
        self.frozen = False

    @property
    def in_grace(self) -> bool:
        """Its own process has ended (a wrapper the stop's SIGTERM ended) while the rest of
        the launch has the rest of the stop's grace (_grace): not ``alive``, yet it runs."""
        return self._grace_until is not None and self.exit_code is not None

    def kill_now(self) -> None:
        """SIGKILL, no grace: a stale launch must not train another step. Its exit is
        reported as for any other stop."""
        self.stopped = True
        self._grace_until = None  # a grace in progress ends: the launch's rest is killed now (_wait_exit)
        if self.alive:
            self._signal_group(signal.SIGKILL)

    def send(self, command: dict[str, Any]) -> None:
        """Write one command line to the shim's control pipe."""
        if self._control_fd < 0:
            raise ProcessExited(self.exit_code if self.exit_code is not None else -1, "a command")
        os.write(self._control_fd, (json.dumps(command) + "\n").encode())

    async def stop(self, grace_s: float) -> int:
        """Ask the process to end (exit command if still warm, then SIGTERM), SIGKILL after
        ``grace_s``; returns its exit code."""
        assert self._proc is not None
        self.stopped = True
        if self.exit_code is None and self.warm and not self.activated:
            try:
                self.send({"cmd": "exit"})
                await self._wait(min(2.0, grace_s))
            except (OSError, ProcessExited):
                pass
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
            if self.exit_code is not None:
                break
            self._grace_until = time.monotonic() + grace_s if sig == signal.SIGTERM else None
            self._signal_group(sig)
            if self.frozen:  # a frozen process handles its SIGTERM only once continued
                self.thaw()
            await self._wait(wait)
        await self._wait(30.0)
        return self.exit_code if self.exit_code is not None else -signal.SIGKILL
