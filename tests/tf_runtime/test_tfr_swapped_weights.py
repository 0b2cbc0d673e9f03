"""Real TensorFlow in process: a program that evaluates its moving average of the weights
by swapping the shadows into the weights between two steps (`backup.assign(w)`,
`w.assign(ema.average(w))`, evaluation runs, `w.assign(backup)`), and one that overwrites
its weights once after a step and keeps them (a revert to the best weights)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def _ema_model(held_out: bool) -> SimpleNamespace:
    """The programs' graph: a 3x2 layer trained with Momentum, the moving averages of its
    weights applied with each step (`train`), and per variable a swap of its average in (its
    value backed up into a non-trainable variable first: `to_average`) and back
    (`to_weights`). `held_out`: the evaluation reads a held-out batch from an iterator of its
    own, else it is the loss. `saver` saves every variable, `ema_saver` restores the
    averages into the weights."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
    b = tf.compat.v1.get_variable("b", initializer=tf.zeros([2]))
    loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w) + b))
    evaluation = loss
    if held_out:
        batch = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensors(x).repeat()).get_next()
        evaluation = tf.reduce_sum(tf.tanh(tf.matmul(batch, w) + b))
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=gs)
    ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
    with tf.control_dependencies([opt]):
        train = ema.apply([w, b])
    to_average, to_weights = [], []
    for v in (w, b):
        backup = tf.compat.v1.get_variable(f"backup_{v.op.name}", initializer=tf.zeros_like(v),
                                           trainable=False)
        with tf.control_dependencies([backup.assign(v)]):
            to_average.append(v.assign(ema.average(v)))
        to_weights.append(v.assign(backup))
    return SimpleNamespace(gs=gs, w=w, ema=ema, evaluation=evaluation, train=train,
                           to_average=to_average, to_weights=to_weights,
                           saver=tf.compat.v1.train.Saver(),
                           ema_saver=tf.compat.v1.train.Saver(ema.variables_to_restore()))


@pytest.mark.parametrize("swap", ["together", "apart", "kept", "iterator", "restore"])
def test_weights_swapped_for_an_evaluation_between_steps_are_never_checkpointed(
        swap: str, tmp_path: Path) -> None:
    """programs/ema_swap.py: every 2 steps, after the step-advancing run, the program swaps
    its moving averages into the weights, evaluates, and swaps its weights back (in one run
    for all the weights, or in a run per variable: `apart`). The swap runs were taken for
    updates that end the step (as an EMA update after the training run is), so a checkpoint
    asked for then was taken right after the swap, before the first evaluation run: it held
    the averages as the weights, and a copy restored from it (a migration, a restart)
    trained on from them (probed: every variable differed). Now the commands wait through
    the evaluation for the swap back, and the checkpoint holds the weights as the step left
    them. An overwrite after the step that the program keeps (`kept`: back to its best
    weights) is part of the step, as before. `iterator`: the evaluation reads a held-out
    batch from an iterator of its own (input no checkpoint holds), which, unlike a plain
    read, would end the wait by itself: only this case needs the wait for the swap back
    (Controller._swapped); the others wait through reads anyway. `restore`: the same swap
    through the program's own Savers around that evaluation (the weights saved, the averages
    restored into them by `Saver(ema.variables_to_restore())`, the weights restored back):
    a restore was taken for a one-time load and never noted as a swap, so the evaluation's
    read of its iterator ended the wait and the checkpoint held the averages as the weights."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        m = _ema_model(held_out=swap in ("iterator", "restore"))
        gs, w, ema, evaluation, train, saver, ema_saver = (
            m.gs, m.w, m.ema, m.evaluation, m.train, m.saver, m.ema_saver)
        to_average, to_weights = m.to_average, m.to_weights
        if swap != "apart":
            to_average, to_weights = [tf.group(*to_average)], [tf.group(*to_weights)]
        sess.run(tf.compat.v1.global_variables_initializer())
        step = 0
        while step < 8:
            sess.run(train)
            step = int(sess.run(gs))
            if step == 6:
                trained, average = sess.run([w.value(), ema.average(w).value()])
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            if step % 2 == 0 and swap == "restore":
                own = saver.save(sess, str(tmp_path / "own" / "model"))
                ema_saver.restore(sess, own)
                for _ in range(2):
                    sess.run(evaluation)
                saver.restore(sess, own)
            elif step % 2 == 0:
                for op in to_average:
                    sess.run(op)
                for _ in range(2):
                    sess.run(evaluation)
                for op in to_weights if swap != "kept" else ():
                    sess.run(op)
        assert acks(ctl)[0].ok and acks(ctl)[0].step == 6
    saved = tf.train.load_variable(str(tmp_path / "ck" / "model"), "w")
    np.testing.assert_array_equal(saved, average if swap == "kept" else trained)
    assert not np.array_equal(trained, average)


def _final_swap_program(swap: str, tmp_path: Path, *, steps: int, evaluations: int,
                        final_swap: bool = True,
                        queue: tuple[Kind, ...] = (), restore_dir: Path | None = None,
                        ) -> tuple[Any, dict[str, Any], dict[str, Any], int]:
    """Trains `steps` steps (Momentum, the weights' moving averages applied with each), then
    swaps the averages into the weights for a final evaluation and never swaps them back:
    `assign` (the weights backed up into non-trainable variables, the averages assigned in,
    in one run) or `restore` (the averages restored into them by the program's own
    `Saver(ema.variables_to_restore())`). The evaluation reads a held-out batch from an
    iterator of its own, `evaluations` runs (`final_swap=False`: no swap, the session closed
    after the last step). `queue`: commands enqueued at the last step.
    Returns (the controller, every variable after the last step by name, every variable at
    the end, the acks received before the program closed its session)."""
    with shimmed(restore_dir) as ctl, tf.Graph().as_default() as g, session(g) as sess:
        m = _ema_model(held_out=True)
        gs, evaluation, train, saver, ema_saver = m.gs, m.evaluation, m.train, m.saver, m.ema_saver
        swap_in_op, swap_back_op = tf.group(*m.to_average), tf.group(*m.to_weights)
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(gs))
        while step < steps:
            sess.run(train)
            step = int(sess.run(gs))
            if step in (2, 4):  # an evaluation in the loop, swapped back
                sess.run(swap_in_op)
                sess.run(evaluation)
                sess.run(swap_back_op)
            if step == steps:
                for kind in queue:
                    ctl.enqueue(Command(kind.name.lower(), kind,
                                        str(tmp_path / "ck") if kind is Kind.CHECKPOINT else ""))
        trained = {v.op.name: sess.run(v.value()) for v in tf.compat.v1.global_variables()}
        if final_swap and swap == "restore":
            (tmp_path / "own").mkdir(parents=True, exist_ok=True)
            ema_saver.restore(sess, saver.save(sess, str(tmp_path / "own" / "model")))
        elif final_swap:
            sess.run(swap_in_op)
        for _ in range(evaluations):
            sess.run(evaluation)
            if len(acks(ctl)) == len(queue):
                break
            time.sleep(0.01)
        before_close = len(acks(ctl))
        final = {v.op.name: sess.run(v.value()) for v in tf.compat.v1.global_variables()}
    return ctl, trained, final, before_close


@pytest.mark.parametrize("swap", ["assign", "restore"])
def test_weights_swapped_in_after_the_last_step_hold_commands_until_the_close(
        swap: str, tmp_path: Path) -> None:
    """A program that swaps its moving averages into the weights after its last step for a
    final evaluation and never swaps them back. Commands after a step wait for the swap
    back (a checkpoint taken while the averages are in the weights would hold them as the
    weights, and a cut there cannot tell an evaluation's swap from a load the program keeps:
    a target network's copy), the next training run, or the close. afd760d0 applied them
    after SWAP_BACK_WAIT_S from a snapshot taken before the swap, which cut a DQN-style
    target copy before the copy (test_tfr_kept_load_cut): that is gone, and these wait
    again: none is answered during the evaluation, all three at the close, the checkpoint
    holding the state the program closed its session with (every variable bit-identical to
    it). A copy restored from a checkpoint taken at the last step ends its loop at once and
    makes the swap and the evaluation itself: the swap, made before any training run, was
    taken for the program overwriting the restored variables and restored over before the
    evaluation's first run, so that copy evaluated, and ended with, the trained weights
    (found s53). Values copied from the restored state (or restored by the program's own
    Saver from a file it saved since: `restore`) are restored over only at a first training
    run: it ends with every variable bit-identical to the uninterrupted run's."""
    ctl, _, final, before_close = _final_swap_program(
        swap, tmp_path, steps=6, evaluations=30,
        queue=(Kind.SUSPEND, Kind.CHECKPOINT, Kind.RESUME))
    assert before_close == 0, [a.message for a in acks(ctl)]
    assert len(acks(ctl)) == 3 and all(a.ok for a in acks(ctl)), acks(ctl)
    assert acks(ctl)[1].step == 6
    prefix = str(tmp_path / "ck" / "model")
    assert {n for n, _ in tf.train.list_variables(prefix)} == set(final)
    for name, value in final.items():
        np.testing.assert_array_equal(tf.train.load_variable(prefix, name), value, err_msg=name)
    # A checkpoint at the last step, the state the step left (a program that closes its
    # session there, the final swap not made), restored into the program that makes it.
    ctl, trained, _, _ = _final_swap_program(swap, tmp_path / "l", steps=6, evaluations=0,
                                             queue=(Kind.CHECKPOINT,), final_swap=False)
    assert acks(ctl)[0].ok and acks(ctl)[0].step == 6, acks(ctl)
    assert not np.array_equal(trained["w"], trained["w/ExponentialMovingAverage"])
    *_, uninterrupted, _ = _final_swap_program(swap, tmp_path / "a", steps=6, evaluations=3)
    for name, value in trained.items():
        np.testing.assert_array_equal(tf.train.load_variable(
            str(tmp_path / "l" / "ck" / "model"), name), value, err_msg=name)
    *_, restored, _ = _final_swap_program(swap, tmp_path / "r", steps=6, evaluations=3,
                                          restore_dir=tmp_path / "l" / "ck")
    assert restored.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
