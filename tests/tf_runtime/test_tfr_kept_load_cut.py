"""Real TensorFlow in process: a DQN-style program copies its online network into its target
network after a step (`target.assign(online)`, a load the program keeps: trainable variables
as layers make them, outside the optimizer's var_list), then acts greedily with read-only runs
(an evaluation phase), a checkpoint asked meanwhile.

afd760d0 took such a load for weights swapped out for an evaluation: after SWAP_BACK_WAIT_S
(10 s) of read-only runs the command was applied from a snapshot taken before the copy, so
the checkpoint held the target network as it was before it (zeros here) and a copy restored
from it trained on against the stale target: every trained variable differed from the
uninterrupted run's (45f6325c, a strict xfail). That timeout is gone: the command waits for
the next training run, as before afd760d0, and the restored copy is bit-identical."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")

STEPS = 12


def _dqn(tmp_path: Path, *, copy_every: int, ask: bool, act_s: float = 1.0,
         restore_dir: Path | None = None) -> dict[str, Any]:
    """Momentum on an online layer whose target is computed from a target layer; the target
    copied from the online one every `copy_every` steps, each copy followed by read-only runs
    (greedy acting): 3, or after the copy at step 10, when asked (`ask`), a checkpoint asked
    right after it and runs until it is answered, at most `act_s` (a shim that waits for the
    next training run answers it there: checked, at step 10). Returns every variable at the
    end, by name."""
    with shimmed(restore_dir) as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        with tf.compat.v1.variable_scope("online"):
            online = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]) * 0.3)
        with tf.compat.v1.variable_scope("target"):
            target = tf.compat.v1.get_variable("w", initializer=tf.zeros([3, 2]))
        q = tf.matmul(x, online)
        y = 1.0 + 0.9 * tf.stop_gradient(tf.reduce_max(tf.matmul(x, target), axis=1))
        loss = tf.reduce_sum(tf.square(tf.reduce_max(q, axis=1) - y))
        train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            loss, global_step=gs, var_list=[online])
        copy = target.assign(online)
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(gs))
        while step < STEPS:
            sess.run(train)
            step = int(sess.run(gs))
            if step % copy_every == 0:
                sess.run(copy)
                asked = ask and step == 10
                if asked:
                    ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
                deadline = time.monotonic() + act_s
                for runs in range(10**6):
                    sess.run(q)  # greedy acting: a read-only run
                    if (acks(ctl) if asked else runs >= 2) or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                if asked:
                    assert not acks(ctl), acks(ctl)  # not cut during the acting
        if ask:
            assert acks(ctl) and acks(ctl)[0].ok and acks(ctl)[0].step == 10, acks(ctl)
        return {v.op.name: sess.run(v.value()) for v in tf.compat.v1.global_variables()}


def test_a_target_network_copy_then_a_long_evaluation_is_restored_bit_identical(
        tmp_path: Path) -> None:
    """One copy (step 10), a checkpoint asked right after it, then 1 s of acting: the
    checkpoint is answered at the step-11 training run (with the step-10 state, the copy in
    it), not during the acting, and the restored copy ends bit-identical (under afd760d0's
    timeout, cut from before the copy: every trained variable differed)."""
    uninterrupted = _dqn(tmp_path, copy_every=10, ask=True)  # the cut changes nothing here
    restored = _dqn(tmp_path / "r", copy_every=10, ask=False, restore_dir=tmp_path / "ck")
    _same(restored, uninterrupted)


def _same(restored: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    assert restored.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_a_target_network_copied_every_few_steps_is_cut_after_the_copy(tmp_path: Path) -> None:
    """The same program copying its target every 5 steps, the checkpoint asked after the
    second copy (step 10). Under afd760d0's timeout each copy paid a full save of the training
    state (0.46 s for 80 MB) and, until cffa4842, the checkpoint was cut from the one before
    the second copy (every trained variable of the restored copy differed). Now no snapshot
    is taken, the command waits for the next training run, and the restored copy ends
    bit-identical."""
    uninterrupted = _dqn(tmp_path, copy_every=5, ask=True)
    restored = _dqn(tmp_path / "r", copy_every=5, ask=False, restore_dir=tmp_path / "ck")
    _same(restored, uninterrupted)
