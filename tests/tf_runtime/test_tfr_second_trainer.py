"""Real TensorFlow in process: the second training program of a launch (`python
pretrain.py; python finetune.py`), a process started after its launch's trainer ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_runtime import launch, runtime, shim
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import Controller, Settings
from tf_runtime.testing import Exited, FakeChannel

from .test_tfr_tf_session import acks, session

pytestmark = pytest.mark.tf
ROOT = Path(__file__).resolve().parents[2]
tf = pytest.importorskip("tensorflow")


def test_a_second_training_program_suspends_in_place_but_is_never_checkpointed(
        tmp_path: Path) -> None:
    """s45 documented it as never suspended, migrated or checkpointed; a real CLI journey
    (s46, `two_trainers.sh`: pre-train 40 steps, fine-tune 1,000) found it judged migratable
    once it trained: `gandiva migrate` at its step 163 saved its checkpoint, the destination
    ran the launch's first program, which that checkpoint does not fit ("Key backbone/w/Adam
    not found"), and so did the restart at the source: the job FAILED. A periodic checkpoint
    there would have done the same after a lost server. Now it stays not migratable with
    the reason, refuses checkpoints and migrations, and is suspended and resumed in place."""
    def exit_fn(code: int) -> None:
        raise Exited(code)

    reason = "this process (pid 1) started after its launch's training had ended"
    ctl = Controller(Settings(job_id="t"), channel=FakeChannel(), exit_fn=exit_fn,
                     after_training=reason)
    shim.install(ctl)
    try:
        with tf.Graph().as_default() as g, session(g) as sess:
            gs = tf.compat.v1.train.get_or_create_global_step()
            x = tf.compat.v1.placeholder(tf.float32, [3])
            w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
            train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
                tf.reduce_sum(tf.sin(w * x)), global_step=gs)
            sess.run(tf.compat.v1.global_variables_initializer())
            while (step := int(sess.run(gs))) < 8:
                sess.run(train, {x: np.full(3, 0.1 * step, np.float32)})
                if step == 3:
                    for i, kind in enumerate((Kind.CHECKPOINT, Kind.STOP_FOR_MIGRATION,
                                              Kind.SUSPEND, Kind.RESUME)):
                        ctl.enqueue(Command(f"c{i}", kind, str(tmp_path / f"c{i}")))
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
    finally:
        shim.uninstall()
    assert verdicts and not any(v for v, _ in verdicts), verdicts
    assert all(reason in r for _, r in verdicts), verdicts
    answered = {a.command_id: a for a in acks(ctl)}
    assert not answered["c0"].ok and not answered["c1"].ok, answered
    assert reason in answered["c0"].message and reason in answered["c1"].message, answered
    assert answered["c2"].ok and answered["c3"].ok, answered
    assert not list(tmp_path.iterdir()), "a checkpoint was written"


def test_a_wrapper_that_runs_its_trainer_again_is_told_from_a_second_program() -> None:
    """A process started after its launch's trainer ended is a trainer again once it trains
    when it runs the same command line (`until python train.py; do ...; done`: a restart's
    checkpoint fits it), and a second program otherwise (never checkpointed, above)."""
    mark = f"test-program-{os.getpid()}"
    env = {"GANDIVA_LAUNCH": mark}
    try:
        launch.mark_trained(env)
        assert launch.runs_trainers_program(env)  # this very command line
        code = ("import sys; from tf_runtime import launch; sys.exit(0 if "
                "launch.runs_trainers_program({'GANDIVA_LAUNCH': sys.argv[1]}) else 3)")
        other = subprocess.run([sys.executable, "-c", code, mark], check=False, cwd=ROOT,
                               timeout=120)
        assert other.returncode == 3, "another program taken for the trainer"
    finally:
        launch.forget_launch(mark)
    assert not launch.runs_trainers_program(env), "the launch's marks outlived it"


@pytest.mark.parametrize("same_program", [True, False])
def test_a_process_after_its_launchs_trainer_is_a_trainer_again_only_if_it_reruns_it(
        tmp_path: Path, same_program: bool) -> None:
    """runtime.start of a process whose launch's trainer has exited: not migratable until
    it trains; once it trains, a trainer again (no reason kept) when it runs the trainer's
    command line, and still "after training" (never checkpointed) otherwise."""
    mark = f"test-again-{tmp_path.name}"
    env = {"GANDIVA_RESTORE_CHECKPOINT": str(tmp_path), "GANDIVA_LAUNCH": mark}
    trainer = subprocess.Popen([sys.executable, "-c", "pass"])
    trainer.wait()
    launch.mark_trained(env)  # this command line, then the exited trainer's pid
    if not same_program:
        Path(str(launch._launch_file(mark, "program"))).write_bytes(b"python\0pretrain.py\0")
    Path(str(launch._launch_file(mark, "trained"))).write_text(str(trainer.pid))
    try:
        rt = runtime.start(env)
        assert rt is not None and rt.controller.after_training, "not taken for after training"
        assert rt.controller.settings.restore_dir is None
        rt.controller._on_first_training(0)  # type: ignore[misc]  # its first training run
        assert bool(rt.controller.after_training) is not same_program, rt.controller.after_training
    finally:
        shim.uninstall()
        runtime._RUNTIME.clear()
        launch.forget_launch(mark)
