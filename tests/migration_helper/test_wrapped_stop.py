"""A job whose command is a wrapper that runs python as its child, not exec'd (`bash
run.sh` with more lines after the python one), stopped by the helper (`gandiva kill`, a
stale launch, the helper's own shutdown): SIGTERM to the launch's group, SIGKILL after
the grace. bash dies at the SIGTERM at once; its program, handling the signal (saving
its own checkpoint, then exiting 0, as many do on preemption), used to be SIGKILLed
with it, its save never made. And a wrapper that puts its trainer in the background and
ends (`nohup python train.py &`): the launch ends with it, its trainer killed, and the
job read "finished" with no word of that in its output. And a script whose last line runs
python, that python killed by the OOM killer: the script's 137 read "failed with exit code
137" (FAILED at once) where python alone (-9) is re-queued to resume. Real processes, plain
Python (no TensorFlow)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from migration_helper.process import OWNER_ENV, JobProcess, exit_reason, runs_a_shell
from tf_runtime.launch import gone

# The program: on SIGTERM it takes a while to save, then exits 0 (`--ignore`: it ignores
# SIGTERM and runs on); it says when its handler is in place.
PROGRAM = """
import os, signal, sys, time
if sys.argv[1:] == ["--ignore"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    def save(sig, frame):
        time.sleep(0.5)
        with open("saved", "w") as f:
            f.write("step 7")
        sys.exit(0)
    signal.signal(signal.SIGTERM, save)
with open("ready.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename("ready.tmp", "ready")
while True:
    time.sleep(0.05)
"""


async def started(tmp_path: Path, *flags: str) -> tuple[JobProcess, int]:
    (tmp_path / "train.py").write_text(PROGRAM)
    (tmp_path / "run.sh").write_text(f"#!/bin/bash\n{sys.executable} train.py {' '.join(flags)}\necho trained\n")
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})
    proc = JobProcess(job_id="j", incarnation="i1", argv=["bash", str(tmp_path / "run.sh")], workdir=str(tmp_path),
                      env=env, gpu_indices=(), log_path=tmp_path / "j.log")
    await proc.start(lambda p: None)
    for _ in range(1500):  # a Python start on a loaded machine
        if (tmp_path / "ready").exists():
            return proc, int((tmp_path / "ready").read_text())
        await asyncio.sleep(0.02)
    await proc.stop(grace_s=1.0)
    raise AssertionError(f"the program never started: {(tmp_path / 'j.log').read_text()}")


async def _ended(pid: int, within_s: float) -> bool:
    """Whether process `pid` has ended within `within_s`: a SIGKILL sent is not yet a process
    ended on a loaded machine (session 52's CI)."""
    for _ in range(int(within_s / 0.02)):
        if gone(pid):
            return True
        await asyncio.sleep(0.02)
    return gone(pid)

async def test_a_program_behind_a_wrapper_saves_in_its_sigterm_handler_before_the_stop_ends(tmp_path: Path) -> None:
    proc, program = await started(tmp_path)
    try:
        await proc.stop(grace_s=60.0)  # (the save takes 0.5 s: the grace only bounds it)
        assert (tmp_path / "saved").exists(), "the program was killed in its SIGTERM handler"
        assert (tmp_path / "saved").read_text() == "step 7"
        assert gone(program)
        assert "trained" not in (tmp_path / "j.log").read_text()  # the wrapper's rest not run
    finally:
        with contextlib.suppress(OSError):  # the test's own process, whatever happened
            os.kill(program, signal.SIGKILL)


async def test_a_program_behind_a_wrapper_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    proc, program = await started(tmp_path, "--ignore")
    try:
        await proc.stop(grace_s=1.0)
        assert await _ended(program, 2.0), "left running after its job was stopped"
    finally:
        with contextlib.suppress(OSError):
            os.kill(program, signal.SIGKILL)


async def test_a_launch_fenced_during_its_wrapped_programs_grace_is_killed_at_once(tmp_path: Path) -> None:
    """Its wrapper gone at the stop's SIGTERM, the launch read as not alive, and a fence (a
    stale launch, which must not train another step) passed it over: its program ran on for
    the rest of the grace."""
    from migration_helper.jobs import JobTable

    proc, program = await started(tmp_path, "--ignore")
    table = JobTable(server="s", scheduler="127.0.0.1:1", log_dir=tmp_path, on_exit=lambda p: None)
    table.processes[("j", "i1")] = proc
    try:
        stopping = asyncio.create_task(proc.stop(grace_s=600.0))
        for _ in range(1500):
            if proc.exit_code is not None:  # the wrapper has ended
                break
            await asyncio.sleep(0.02)
        assert proc.in_grace and not gone(program)
        table.fence("j", "i1")
        await asyncio.wait_for(stopping, 120)  # (not the 600 s grace)
        assert await _ended(program, 10.0), "still running 10 s after the fence (its grace was 600 s)"
    finally:
        with contextlib.suppress(OSError):
            os.kill(program, signal.SIGKILL)


async def test_a_trainer_left_in_the_background_is_named_in_the_jobs_output(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})

    async def ended(argv: list[str], log: str) -> str:
        proc = JobProcess(job_id="j", incarnation="i1", argv=argv, workdir=str(tmp_path), env=env,
                          gpu_indices=(), log_path=tmp_path / log)
        await proc.start(lambda p: None)
        assert await proc._wait(120.0), "the launch did not end"
        return (tmp_path / log).read_text()

    background = await ended(["bash", "-c", f"nohup {sys.executable} train.py > out.log 2>&1 &"], "bg.log")
    assert "its command ended (status 0) while 1 of its processes still ran, killed with it: " in background
    assert "train.py" in background and "run the trainer in the foreground" in background
    assert "still ran" not in await ended(["bash", "-c", f"{sys.executable} -c pass; echo done"], "fg.log")
    # All are counted, the first 3 named (it said "while 3 of its processes" for 5).
    five = await ended(["bash", "-c", "for i in 1 2 3 4 5; do sleep 60 & done"], "five.log")
    assert "while 5 of its processes still ran" in five and five.count(": sleep 60") == 3, five


async def test_a_child_mid_exec_when_its_launch_ends_is_still_counted(tmp_path: Path, monkeypatch: Any) -> None:
    """A child in the middle of its exec (`nohup python train.py &` as bash ends) reads an
    empty /proc/PID/environ for an instant, its launch's mark unseen: the test above read
    "finished" with no word of its trainer in about 1 run in 25, or "4 of its processes" for
    5 (s52, a loaded machine). Here the first look after the launch ends misses one child."""
    real, looks = JobProcess._marked, []

    def marked(self: JobProcess) -> list[int]:
        found = real(self)
        if self.exit_code is None:
            return found
        looks.append(found)
        return found[1:] if len(looks) == 1 else found  # (the first look: one mid-exec)

    monkeypatch.setattr(JobProcess, "_marked", marked)
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})
    for children, said in ((1, "while 1 of its processes still ran"), (2, "while 2 of its processes still ran")):
        looks.clear()
        proc = JobProcess(job_id="j", incarnation="i1", argv=["bash", "-c", "sleep 60 & " * children],
                          workdir=str(tmp_path), env=env, gpu_indices=(), log_path=tmp_path / f"{children}.log")
        await proc.start(lambda p: None)
        assert await proc._wait(120.0), "the launch did not end"
        assert said in (tmp_path / f"{children}.log").read_text(), (tmp_path / f"{children}.log").read_text()


async def test_a_program_killed_by_sigkill_behind_a_script_reads_as_killed(tmp_path: Path) -> None:
    """(The scheduler re-queues a job whose process SIGKILL ended, scheduler/core.py
    KILLED_RESTARTS: the exit must say -9 for that.)"""
    env = dict(os.environ, GANDIVA_JOB_ID="j", GANDIVA_INCARNATION="i1", **{OWNER_ENV: f"{os.getpid()}:{tmp_path}"})
    oom = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'"
    (tmp_path / "run.sh").write_text(f"#!/usr/bin/env bash\ncd .\n{oom}\n")
    (tmp_path / "run.sh").chmod(0o755)

    async def code(argv: list[str]) -> int | None:
        proc = JobProcess(job_id="j", incarnation="i1", argv=argv, workdir=str(tmp_path), env=env,
                          gpu_indices=(), log_path=tmp_path / "j.log")
        await proc.start(lambda p: None)
        assert await proc._wait(120.0), "the launch did not end"
        return proc.exit_code

    assert await code(["bash", "run.sh"]) == -signal.SIGKILL  # was 137
    assert exit_reason(-signal.SIGKILL, False) == "killed by signal SIGKILL"
    assert await code(["./run.sh"]) == -signal.SIGKILL  # its interpreter line names the shell
    # A program (no shell) that exits 137 itself says so.
    assert await code([sys.executable, "-c", "raise SystemExit(137)"]) == 137


def test_which_commands_run_a_shell(tmp_path: Path) -> None:
    (tmp_path / "env.sh").write_text("#!/usr/bin/env -S bash -e\n")
    (tmp_path / "train.py").write_text("#!/usr/bin/env python\n")
    os.mkfifo(tmp_path / "fifo")
    assert runs_a_shell(["/bin/sh", "-c", "python train.py; echo"], str(tmp_path))
    assert runs_a_shell(["env", "FOO=1", "bash", "run.sh"], str(tmp_path))
    assert runs_a_shell(["./env.sh"], str(tmp_path))
    assert not runs_a_shell(["./train.py"], str(tmp_path))
    assert not runs_a_shell(["python", "train.py"], str(tmp_path))
    assert not runs_a_shell(["fifo"], str(tmp_path))  # (never opened for reading: it would block)
    assert not runs_a_shell(["env"], str(tmp_path))
    # An option's value is no command (`-u HOME` was read as a command "HOME": not a shell).
    assert runs_a_shell(["env", "-u", "HOME", "-C", "/tmp", "bash", "run.sh"], str(tmp_path))
    assert runs_a_shell(["env", "-S", "bash -e", "run.sh"], str(tmp_path))
    assert not runs_a_shell(["env", "-u", "bash", "python", "train.py"], str(tmp_path))


async def test_a_command_under_setsid_lasts_as_long_as_its_program(make_helper: Any, control: Any,
                                                                  tmp_path: Path) -> None:
    """`setsid python train.py` (a habit from a terminal, to outlive the login): the helper
    starts every job in a session of its own, as the leader of its process group, and
    setsid run by a group leader forks its command and exits at once. The launch ended
    there: its program killed at once and the job "finished" in a second, 0 steps trained.
    The helper drops `setsid` (and its options): the program is the launch's own process,
    under the shim as `python train.py` is."""
    from protos.gandiva.v1 import common_pb2, helper_pb2

    await make_helper("s1")
    (tmp_path / "train.py").write_text(
        "import os, sys, time\ntime.sleep(1)\nopen('trained', 'w').write(str(os.getsid(0) == os.getpid()))\n")
    spec = common_pb2.JobSpec(command=["setsid", "python", "train.py"], workdir=str(tmp_path), gpus=1)
    started = await control.helper_command("s1", helper_pb2.HelperCommand(launch=helper_pb2.LaunchJob(
        job_id="j1", incarnation="i0", spec=spec, gpu_indices=[0])), 10)
    assert started.ok, started.message
    await control.wait_for(lambda: control.exit_of("j1", "i0"), 60, "the job's end")
    exit_ = control.exit_of("j1", "i0")
    log = (tmp_path / "logs" / "j1.log").read_text()
    assert (exit_.exit_code, exit_.reason) == (0, "finished"), log
    assert (tmp_path / "trained").read_text() == "True", log  # it ran to its end, in a session of its own
    assert "killed with it" not in log
