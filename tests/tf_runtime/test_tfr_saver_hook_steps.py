"""Real TensorFlow in process: a MonitoredTrainingSession whose own CheckpointSaverHook
saves every N steps, restored from Gandiva's checkpoint (a migration, a restart): its
checkpoints are written at the uninterrupted run's steps, each holding that run's state."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")

EVERY = 3


def _trained(own: Path, last_step: int, *, checkpoint_at: int | None = None,
             ck: Path | None = None, restore_dir: Path | None = None) -> list[int]:
    """Momentum on one layer, `MonitoredTrainingSession(checkpoint_dir=own)` with a
    `CheckpointSaverHook(own, save_steps=EVERY)` of the program's and
    `StopAtStepHook(last_step)`; a CHECKPOINT into `ck` enqueued at step `checkpoint_at`.
    Returns the steps the hook saved at, in order."""
    saved: list[int] = []

    class Noted(tf.compat.v1.train.CheckpointSaverListener):
        def after_save(self, session: Any, global_step_value: int) -> None:
            saved.append(int(global_step_value))

    with shimmed(restore_dir) as ctl, tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        train = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
            tf.reduce_sum(tf.tanh(tf.matmul(x, w))), global_step=gs)
        saver = tf.compat.v1.train.Saver(max_to_keep=None)
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_step),
                 tf.compat.v1.train.CheckpointSaverHook(str(own), save_steps=EVERY, saver=saver,
                                                        listeners=[Noted()])]
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=str(own), save_checkpoint_secs=None, save_checkpoint_steps=None,
                save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
                scaffold=tf.compat.v1.train.Scaffold(saver=saver), hooks=hooks,
                config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)) as sess:
            while not sess.should_stop():
                sess.run(train)
                if checkpoint_at is not None and not sess.should_stop() and \
                        int(sess.run(gs)) == checkpoint_at:
                    ctl.enqueue(Command("c", Kind.CHECKPOINT, str(ck)))
        if checkpoint_at is not None:
            assert acks(ctl) and acks(ctl)[0].ok and acks(ctl)[0].step == checkpoint_at
    return saved


@pytest.mark.parametrize("own_dir", ["fresh", "shared"])
def test_a_restored_checkpoint_saver_hook_saves_at_the_uninterrupted_runs_steps(
        own_dir: str, tmp_path: Path) -> None:
    """The hook saves when the session starts and then every EVERY steps from the last
    save: in a process restored at step 4 (Gandiva's checkpoint), its count began at the
    restored step, so it saved at 4, 7 and 10 where the uninterrupted run saved at 6, 9 and
    10 (probed s52 live, warm at 74 and 128 with save_steps=10: 165, 175, ... instead of
    160, 170, ...). `fresh`: the restored copy's own directory is empty (a destination that
    does not see the source's disk); `shared`: it is the first process's, which ended at
    step 5 with a save of its own there. Now the hook's count is set to the job's steps
    (every EVERY from the step the job started at): it saves at 6, 9 and 10, each file
    holding the uninterrupted run's variables of that step bit for bit."""
    uninterrupted = _trained(tmp_path / "base", 10)
    assert uninterrupted == [0, 3, 6, 9, 10]
    first = tmp_path / "first"
    _trained(first, 5, checkpoint_at=4, ck=tmp_path / "ck")
    own = first if own_dir == "shared" else tmp_path / "dest"
    restored = _trained(own, 10, restore_dir=tmp_path / "ck")
    assert restored == [s for s in uninterrupted if s > 4]
    for step in restored:
        mine, theirs = str(own / f"model.ckpt-{step}"), str(tmp_path / "base" / f"model.ckpt-{step}")
        names = [n for n, _ in tf.train.list_variables(theirs)]
        assert names == [n for n, _ in tf.train.list_variables(mine)]
        for name in names:
            np.testing.assert_array_equal(tf.train.load_variable(mine, name),
                                          tf.train.load_variable(theirs, name), err_msg=name)
    shutil.rmtree(tmp_path / "base")
