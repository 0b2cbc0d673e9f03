"""tf_runtime.launch with real processes (no TensorFlow): a trainer behind a Python driver
and a shell wrapper, launched with the helper's status pipe and launch mark."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("form", ["bash", "tf_runtime.run", "foreign_pipe"])
def test_a_trainer_behind_a_python_driver_reaches_the_pipes_and_stops_its_wrappers(
        tmp_path: Path, form: str) -> None:
    """A driver that runs the trainer with subprocess (close_fds) and goes on after it:
    behind `bash -c 'python driver.py; ...'` the trainer used to fail at its start
    ("GANDIVA_STATUS_FD=N is not an open file descriptor"); as the job's own command
    (`python driver.py`, run under tf_runtime.run) the driver held the runtime, so the
    trainer was a secondary without the pipes (never pre-warmed: its migrations failed);
    after an exit on Gandiva's command (75, a migration) the driver and the shell went on
    with the rest of their scripts. Now the trainer is the first to start the runtime,
    reaches the helper's status pipe through the driver, and stops the wrappers before it
    exits, telling the helper on that pipe, which then ends the launch."""
    marker = tmp_path / "went-on"
    trainer = ("from tf_runtime import runtime; rt = runtime.start(); "
               "rt.controller.status.event('session_ready'); rt.controller._exit(75)")
    driver = tmp_path / "driver.py"
    # foreign_pipe: the driver has put a pipe of its own at the status pipe's number, which
    # the trainer inherits (only the shell holds the helper's there): not the helper's.
    own_pipe = ("import os; n = int(os.environ['GANDIVA_STATUS_FD']); os.dup2(os.pipe()[1], n); "
                if form == "foreign_pipe" else "n = 0; ")
    driver.write_text(f"import subprocess, sys; {own_pipe}"
                      f"rc = subprocess.run([sys.executable, '-c', {trainer!r}], pass_fds=(n,) if n else ()).returncode; "
                      f"open({str(marker)!r}, 'a').write('driver went on after %d\\n' % rc)\n")
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="j1", GANDIVA_STATUS_FD=str(w), GANDIVA_LAUNCH=f"test-{os.getpid()}",
               PYTHONPATH=str(ROOT))
    command = ([sys.executable, "-m", "tf_runtime.run", str(driver)] if form == "tf_runtime.run" else
               ["bash", "-c", f'"$0" "$1"; echo wrapper went on >> {marker}', sys.executable, str(driver)])
    proc = subprocess.Popen(command, env=env, pass_fds=(w,), start_new_session=True, cwd=tmp_path)
    os.close(w)
    events, buf = [], b""
    try:
        deadline = time.monotonic() + 60
        while not any(e["event"] == "launch_end" for e in events) and time.monotonic() < deadline:
            if not select.select([r], [], [], 1.0)[0]:
                continue
            chunk = os.read(r, 4096)
            if not chunk:
                break  # every writer gone: nobody told the helper anything
            buf += chunk
            *lines, buf = buf.split(b"\n")
            events += [json.loads(line) for line in lines if line]
        assert [e["event"] for e in events] == ["session_ready", "launch_end"], (events, marker.exists() and marker.read_text())
        end = events[-1]
        wrappers = 1 if form == "tf_runtime.run" else 2
        assert end["code"] == 75 and len(end["wrappers"]) == wrappers and end["wrappers"][-1] == proc.pid
        # The trainer is gone; the driver and the shell wait, stopped, for the helper.
        # (A stop signal is sent at once, and acted on once the process is scheduled.)
        deadline = time.monotonic() + 30
        while (_state(end["pid"]) not in ("Z", "gone") or any(_state(p) != "T" for p in end["wrappers"])) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [_state(pid) for pid in end["wrappers"]] == ["T"] * wrappers
        assert not marker.exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        os.close(r)


def test_the_jobs_stream_belongs_to_the_launchs_latest_trainer() -> None:
    """Which process of a launch holds the job's stream (two first processes of the job:
    `python train.py & python eval.py` started together): one that does not train leaves
    it to a live trainer, and claims it once gone; the latest trainer then connects again;
    nothing changes without a trainer, or once it has ended."""
    from tf_runtime.launch import HOLD, LEAVE, RETAKE, _launch_file, forget_launch, stream_standing

    mark = f"test-standing-{os.getpid()}"
    env = {"GANDIVA_LAUNCH": mark}
    other = subprocess.Popen(["sleep", "60"])
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())  # no process has it

    def put(kind: str, pid: int) -> None:
        path = Path(str(_launch_file(mark, kind)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(pid))

    try:
        assert stream_standing(env, trained=False) == (HOLD, None)  # no trainer yet
        put("trained", other.pid)
        assert stream_standing(env, trained=False) == (LEAVE, other.pid)
        put("trained", os.getpid())
        assert stream_standing(env, trained=True) == (HOLD, os.getpid())  # nobody left
        put("stream", other.pid)  # another process left the stream to this one
        assert stream_standing(env, trained=True) == (RETAKE, os.getpid())
        put("stream", os.getpid())  # connected again
        assert stream_standing(env, trained=True) == (HOLD, os.getpid())
        put("stream", other.pid)
        put("trained", other.pid)  # a later trainer of the launch: its move, not this one's
        assert stream_standing(env, trained=True) == (HOLD, other.pid)
        put("trained", dead)
        assert stream_standing(env, trained=False) == (HOLD, dead)  # training has ended
        assert stream_standing({}, trained=False) == (HOLD, None)  # not launched by a helper
    finally:
        other.kill()
        other.wait(10)
        forget_launch(mark)
    assert not Path(str(_launch_file(mark, "stream"))).exists()


@pytest.mark.tf
def test_a_process_started_after_the_launchs_training_refuses_commands_at_once(
        runtime_server: Any, tmp_path: Path) -> None:
    """`bash -c 'python train.py; python eval.py'` once training is done: the evaluation's
    shim connects as the job's launch, but never reaches a training boundary, so a suspend
    or a migration tried during it went unanswered (the migration timed out, failed, and the
    scheduler re-queued the finished job from its last checkpoint). Now a process started
    after its launch trained answers at once, refusing, and reports itself not migratable."""
    from protos.gandiva.v1 import runtime_pb2 as pb
    from tf_runtime.autoload import path_with_autoload
    from tf_runtime.launch import forget_launch

    mark = f"test-after-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="after", GANDIVA_INCARNATION="0", GANDIVA_SCHEDULER=runtime_server.address,
               GANDIVA_LAUNCH=mark, PYTHONPATH=path_with_autoload(str(ROOT)))
    trainer = str(ROOT / "tf_runtime" / "examples" / "feed_step.py")
    evaluation = "import time, tensorflow; time.sleep(120)"
    proc = subprocess.Popen(
        ["bash", "-c", '"$0" -m tf_runtime.run "$1" --loop session --steps 3; exec "$0" -c "$2"',
         sys.executable, trainer, evaluation],
        env=env, start_new_session=True, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = runtime_server.wait_for(lambda j, m: j == "after" and m.HasField("hello"), 120).hello
        runtime_server.wait_for(lambda j, m: j == "after" and m.HasField("hello") and m.hello.pid != first.pid, 120)
        ack = runtime_server.wait_ack(runtime_server.send("after", pb.COMMAND_KIND_SUSPEND), 30)
        assert not ack.ok and ack.message.startswith("cannot suspend: this process") and \
            "started after its launch's training had ended" in ack.message, ack.message
        ack = runtime_server.wait_ack(runtime_server.send(
            "after", pb.COMMAND_KIND_STOP_FOR_MIGRATION, str(tmp_path / "ck")), 30)
        assert not ack.ok and ack.message.startswith("not migratable: "), ack.message
        assert not (tmp_path / "ck").exists()
        verdict = runtime_server.wait_for(lambda j, m: j == "after" and m.HasField("migratability")
                                          and "after its launch's training" in m.migratability.reason, 30)
        assert not verdict.migratability.migratable
        assert proc.poll() is None  # the evaluation goes on where it is
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        forget_launch(mark)


@pytest.mark.tf
def test_an_evaluation_beside_the_trainer_does_not_take_the_jobs_stream(
        runtime_server: Any, tmp_path: Path) -> None:
    """`bash -c 'python train.py & python eval.py; wait'`: an evaluation started once the
    trainer trains was a first process of the job too, connected, and replaced the
    trainer's stream, so the job's commands went to a process that never trains (a
    migration refused or timed out). Now it is a secondary of the trainer, as a child of it
    would be: it does not connect unless it trains. One started at once with the trainer
    (connected after it, before its first step) still connects, but the stream is the
    trainer's: once the trainer trains, the evaluation closes its own and the trainer
    connects again; before, the job's commands went to whichever connected last. The
    trainer obeys the suspend."""
    from protos.gandiva.v1 import runtime_pb2 as pb
    from tf_runtime.autoload import path_with_autoload
    from tf_runtime.launch import _trained_flag, forget_launch

    mark = f"test-beside-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="beside", GANDIVA_INCARNATION="0", GANDIVA_SCHEDULER=runtime_server.address,
               GANDIVA_LAUNCH=mark, PYTHONPATH=path_with_autoload(str(ROOT)))
    feed_step = str(ROOT / "tf_runtime" / "examples" / "feed_step.py")
    early_go, train_go, ready = tmp_path / "early-go", tmp_path / "train-go", tmp_path / "late-started"
    trainer = tmp_path / "train.py"  # connects at its import, trains once told to
    trainer.write_text(f"import os, runpy, sys, time\nimport tensorflow\n"
                       f"while not os.path.exists({str(train_go)!r}): time.sleep(0.05)\n"
                       f"sys.argv = [{feed_step!r}, '--loop', 'session', '--steps', '100000', '--step-sleep', '0.02']\n"
                       f"runpy.run_path({feed_step!r}, run_name='__main__')\n")
    # The evaluations import TensorFlow at once (three imports in turn took 50 s here), and
    # start the runtime as the autoload would have, when told (the test's own order).
    def evaluation(go: str, then: str) -> str:
        return ("import os, time\nsched = os.environ.pop('GANDIVA_SCHEDULER')\nimport tensorflow\n"
                f"while not os.path.exists({go!r}): time.sleep(0.05)\n"
                "os.environ['GANDIVA_SCHEDULER'] = sched\nfrom tf_runtime import runtime\nruntime.start()\n"
                f"{then}\ntime.sleep(120)")
    early = evaluation(str(early_go), "")
    late = evaluation(str(_trained_flag(mark)), f"open({str(ready)!r}, 'w').close()")
    proc = subprocess.Popen(
        ["bash", "-c", '"$0" -m tf_runtime.run "$1" & "$0" -c "$2" & "$0" -c "$3"; wait',
         sys.executable, str(trainer), early, late],
        env=env, start_new_session=True, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = runtime_server.wait_for(lambda j, m: j == "beside" and m.HasField("hello"), 120)
        trainer_pid = first.hello.pid
        early_go.touch()  # the early evaluation connects after the trainer ...
        runtime_server.wait_for(lambda j, m: j == "beside" and m.HasField("hello") and m.hello.pid != trainer_pid, 120)
        train_go.touch()  # ... which then trains: the evaluation leaves, the trainer connects again
        runtime_server.wait_for(lambda j, m: j == "beside" and m.HasField("hello") and m.hello.pid == trainer_pid
                                and m is not first, 120)
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        ack = runtime_server.wait_ack(runtime_server.send("beside", pb.COMMAND_KIND_SUSPEND), 60)
        assert ack.ok and ack.step >= 1, ack.message
        hellos = [h.pid for h in runtime_server.of_kind("beside", "hello")]
        assert len(hellos) == 3 and hellos.count(trainer_pid) == 2, hellos  # the late one never connected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        forget_launch(mark)
