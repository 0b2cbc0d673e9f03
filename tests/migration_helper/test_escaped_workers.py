"""A job whose program starts a worker in a session of its own (`setsid`, a shell's job
control, a launcher that starts its workers with start_new_session): the helper's
signals to the job's process group missed that worker. The lease's freeze left it
training while the scheduler placed the job again (two copies), and a stop, a stale
launch's kill or the job's own end left it training on, unsupervised. Real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from migration_helper import process
from migration_helper.process import (
    OWNER_ENV,
    JobProcess,
    kill_left_behind,
    owner_mark,
)
from tf_runtime.launch import _trained_flag, forget_launch, stat_fields

# The worker: a process in a session of its own that "trains" (sleeps) for good; the
# job's own process waits for it.
ESCAPING = ["bash", "-c", "setsid sleep 300 & echo $! > worker.pid; wait"]


async def becomes(pid: int, *states: str) -> str:
    """The process's state once it is one of `states` (signals land asynchronously), or
    the last one seen after 2 s."""
    for _ in range(100):
        if (now := state(pid)) in states:
            return now
        await asyncio.sleep(0.02)
    return state(pid)


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def started(tmp_path: Path, argv: list[str]) -> tuple[JobProcess, int]:
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})
    proc = JobProcess(job_id="j", incarnation="i1", argv=argv, workdir=str(tmp_path), env=env,
                      gpu_indices=(), log_path=tmp_path / "j.log")
    await proc.start(lambda p: None)
    worker = 0
    for _ in range(250):
        text = (tmp_path / "worker.pid").read_text() if (tmp_path / "worker.pid").exists() else ""
        worker = int(text) if text.strip() else 0
        if worker and os.getsid(worker) == worker:  # it left the job's session and group
            return proc, worker
        await asyncio.sleep(0.02)
    raise AssertionError(f"no worker in a session of its own (pid {worker})")


async def test_the_lease_freezes_and_a_stop_ends_a_worker_in_a_session_of_its_own(tmp_path: Path) -> None:
    proc, worker = await started(tmp_path, ESCAPING)
    try:
        proc.freeze()
        assert await becomes(worker, "T") == "T"  # trains no further while the job may be placed again
        proc.thaw()
        assert await becomes(worker, "S", "R") in ("S", "R")
        await proc.stop(grace_s=5.0)
        assert await becomes(worker, "gone", "Z") in ("gone", "Z")  # nothing of the job left running
    finally:
        with contextlib.suppress(OSError):  # the test's own process, whatever happened
            os.kill(worker, signal.SIGKILL)


async def test_a_worker_with_an_environment_of_its_own_is_frozen_and_stopped_with_its_launch(
        tmp_path: Path) -> None:
    """A worker started with an environment built from scratch (`env -i`, a launcher's
    `subprocess.Popen(env={...})`) in a session of its own carries no mark of its launch:
    the freeze left it training and a stop left it running on, unsupervised. Now a process
    whose parent is of the launch is of it too, and one found so stays so while it lives."""
    proc, worker = await started(tmp_path, ["bash", "-c", "env -i setsid sleep 300 & echo $! > worker.pid; wait"])
    try:
        assert b"GANDIVA" not in Path(f"/proc/{worker}/environ").read_bytes()
        proc.freeze()
        assert await becomes(worker, "T") == "T"
        proc.thaw()
        assert await becomes(worker, "S", "R") in ("S", "R")
        await proc.stop(grace_s=5.0)
        assert await becomes(worker, "gone", "Z") in ("gone", "Z")
    finally:
        with contextlib.suppress(OSError):  # the test's own process, whatever happened
            os.kill(worker, signal.SIGKILL)


async def test_a_job_that_ends_takes_its_worker_in_a_session_of_its_own_with_it(tmp_path: Path) -> None:
    proc, worker = await started(tmp_path, ["bash", "-c", "setsid sleep 300 & echo $! > worker.pid; sleep 0.3"])
    try:
        assert await proc._wait(10.0) and proc.exit_code == 0
        assert await becomes(worker, "gone", "Z") in ("gone", "Z")
    finally:
        with contextlib.suppress(OSError):  # the test's own process, whatever happened
            os.kill(worker, signal.SIGKILL)


async def test_a_launch_that_ends_leaves_another_launch_of_the_same_job_alone(tmp_path: Path) -> None:
    """The same job and incarnation launched again by the same helper (a retried pre-warm)
    while the first launch is still ending: the first one's end takes only what it
    started. Before, the second carried the same marks and was killed with -9 (seen as a
    grow's pre-warm 'exited with code -9 before warm_ready')."""
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})

    def launch(argv: list[str], log: str) -> JobProcess:
        return JobProcess(job_id="j", incarnation="i1", argv=argv, workdir=str(tmp_path), env=env,
                          gpu_indices=(), log_path=tmp_path / log)

    first, second = launch(["bash", "-c", "sleep 0.5"], "1.log"), launch(["sleep", "300"], "2.log")
    await first.start(lambda p: None)
    await second.start(lambda p: None)
    try:
        assert await first._wait(10.0) and first.exit_code == 0
        await asyncio.sleep(0.3)
        assert state(second.pid) in ("S", "R"), "the second launch was killed by the first one's end"
    finally:
        await second.stop(grace_s=1.0)


def test_a_restarted_helper_removes_the_launch_marks_its_killed_predecessor_left(tmp_path: Path) -> None:
    """A helper killed outright never removed its launches' marks (tf_runtime.launch's
    `launch-ID.trained`, left by each trainer in the user's scratch folder): they piled up.
    The helper's start, as it kills what its predecessor left running, removes the marks of
    launches no live process carries; a live launch's mark (another helper's job, or one
    not killed) and one written after it read the processes stay."""
    ramdisk = tmp_path / "rd"
    ramdisk.mkdir()
    # The killed helper: a pid no process has (pid_max itself; a pid freed by a process
    # that ended may be taken again at once, by a thread, on a busy machine).
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    tag = f"test-marks-{os.getpid()}"
    orphan_mark, live_mark, gone_mark, new_mark = (f"{tag}-{n}" for n in ("orphan", "live", "gone", "new"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True, env=dict(
        base, GANDIVA_JOB_ID="j", GANDIVA_LAUNCH=orphan_mark, **{OWNER_ENV: f"{dead}:{ramdisk.resolve()}"}))
    live = subprocess.Popen(["sleep", "300"], start_new_session=True, env=dict(base, GANDIVA_LAUNCH=live_mark))
    # Until they have exec'd, /proc shows the test's own environment (CI under load: the
    # live launch's mark taken for a gone one's).
    carries(orphan.pid, "GANDIVA_LAUNCH")
    carries(live.pid, "GANDIVA_LAUNCH")
    now = time.time()
    flags = {mark: Path(str(_trained_flag(mark))) for mark in (orphan_mark, live_mark, gone_mark, new_mark)}
    try:
        for mark, flag in flags.items():
            flag.parent.mkdir(parents=True, exist_ok=True)
            flag.write_text("1")
            # Written before the helper's start, but the last: as if after it read /proc.
            os.utime(flag, (now + 600, now + 600) if mark == new_mark else (now - 60, now - 60))
        assert kill_left_behind(ramdisk) == [(orphan.pid, "j")]
        assert orphan.wait(10) == -signal.SIGKILL
        assert {mark for mark, flag in flags.items() if flag.exists()} == {live_mark, new_mark}
        assert live.poll() is None
    finally:
        for proc in (orphan, live):
            proc.kill()
            proc.wait(10)
        for mark in flags:
            forget_launch(mark)


def carries(pid: int, name: str) -> None:
    """Wait until the process has exec'd with `name` in its environment."""
    for _ in range(500):
        if f"{name}=".encode() in Path(f"/proc/{pid}/environ").read_bytes():
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never carried {name}")


def test_a_restarted_helper_kills_what_its_predecessor_left_though_another_process_took_its_pid(
        tmp_path: Path) -> None:
    """A helper killed outright; on a busy host its pid is soon another process's (pid_max
    32768 by default). Its orphans named it by pid alone, so the restarted helper took it
    for alive and left them training on, unsupervised, while the scheduler placed their
    jobs again: two copies. The mark carries the helper's start time too: a process with
    that pid started at another time is not the helper."""
    ramdisk = tmp_path / "rd"
    ramdisk.mkdir()
    mine = owner_mark(ramdisk)  # this process plays the live helper: its pid, its start time
    pid, _, root = mine.partition(":")
    assert "." in pid and root == str(ramdisk.resolve())
    reused = f"{pid.split('.')[0]}.{int(pid.split('.')[1]) + 1}:{root}"  # the same pid, started later
    base = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True,
                              env=dict(base, GANDIVA_JOB_ID="orphan", **{OWNER_ENV: reused}))
    kept = subprocess.Popen(["sleep", "300"], start_new_session=True,
                            env=dict(base, GANDIVA_JOB_ID="kept", **{OWNER_ENV: mine}))
    try:
        carries(orphan.pid, OWNER_ENV)
        carries(kept.pid, OWNER_ENV)
        assert kill_left_behind(ramdisk) == [(orphan.pid, "orphan")]
        assert orphan.wait(10) == -signal.SIGKILL
        assert kept.poll() is None, "a live helper's launch was killed"
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait(10)


# A launch whose processes fork on: its first worker, in a session of its own, starts a new
# one every 2 ms (each in a session of its own too, ending after 50 ms while its parent
# lives); one whose parent is gone forks on in its place. A single look at /proc misses the
# ones forked between the look and the signal to their parent: they trained on, unsupervised.
# Each ends by itself at the deadline given (the test's own clean-up).
FORKING = """
import os, sys, time
until = float(sys.argv[1])

def run(first):
    os.setsid()
    parent, born = os.getppid(), time.monotonic()
    while time.time() < until:
        orphaned = os.getppid() != parent
        if first or orphaned:
            if os.fork() == 0:
                return
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
            continue
        if time.monotonic() - born > 0.02:
            os._exit(0)
        time.sleep(0.002)
    os._exit(0)

if os.fork() == 0:
    with open("worker.pid", "w") as f:
        f.write(str(os.getpid()))
    first = True
    while True:
        run(first)
        first = False  # (a child: fork returned 0)
time.sleep(300)
"""


def launch_processes(proc: JobProcess) -> list[int]:
    mark = f"GANDIVA_LAUNCH={proc.launch_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
    return found


async def none_left(proc: JobProcess, within_s: float) -> list[int]:
    """The launch's processes still running after `within_s` ([] as soon as none is)."""
    for _ in range(int(within_s / 0.05)):
        if not launch_processes(proc):
            return []
        await asyncio.sleep(0.05)
    return launch_processes(proc)


async def test_a_freeze_and_a_kill_reach_a_launch_whose_processes_fork_on(tmp_path: Path) -> None:
    """The lease's freeze, `gandiva kill`, a stale launch's fence, a stop's SIGKILL: the
    launch's processes looked for once (its group, then those outside it carrying its mark)
    let through those forked between that look and the signal to their parent: they trained
    on through the freeze, and on, unsupervised, after the kill. Now the helper stops them
    (SIGSTOP: a stopped process forks no more) and looks again until every process of the
    launch it finds is stopped, then (a kill) kills them all. Three tries of each: a single
    look let some through in about one try in two here."""
    (tmp_path / "forking.py").write_text(FORKING)
    for kill in ("kill_now", "stop") * 3:
        (tmp_path / "worker.pid").unlink(missing_ok=True)
        env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1",
                   **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})
        proc = JobProcess(job_id="j", incarnation="i1", argv=[sys.executable, "forking.py", str(time.time() + 30)],
                          workdir=str(tmp_path), env=env, gpu_indices=(), log_path=tmp_path / "j.log")
        await proc.start(lambda p: None)
        try:
            for _ in range(3000):  # (a Python start on a machine loaded by others' tests)
                if (tmp_path / "worker.pid").exists() and len(launch_processes(proc)) >= 5:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"the launch never forked: {(tmp_path / 'j.log').read_text()}")
            proc.freeze()
            running = await all_stopped(proc, 10.0)
            assert not running, f"frozen: {len(running)} processes of the launch still run"
            proc.thaw()
            if kill == "kill_now":
                proc.kill_now()
                assert await proc._wait(20.0)
            else:
                await proc.stop(grace_s=0.5)
            left = await none_left(proc, 10.0)
            assert not left, f"{kill}: {len(left)} processes of the killed launch still run"
        finally:
            while left := launch_processes(proc):  # the test's own, whatever happened
                for pid in left:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP)
                for pid in launch_processes(proc):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                await asyncio.sleep(0.05)
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc._wait(20.0)


async def all_stopped(proc: JobProcess, within_s: float) -> list[int]:
    """The launch's processes still running (not stopped) after `within_s` ([] once none is)."""
    running: list[int] = []
    for _ in range(int(within_s / 0.05)):
        running = [pid for pid in launch_processes(proc) if state(pid) not in ("T", "t", "Z", "gone")]
        if not running:
            return []
        await asyncio.sleep(0.05)
    return running


# A worker in a session of its own that can not be stopped: a vfork parent waits for its
# child in uninterruptible sleep (state D, as a process in a driver's or a file system's
# call), and SIGSTOP moves it to T only once that wait ends.
UNSTOPPABLE = """
import ctypes, time
libc = ctypes.CDLL(None)
if libc.vfork() == 0:
    libc.sleep(300)
    libc._exit(0)
time.sleep(300)
"""


async def test_a_freeze_and_a_kill_of_a_process_that_cannot_stop_leave_the_helper_answering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The freeze and the kill look again until every process of the launch they find is
    stopped, for up to STOP_CONVERGE_S: a process in uninterruptible sleep never is, and
    they held the helper's event loop all that time (2 s a freeze, 2 s and more a kill, one
    launch after another: its heartbeats unsent, the lease of its other jobs running out).
    Now the event loop runs between looks; a thaw ends a freeze's looking (it must not stop
    what it continued), and the kill still takes every process of the launch. (Its bound
    made 5 s here: the loop is still held by each look, one scan of /proc, 1-2 s beside
    2,000 processes on a loaded host; what it must not be held for is the whole bound.)"""
    converge_s = 5.0
    monkeypatch.setattr(process, "STOP_CONVERGE_S", converge_s)
    (tmp_path / "unstoppable.py").write_text(UNSTOPPABLE)
    proc, worker = await started(
        tmp_path, ["bash", "-c", f"setsid {sys.executable} unstoppable.py & echo $! > worker.pid; wait"])
    loop = asyncio.get_running_loop()
    stalls = [0.0]

    async def ticker() -> None:  # the event loop's longest wait between two 20-ms ticks
        last = loop.time()
        while True:
            await asyncio.sleep(0.02)
            stalls.append(loop.time() - last - 0.02)
            last = loop.time()

    child = 0
    tick = asyncio.create_task(ticker())
    try:
        for _ in range(500):
            child = next((int(e) for e in os.listdir("/proc") if e.isdigit() and e != str(worker)
                          and stat_fields(int(e))[1:2] == [str(worker).encode()]), 0)
            if child and state(worker) == "D":
                break
            await asyncio.sleep(0.02)
        assert child and state(worker) == "D", f"no vfork parent in uninterruptible sleep: {state(worker)}"
        proc.freeze()
        assert await becomes(child, "T") == "T"
        await asyncio.sleep(converge_s + 0.5)  # (its looking given up on the D one)
        proc.thaw()
        proc.freeze()
        await asyncio.sleep(0.3)  # mid-looking
        proc.thaw()
        await asyncio.sleep(0.5)
        assert state(child) in ("S", "R"), "a thaw's continued process stopped again by the freeze before it"
        proc.kill_now()
        assert await proc._wait(20.0)
        assert await becomes(worker, "gone", "Z") in ("gone", "Z")
        assert await becomes(child, "gone", "Z") in ("gone", "Z")
        assert max(stalls) < converge_s / 2, f"the helper's event loop held {max(stalls):.2f} s by a freeze or kill"
    finally:
        tick.cancel()
        for pid in (child, worker, proc.pid):  # (the launch's own too: a failed test left it stopped)
            with contextlib.suppress(OSError):
                if pid:
                    os.kill(pid, signal.SIGKILL)
        await proc._wait(20.0)
