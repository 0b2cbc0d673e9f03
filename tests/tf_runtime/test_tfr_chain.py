"""The wrapper chain and the controller against a fake session and scripted commands."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tf_runtime.controller as controller_mod
from tf_runtime import EXIT_KILLED, EXIT_MIGRATED
from tf_runtime.checkpoint import CheckpointError, validate
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import Settings
from tf_runtime.gpu_release import NoReleaseBackend
from tf_runtime.pipes import StatusPipe
from tf_runtime.testing import Exited, FakeWorld


def start_training(world: FakeWorld, steps: int = 1) -> None:
    world.run("init")
    world.run("read_gs")
    for _ in range(steps):
        world.run("train")


def test_only_training_runs_are_boundaries(world: FakeWorld) -> None:
    world.run("init")
    world.run("eval")
    assert world.controller.meter.steps == 0
    for _ in range(3):
        world.run("train")
        world.run("eval")  # an eval between steps is not a mini-batch
    snap = world.controller.meter.snapshot()
    assert snap.steps == 3
    assert snap.metrics == {"loss": pytest.approx(1 / 3)}
    assert snap.rate > 0


def test_command_waits_for_the_end_of_the_training_step(world: FakeWorld, tmp_path: Path) -> None:
    """A command is applied between two steps: after a step's runs (here an evaluation,
    which changes nothing), right before the run that begins the next step."""
    start_training(world)
    world.controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "ck")))
    world.run("eval")  # not a boundary: nothing happens yet
    assert world.channel.acks == []
    world.run("train")
    ack = world.channel.acks[0]
    assert (ack.ok, ack.step, ack.checkpoint_path) == (True, 1, str(tmp_path / "ck"))
    assert validate(tmp_path / "ck")["global_step"] == 1 and world.sess.step == 2
    assert "wait_boundary" in ack.durations_s and "save" in ack.durations_s


def test_scripted_schedule_takes_effect_at_the_step_it_arrived_in(world: FakeWorld,
                                                                   tmp_path: Path) -> None:
    """Commands arriving in the middle of step N are applied when step N returns."""
    ctl = world.controller
    world.sess.hooks = {
        3: lambda: ctl.enqueue(Command("ck3", Kind.CHECKPOINT, str(tmp_path / "a"))),
        5: lambda: (ctl.enqueue(Command("s5", Kind.SUSPEND)), ctl.enqueue(Command("r5", Kind.RESUME))),
        7: lambda: ctl.enqueue(Command("ck7", Kind.CHECKPOINT, str(tmp_path / "a"))),
    }
    start_training(world, steps=9)
    steps = {a.command_id: a.step for a in world.channel.acks}
    assert steps == {"ck3": 3, "s5": 5, "r5": 5, "ck7": 7}
    assert validate(tmp_path / "a")["global_step"] == 7  # replaced atomically by the later one
    assert world.sess.step == 9


def test_suspend_blocks_training_and_holds_other_threads(world: FakeWorld) -> None:
    start_training(world)
    ctl = world.controller
    ctl.enqueue(Command("s", Kind.SUSPEND))
    trainer = threading.Thread(target=world.run, args=("train",))
    trainer.start()
    world.channel.wait_ack("s")
    assert ctl.suspended and trainer.is_alive()

    other_done = threading.Event()
    other = threading.Thread(target=lambda: (world.run("eval"), other_done.set()))
    other.start()  # a Supervisor-like background thread: held at the gate
    time.sleep(0.2)
    assert not other_done.is_set()
    steps_while_suspended = world.sess.step

    ctl.enqueue(Command("r", Kind.RESUME))
    trainer.join(5)
    other.join(5)
    assert not trainer.is_alive() and other_done.is_set()
    assert world.channel.wait_ack("r").ok and not ctl.suspended
    # Held before its next training run (the step's end was the boundary before it).
    assert (steps_while_suspended, world.sess.step) == (1, 2)


def test_suspend_does_not_deadlock_with_a_run_in_flight(world: FakeWorld,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_mod, "DRAIN_TIMEOUT_S", 0.2)
    start_training(world)
    bg = threading.Thread(target=world.run, args=("blocking_eval",))
    bg.start()
    assert world.sess.in_block.wait(5)
    world.controller.enqueue(Command("s", Kind.SUSPEND))
    trainer = threading.Thread(target=world.run, args=("train",))
    trainer.start()
    ack = world.channel.wait_ack("s")
    assert ack.ok and "still in flight" in ack.message
    world.sess.block.set()
    bg.join(5)
    world.controller.enqueue(Command("r", Kind.RESUME))
    trainer.join(5)
    assert not bg.is_alive() and not trainer.is_alive()


def test_without_memory_release_a_suspend_with_a_directory_migrates(tmp_path: Path) -> None:
    world = FakeWorld()
    world.controller.backend = NoReleaseBackend("driver too old")
    start_training(world)
    world.controller.enqueue(Command("s1", Kind.SUSPEND))  # no directory: suspend in place
    world.controller.enqueue(Command("r1", Kind.RESUME))
    world.run("train")
    assert "GPU memory held (driver too old)" in world.channel.acks[0].message
    world.controller.enqueue(Command("s2", Kind.SUSPEND, str(tmp_path / "ck")))
    with pytest.raises(Exited) as exc:
        world.run("train")
    assert exc.value.code == EXIT_MIGRATED and validate(tmp_path / "ck")["global_step"] == 2


def test_a_kill_received_while_starting_leaves_before_the_first_mini_batch(world: FakeWorld,
                                                                        tmp_path: Path) -> None:
    """A copy told to exit while it still starts (its helper hung, the job re-placed:
    benchmarks/chaos.py) used to train its first mini-batch first, as commands wait for a
    step's end: beside the job's new copy if that one started faster. Now it leaves before
    it; the command queued before the kill is answered as not done."""
    world.run("init")
    world.controller.enqueue(Command("ck", Kind.CHECKPOINT, str(tmp_path / "c")))
    world.controller.enqueue(Command("k", Kind.KILL))
    world.run("read_gs")
    with pytest.raises(Exited) as exc:
        world.run("train")
    assert exc.value.code == EXIT_KILLED
    assert world.sess.step == 0, "the stale copy trained a mini-batch after it was told to exit"
    assert [(a.command_id, a.ok) for a in world.channel.acks] == [("ck", False), ("k", True)]
    assert world.channel.closed


@pytest.mark.parametrize("then", ["resume", "checkpoint", "migrate", "kill"])
def test_a_suspend_queued_before_the_first_training_run_holds_before_it(
        then: str, tmp_path: Path) -> None:
    """A job placed into a time-slice group is suspended as soon as its shim connects: the
    suspend used to wait for the end of its first training run, so it trained that
    mini-batch beside the group's running job (memory and compute on one GPU). Now it holds
    before that run, acked with its step; what comes next is applied from there: a resume
    trains on, a checkpoint or a migration saves the restore point (nothing trained since),
    a kill leaves."""
    world = FakeWorld()
    ctl = world.controller
    world.run("init")
    world.run("read_gs")
    ctl.enqueue(Command("s", Kind.SUSPEND))
    exited: list[int] = []

    def first_step() -> None:
        try:
            world.run("train")
        except Exited as exc:
            exited.append(exc.code)

    trainer = threading.Thread(target=first_step)
    trainer.start()
    ack = world.channel.wait_ack("s", timeout=30)
    assert ack.ok and ack.step == 0 and ctl.suspended
    assert world.sess.step == 0 and ctl.boundaries == 0, "trained before the suspend"
    assert trainer.is_alive()
    ck = tmp_path / "ck"
    follow = {"resume": [Command("r", Kind.RESUME)],
              "checkpoint": [Command("ck", Kind.CHECKPOINT, str(ck)), Command("r", Kind.RESUME)],
              "migrate": [Command("m", Kind.STOP_FOR_MIGRATION, str(ck))],
              "kill": [Command("k", Kind.KILL)]}[then]
    for cmd in follow:
        ctl.enqueue(cmd)
    trainer.join(30)
    assert not trainer.is_alive()
    assert [(a.command_id, a.ok, a.step) for a in world.channel.acks] == \
        [("s", True, 0)] + [(c.id, True, 0) for c in follow], world.channel.acks
    assert exited == {"migrate": [EXIT_MIGRATED], "kill": [EXIT_KILLED]}.get(then, [])
    assert world.sess.step == (1 if then in ("resume", "checkpoint") else 0)
    if then in ("checkpoint", "migrate"):
        assert validate(ck)["global_step"] == 0
    # Not judged on no step ("no training run advances the global step") for good.
    assert ctl.migratable is None and world.channel.migratability == []
    if then == "resume":
        world.run("train")
        assert world.sess.step == 2 and ctl.meter.steps == 2


def test_checkpoint_and_kill_while_suspended(world: FakeWorld, tmp_path: Path) -> None:
    start_training(world)
    ctl = world.controller
    for cmd in (Command("s", Kind.SUSPEND), Command("ck", Kind.CHECKPOINT, str(tmp_path / "c")),
                Command("k", Kind.KILL)):
        ctl.enqueue(cmd)
    with pytest.raises(Exited) as exc:
        world.run("train")
    assert exc.value.code == EXIT_KILLED
    assert [a.command_id for a in world.channel.acks] == ["s", "ck", "k"]
    assert validate(tmp_path / "c")["global_step"] == 1
    assert world.channel.closed  # acks flushed before leaving


def test_stop_for_migration_checkpoints_then_exits_75(world: FakeWorld, tmp_path: Path) -> None:
    start_training(world, steps=4)
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    with pytest.raises(Exited) as exc:
        world.run("train")
    assert exc.value.code == EXIT_MIGRATED
    ack = world.channel.acks[-1]
    assert ack.ok and ack.step == 4 and ack.checkpoint_path == str(tmp_path / "m")
    assert validate(tmp_path / "m")["global_step"] == 4 and world.sess.step == 4


def test_program_that_never_reads_the_global_step_is_not_migratable(tmp_path: Path) -> None:
    world = FakeWorld()
    world.run("init")
    world.run("train_nogs")
    assert world.channel.migratability == []  # not judged after one step
    world.run("train_nogs")
    assert world.channel.migratability[0][0] is False
    assert "global step" in world.channel.migratability[0][1]
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    world.run("train_nogs")  # refused: it keeps training
    ack = world.channel.acks[-1]
    assert not ack.ok and ack.message.startswith("not migratable")
    assert not (tmp_path / "m").exists()


def test_stop_for_migration_waits_for_the_verdict(tmp_path: Path) -> None:
    world = FakeWorld()
    world.run("init")
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    world.run("train_nogs")  # step 1: not yet known whether the loop resumes from the step
    assert world.channel.acks == []
    world.run("train_nogs")  # step 2: judged not migratable
    world.run("train_nogs")  # so refused before step 3
    assert not world.channel.acks[0].ok and not (tmp_path / "m").exists()


def test_program_reading_the_global_step_is_migratable(world: FakeWorld) -> None:
    start_training(world)
    # Not after one step: the second is where a value the first returned would first be
    # fed back (state carried in Python, which no checkpoint holds).
    assert world.channel.migratability == []
    world.run("train")
    assert world.channel.migratability == [(True, "")]


def test_restore_happens_right_after_the_init_run(tmp_path: Path) -> None:
    donor = FakeWorld()
    start_training(donor, steps=7)
    donor.adapter.save(str(tmp_path / "ck"), "j")
    world = FakeWorld(Settings(job_id="j", restore_dir=str(tmp_path / "ck")))
    world.run("eval")  # a setup run before init: nothing restored yet
    assert world.sess.step == 0
    world.run("init")
    assert world.sess.step == 7  # the program's own read of the step now sees 7
    world.run("train")
    assert world.controller.meter.steps == 8 and world.controller.restored_step == 7


def test_program_restoring_its_own_checkpoint(tmp_path: Path) -> None:
    donor = FakeWorld()
    start_training(donor, steps=7)
    donor.adapter.save(str(tmp_path / "ck"), "j")
    # No init run: the program restores its own checkpoint; ours follows right after it.
    world = FakeWorld(Settings(restore_dir=str(tmp_path / "ck")))
    world.run("own_restore")
    assert world.sess.step == 7
    # Init, then the program restores a pre-trained checkpoint over it: restored again
    # before the first training step, so the migrated state wins.
    world = FakeWorld(Settings(restore_dir=str(tmp_path / "ck")))
    world.run("init")
    world.run("own_restore")
    assert world.sess.step == 100
    world.run("train")
    assert world.sess.step == 8 and world.controller.meter.steps == 8


def test_half_written_checkpoint_is_refused_at_restore(tmp_path: Path) -> None:
    donor = FakeWorld()
    start_training(donor, steps=3)
    donor.adapter.save(str(tmp_path / "ck"), "j")
    (tmp_path / "ck" / "model.index").write_text("3 and more")  # size no longer matches
    world = FakeWorld(Settings(restore_dir=str(tmp_path / "ck")))
    world.run("init")  # it might be an evaluation session's: fatal once this session trains
    with pytest.raises(CheckpointError, match="model.index"):
        world.run("train")
    assert world.sess.step == 0 and world.controller.meter.steps == 0  # nothing trained


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("saved,built", [(1, 2), (4, 2), (2, 2), (1, 1)])
def test_a_checkpoint_of_another_tower_count_is_refused_before_any_training_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool, saved: int, built: int) -> None:
    """One tower per device, grown (1 -> 2) or shrunk (4 -> 2): the restore is refused, the
    scheduler hears why (TowerReport), and the process exits 76 without training a step,
    cold or pre-warmed. The same tower count restores as ever."""
    from tf_runtime import EXIT_TOWERS_CHANGED

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(built)))
    donor = FakeWorld()
    donor.adapter.tower_count = saved
    start_training(donor, steps=5)
    donor.adapter.save(str(tmp_path / "ck"), "j")
    if warm:
        control_r, control_w = os.pipe()
        os.write(control_w, json.dumps({"cmd": "activate", "restore_checkpoint": str(tmp_path / "ck")})
                 .encode() + b"\n")
        world = FakeWorld(Settings(job_id="j", warm=True, warm_step=True, control_fd=control_r))
    else:
        world = FakeWorld(Settings(job_id="j", restore_dir=str(tmp_path / "ck")))
    world.adapter.tower_count = built
    if saved == built:
        world.run("init")
        world.run("train")
        assert world.sess.step == 6 and [t[:2] for t in world.channel.towers] == [(built, 0)]  # no refusal
        return
    with pytest.raises(Exited) as exc:  # cold: at the restore point; warm: at activation
        world.run("init")
        world.run("train")
    assert exc.value.code == EXIT_TOWERS_CHANGED
    assert world.sess.step == 0 and world.controller.meter.steps == 0  # nothing trained, nothing restored
    ((towers, in_checkpoint, devices, reason),) = world.channel.towers
    assert (towers, in_checkpoint, devices) == (built, saved, built)
    assert "one tower per device" in reason and "tf_runtime.towers" in reason


@pytest.mark.parametrize("source,built", [(1, 2), (2, 1), (2, 2)])
def test_a_warm_destination_with_another_tower_count_refuses_before_holding(
        monkeypatch: pytest.MonkeyPatch, source: int, built: int) -> None:
    """The source reports its graph's towers after its first step; a grow's pre-warmed
    destination given that count (GANDIVA_SOURCE_TOWERS) refuses, before it rehearses or
    holds, when its own graph has another: the source is never stopped."""
    from tf_runtime import EXIT_TOWERS_CHANGED

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(built)))
    src = FakeWorld()
    src.adapter.tower_count = source
    start_training(src, steps=2)
    assert [t[:2] for t in src.channel.towers] == [(source, 0)]  # its graph's count, once
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')
    status_r, status_w = os.pipe()
    world = FakeWorld(Settings(job_id="j", warm=True, warm_step=True, control_fd=control_r,
                               source_towers=source), status=StatusPipe.from_fd(status_w))
    world.adapter.tower_count = built
    if source == built:
        start_training(world, steps=1)  # held, activated, trained
        assert world.sess.step == 1 and world.channel.towers[-1][:2] == (built, 0)
        return
    world.run("init")  # perhaps an evaluation session: compared where the process holds
    with pytest.raises(Exited) as exc:
        world.run("read_gs")  # the first run after the restore point: it would hold here
    assert exc.value.code == EXIT_TOWERS_CHANGED and world.sess.step == 0
    ((towers, of_source, devices, reason),) = world.channel.towers
    assert (towers, of_source, devices) == (built, source, built) and "one tower per device" in reason
    os.close(status_w)
    with os.fdopen(status_r) as fh:
        events = [json.loads(line)["event"] for line in fh]
    assert "restore_refused" in events and "warm_ready" not in events


def warm_world(tmp_path: Path, warm_step: bool) -> tuple[FakeWorld, int, int]:
    """A warm FakeWorld with status and control pipes, and a step-4 checkpoint at ck."""
    donor = FakeWorld()
    start_training(donor, steps=4)
    donor.adapter.save(str(tmp_path / "ck"), "j")
    status_r, status_w = os.pipe()
    control_r, control_w = os.pipe()
    status = StatusPipe(os.fdopen(status_w, "w", buffering=1))
    world = FakeWorld(Settings(warm=True, warm_step=warm_step, control_fd=control_r),
                      status=status)
    return world, status_r, control_w


def test_status_pipe_and_warm_activation(tmp_path: Path) -> None:
    world, status_r, control_w = warm_world(tmp_path, warm_step=False)
    os.write(control_w, (json.dumps({"cmd": "activate", "restore_checkpoint": str(tmp_path / "ck")})
                         + "\n").encode())
    world.run("init")  # holds, reads the activation, restores
    world.run("train")
    world.controller.status._stream.close()  # type: ignore[union-attr]
    events = [json.loads(line) for line in os.fdopen(status_r).read().splitlines()]
    assert [e["event"] for e in events] == ["session_ready", "warm_ready", "restored",
                                           "first_step_done"]
    assert events[2]["step"] == 4 and events[3]["step"] == 5


def test_warm_exit_leaves_without_training() -> None:
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "exit"}\n')
    world = FakeWorld(Settings(warm=True, control_fd=control_r))
    with pytest.raises(Exited) as exc:
        world.run("init")
    assert exc.value.code == 0 and world.sess.step == 0


def activate_when_held(world: FakeWorld, control_w: int, ck: Path) -> tuple[threading.Thread, dict[str, object]]:
    """A helper thread: once the warm process holds (its gate closed), note what it
    rehearsed and where its step is, then activate it with checkpoint `ck`."""
    seen: dict[str, object] = {}

    def helper() -> None:
        while not world.controller.gate.closed:
            time.sleep(0.001)
        seen.update(rehearsals=world.adapter.rehearsals, step=world.sess.step)
        os.write(control_w, (json.dumps({"cmd": "activate", "restore_checkpoint": str(ck)})
                             + "\n").encode())

    t = threading.Thread(target=helper)
    t.start()
    return t, seen


def status_events(world: FakeWorld, status_r: int) -> list[dict[str, object]]:
    # Closed through its file object: closing the bare fd would leave that object to
    # close the number again when collected, maybe another test's pipe by then.
    world.controller.status._stream.close()  # type: ignore[union-attr]
    return [json.loads(line) for line in os.fdopen(status_r).read().splitlines()]


def test_warm_step_rehearses_the_first_step_then_holds(tmp_path: Path) -> None:
    """GANDIVA_WARM_STEP, a program that trains right after initialising: its first
    training run is run once (and undone) before warm_ready; other threads' runs are
    held by the gate while it holds."""
    world, status_r, control_w = warm_world(tmp_path, warm_step=True)
    world.run("init")  # no hold here: the next run may be the training run
    t, seen = activate_when_held(world, control_w, tmp_path / "ck")
    assert world.run("train") == [1 / 5]  # the program's own step, from the restored step
    t.join()
    assert seen == {"rehearsals": 1, "step": 0}  # rehearsed and undone before the hold
    assert world.adapter.rehearsals == 1 and not world.controller.gate.closed
    world.run("train")
    assert world.controller.meter.steps == 6 and world.sess.step == 6
    events = status_events(world, status_r)
    assert [e["event"] for e in events] == ["session_ready", "warm_ready", "restored",
                                           "first_step_done"]
    assert "warm_step_s" in events[1]
    assert events[2]["step"] == 4 and events[3]["step"] == 5


@pytest.mark.parametrize("signature", ["train", "", "no_such_run"])
def test_warm_process_holds_before_the_program_reads_the_step(tmp_path: Path,
                                                              signature: str) -> None:
    """A program that reads the global step after initialising (and feeds its first
    mini-batch from it) must read the restored step: the warm process holds before that
    read. It rehearses the source's training run when it has its signature."""
    world, status_r, control_w = warm_world(tmp_path, warm_step=True)
    world.controller.settings.warm_signature = signature
    world.run("init")
    t, seen = activate_when_held(world, control_w, tmp_path / "ck")
    assert world.run("read_gs") == 4  # the checkpoint's step, not the warm process's 0
    t.join()
    rehearsed = 1 if signature == "train" else 0
    assert seen == {"rehearsals": rehearsed, "step": 0}
    assert world.run("train") == [1 / 5]
    events = status_events(world, status_r)
    assert [e["event"] for e in events] == ["session_ready", "warm_ready", "restored",
                                           "first_step_done"]
    assert ("warm_step_s" in events[1]) == bool(rehearsed)


def test_a_warm_process_held_by_another_thread_holds_the_training_threads_read(
        tmp_path: Path) -> None:
    """A program whose evaluation thread makes the first run after the restore point
    (so that thread rehearses and holds) while its training thread reads the step: the
    read waits for the restore and sees the checkpoint's step. Before, the gate closed
    only after the rehearsal, the read went through meanwhile and saw the warm process's
    own 0: the migrated copy trained on the first mini-batches again (other weights)."""
    world, status_r, control_w = warm_world(tmp_path, warm_step=True)
    world.controller.settings.warm_signature = "train"
    world.run("init")
    rehearsing, release = threading.Event(), threading.Event()
    rehearse = world.adapter.rehearse

    def slow_rehearse(step: object) -> dict[str, float]:
        rehearsing.set()
        release.wait(60)
        return rehearse(step)  # type: ignore[arg-type]

    world.adapter.rehearse = slow_rehearse  # type: ignore[method-assign]
    evaluator = threading.Thread(target=world.run, args=("eval",))
    evaluator.start()  # takes the hold: rehearses, then holds
    assert rehearsing.wait(60)
    read: list[object] = []
    reader = threading.Thread(target=lambda: read.append(world.run("read_gs")))
    reader.start()
    deadline = time.monotonic() + 60
    while reader.is_alive() and world.controller._warm_waiting == 0 and \
            time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    t, seen = activate_when_held(world, control_w, tmp_path / "ck")
    reader.join(60)
    evaluator.join(60)
    t.join(60)
    assert read == [4]  # the checkpoint's step, not the warm process's 0
    assert seen == {"rehearsals": 1, "step": 0}  # rehearsed and undone before the hold
    assert world.run("train") == [1 / 5] and world.sess.step == 5
    assert [e["event"] for e in status_events(world, status_r)] == [
        "session_ready", "warm_ready", "restored", "first_step_done"]


def test_first_training_run_is_reported_as_a_signature(world: FakeWorld) -> None:
    start_training(world, steps=3)
    assert world.channel.signatures == ["train"]  # once, at the first training run


def test_warm_process_reports_its_signature_once_its_stream_opens() -> None:
    """A warm process rehearses its first training run before it has a stream (that
    opens at activation): the signature goes out once, on the stream it activated."""
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')
    world = FakeWorld(Settings(warm=True, warm_step=True, control_fd=control_r))
    ctl = world.controller
    ctl.channel = None
    ctl._on_activate = lambda step: setattr(ctl, "channel", world.channel)
    world.run("init")
    world.run("train")
    world.run("train")
    assert world.adapter.rehearsals == 1 and ctl.channel is world.channel
    assert world.channel.signatures == ["train"]


def test_warm_step_exit_and_activation_without_checkpoint() -> None:
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "exit"}\n')
    world = FakeWorld(Settings(warm=True, warm_step=True, control_fd=control_r))
    world.run("init")
    with pytest.raises(Exited) as exc:
        world.run("train")
    assert exc.value.code == 0 and world.sess.step == 0 and world.adapter.rehearsals == 1

    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')
    world = FakeWorld(Settings(warm=True, warm_step=True, control_fd=control_r))
    world.run("init")
    world.run("train")  # rehearsed and undone: the job goes on from its own state
    assert world.sess.step == 1 and world.controller.meter.steps == 1


def test_save_op_prebuilt_once_after_the_first_step_unless_a_rehearsal_did() -> None:
    world = FakeWorld(Settings(prebuild_save=True))
    start_training(world, steps=3)
    assert world.adapter.prebuilt_saves == 1 and world.controller.meter.steps == 3
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')
    warm = FakeWorld(Settings(warm=True, warm_step=True, prebuild_save=True, control_fd=control_r,
                              warm_signature="train"))
    start_training(warm, steps=2)
    assert warm.adapter.prebuilt_saves == 0 and warm.adapter.rehearsals == 1
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')
    unrehearsed = FakeWorld(Settings(warm=True, warm_step=True, prebuild_save=True,
                                     control_fd=control_r))  # no signature: no rehearsal
    start_training(unrehearsed, steps=2)
    assert unrehearsed.adapter.prebuilt_saves == 1 and unrehearsed.adapter.rehearsals == 0
    off = FakeWorld()  # Settings' default: no pre-build
    start_training(off, steps=2)
    assert off.adapter.prebuilt_saves == 0


def test_bad_control_line_names_the_problem() -> None:
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "go"}\n')
    world = FakeWorld(Settings(warm=True, control_fd=control_r))
    with pytest.raises(RuntimeError, match="unknown cmd 'go'"):
        world.run("init")


def test_commands_left_when_the_program_ends_are_refused(world: FakeWorld) -> None:
    start_training(world)
    world.controller.enqueue(Command("late", Kind.SUSPEND))
    world.controller.finish()
    ack = world.channel.acks[-1]
    assert ack.command_id == "late" and not ack.ok and "finished" in ack.message


def test_commands_need_a_directory_where_they_write() -> None:
    with pytest.raises(ValueError, match="CHECKPOINT needs a checkpoint_dir"):
        Command("x", Kind.CHECKPOINT)


def test_a_step_of_several_training_runs_takes_commands_after_the_one_that_advances_it(
        world: FakeWorld, tmp_path: Path) -> None:
    """A GAN-style loop: a discriminator run that leaves the global step alone, then a
    generator run that advances it. A checkpoint between the two would hold the
    discriminator's update without the step, and a restored program would apply it
    again; commands wait for the run that completes the step. Until the program's loop
    is seen (here never: the runs are written out), whether a training run after the
    advancing one ends that step or begins the next is not known, so a checkpoint waits
    until it is (from the third step's first run: the usual order's reading)."""
    start_training(world, steps=0)
    world.run("train_d")
    world.run("train")  # step 1
    world.controller.enqueue(Command("ck", Kind.CHECKPOINT, str(tmp_path / "ck")))
    world.run("train_d")
    assert world.channel.acks == []  # mid-step: not yet
    world.run("train")
    assert world.channel.acks == []  # step 2: which run ends a step is not known yet
    world.run("train_d")  # known now: taken before it, the next step's first run
    ack = world.channel.acks[0]
    assert (ack.ok, ack.step) == (True, 2) and validate(tmp_path / "ck")["global_step"] == 2
    world.run("train")  # step 3
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    with pytest.raises(Exited):
        world.run("train_d")
    assert world.channel.acks[-1].step == 3
    assert world.controller.meter.steps == 3  # a mini-batch per step, not per run
    assert world.channel.migratability == [(True, "")]


def test_a_program_whose_training_never_advances_the_step_is_not_migratable(
        world: FakeWorld, tmp_path: Path) -> None:
    start_training(world, steps=0)
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    for _ in range(controller_mod.ADVANCE_WITHIN_RUNS - 1):
        world.run("train_d")
    assert world.channel.acks == [] and world.channel.migratability == []
    world.run("train_d")
    verdict = world.channel.migratability[0]
    assert verdict[0] is False and "advances the global step" in verdict[1]
    assert not world.channel.acks[0].ok and "not migratable" in world.channel.acks[0].message
    world.controller.enqueue(Command("s", Kind.SUSPEND))
    world.controller.enqueue(Command("r", Kind.RESUME))
    world.run("train_d")  # suspending in place still works, at any run
    assert [a.ok for a in world.channel.acks[1:]] == [True, True]


def test_training_moves_to_a_new_session_when_the_program_closes_its_own(
        world: FakeWorld, tmp_path: Path) -> None:
    """A program that closes its session mid-run and goes on in a new one (restoring its
    own checkpoint): the new session's steps are the boundaries from then on."""
    from tf_runtime.chain import build_chain
    from tf_runtime.testing import FakeAdapter

    start_training(world, steps=3)
    second = FakeAdapter(world.sess)
    chain = build_chain(lambda f, fd, o, m: world.sess.run(f, fd, o, m), second, world.controller,
                        world.controller.gate)
    chain.run("train")  # the first session is still open: a second model, not a boundary
    assert world.controller.meter.steps == 3
    world.adapter.closed = True
    world.controller.enqueue(Command("ck", Kind.CHECKPOINT, str(tmp_path / "ck")))
    chain.run("read_gs")
    chain.run("train")
    chain.run("train")  # applied before it, the new session's step 5 done
    ack = world.channel.acks[0]
    assert ack.ok and ack.step == 5 == validate(tmp_path / "ck")["global_step"]
    assert second.saves == [str(tmp_path / "ck")]


def _second_session(world: FakeWorld, global_step: bool = True) -> tuple[Any, Any]:
    """Another session of the program (a model in a graph of its own, with a step counter
    of its own): its chain through the world's controller, and its adapter."""
    from tf_runtime.chain import build_chain
    from tf_runtime.testing import FakeAdapter, FakeSession

    class Adapter(FakeAdapter):
        def has_global_step(self) -> bool:
            return global_step

    other = FakeSession()
    adapter = Adapter(other)
    chain = build_chain(lambda f, fd, o, m: other.run(f, fd, o, m), adapter, world.controller,
                        world.controller.gate)
    return chain, adapter


@pytest.mark.parametrize("closed", [False, True], ids=["stays_open", "closed_between_steps"])
def test_a_second_model_trained_in_a_session_of_its_own_is_not_migratable(
        closed: bool, world: FakeWorld, tmp_path: Path) -> None:
    """Co-distillation in two graphs (programs/distill.py --teacher online): each step the
    teacher trains in its session, then the student in the training session. Only one
    session's variables go into a checkpoint; the job used to be migrated and a restarted
    copy started the other model over (other weights, probed). Now it is not migratable,
    naming why, and suspended in place; a model trained and closed between two steps (a
    probe trained from scratch each time) keeps nothing, and leaves the job migratable."""
    teacher, adapter = _second_session(world)
    world.run("init")
    if not closed:
        teacher.run("init")
    world.run("read_gs")
    for _ in range(4):
        if not closed:
            teacher.run("train")
        world.run("train")
        world.run("read_gs")
        if closed:  # a probe trained from scratch after each step, then closed
            probe, adapter = _second_session(world, global_step=False)
            probe.run("init")
            probe.run("train")
            adapter.closed = True
    verdict = world.channel.migratability[-1]
    if closed:
        assert verdict == (True, ""), verdict[1]
        return
    assert verdict[0] is False and "second model in another session" in verdict[1]
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    world.controller.enqueue(Command("s", Kind.SUSPEND))
    world.controller.enqueue(Command("r", Kind.RESUME))
    teacher.run("train")
    world.run("train")
    acks = world.channel.acks
    assert not acks[0].ok and "second model" in acks[0].message
    assert [a.ok for a in acks[1:]] == [True, True] and not (tmp_path / "m").exists()


def test_another_model_trained_after_the_first_ones_session_closed_is_not_migratable(
        world: FakeWorld, tmp_path: Path) -> None:
    """Distillation's recipe in one script (programs/distill.py --teacher pretrain): the
    teacher trained in a session the program then closes, then the student in a new
    session and graph. Training went over to the student's session and the job stayed
    migratable; a restarted copy trained the teacher first, its session unable to take
    the student's checkpoint, and failed ("Key ... not found in checkpoint", probed). Now
    the student's training is not migratable, naming why; it is suspended in place."""
    from tf_runtime.chain import build_chain
    from tf_runtime.testing import FakeAdapter

    class Student(FakeAdapter):
        def trainable_names(self) -> frozenset[str]:
            return frozenset({"student/w:0"})

    start_training(world, steps=3)
    assert world.channel.migratability == [(True, "")]
    world.adapter.closed = True
    student = Student(world.sess)
    chain = build_chain(lambda f, fd, o, m: world.sess.run(f, fd, o, m), student,
                        world.controller, world.controller.gate)
    chain.run("init")
    chain.run("read_gs")
    chain.run("train")
    verdict = world.channel.migratability[-1]
    assert verdict[0] is False and "another model after the one it trained first" in verdict[1]
    assert "'w:0'" in verdict[1]
    world.controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    world.controller.enqueue(Command("s", Kind.SUSPEND))
    world.controller.enqueue(Command("r", Kind.RESUME))
    chain.run("train")
    acks = world.channel.acks
    assert not acks[0].ok and "another model" in acks[0].message
    assert [a.ok for a in acks[1:]] == [True, True] and not (tmp_path / "m").exists()


def test_a_session_without_a_global_step_initialised_after_the_training_one_stays_unbound(
        world: FakeWorld) -> None:
    """Distillation with a frozen teacher (programs/distill.py --teacher frozen): the student
    initialised, then the teacher's graph in a session of its own (no global step), then
    `step = student.run(gs)` and the loop. Binding the teacher's session at its initialiser
    took the student's read of the step for another session's: the job was refused as
    reading the step "only after its first training run", and a warm copy tried the
    source's training run in the teacher's graph. The student's session stays bound."""
    teacher, _ = _second_session(world, global_step=False)
    world.run("init")
    teacher.run("init")
    world.run("read_gs")
    for _ in range(3):
        teacher.run("eval")
        world.run("train")
        world.run("read_gs")
    assert world.channel.migratability == [(True, "")]
    assert world.controller.meter.steps == 3


def test_the_step_the_job_started_at_travels_with_its_checkpoints(tmp_path: Path) -> None:
    """StopAtStepHook(num_steps=N) counts from where the job started: every checkpoint
    carries that step (here 100, the program's own checkpoint it resumed from), and a
    restored process takes it from there, not from its restore."""
    first = FakeWorld()
    first.run("init")
    first.run("own_restore")  # the program resumes its own checkpoint of step 100
    first.run("read_gs")
    first.run("train")
    first.controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "a")))
    first.run("train")
    assert first.controller.job_start_step == 100
    assert validate(tmp_path / "a")["start_step"] == 100
    assert validate(tmp_path / "a")["global_step"] == 101  # taken before the second run

    second = FakeWorld(Settings(job_id="j", restore_dir=str(tmp_path / "a")))
    start_training(second, steps=1)
    assert second.sess.step == 102 and second.controller.job_start_step == 100
    second.controller.enqueue(Command("c2", Kind.CHECKPOINT, str(tmp_path / "b")))
    second.run("train")
    assert validate(tmp_path / "b")["start_step"] == 100


def test_a_run_that_is_not_a_step_tells_the_scheduler_no_mini_batch_is_due(world: FakeWorld,
                                                                          tmp_path: Path) -> None:
    """An evaluation (or the program's own save) between steps, and a command applied at a
    boundary (a checkpoint's save), are reported as such while they last: the scheduler's
    hang detection does not count them against the job's mini-batch time."""
    start_training(world, steps=2)
    meter, inner = world.controller.meter, world.sess.run
    seen: list[tuple[str, bool]] = []

    def run(fetches, *rest):  # type: ignore[no-untyped-def]
        seen.append((fetches, meter.snapshot().other_run))
        return inner(fetches, *rest)

    world.sess.run = run  # type: ignore[method-assign]
    world.run("eval")
    world.run("train")
    assert seen == [("eval", True), ("train", False)]
    assert not meter.snapshot().other_run
    saving: list[bool] = []
    world.controller._save = lambda adapter, d: (saving.append(meter.snapshot().other_run),  # type: ignore[method-assign]
                                                  type(world.controller)._save(world.controller, adapter, d))[1]
    world.controller.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
    world.run("train")
    assert world.channel.acks[-1].ok and saving == [True] and not meter.snapshot().other_run
