"""Real TensorFlow in process: a program whose first step makes more training runs than
ADVANCE_WITHIN_RUNS before the one that advances the global step (a WGAN's critic trained
many times, each update followed by a run that clips its weights, then the generator)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind
from tf_runtime.controller import ADVANCE_WITHIN_RUNS, EXIT_MIGRATED
from tf_runtime.testing import Exited

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def test_a_step_advanced_only_after_many_critic_runs_is_judged_again_and_migrates(
        tmp_path: Path) -> None:
    """WGAN (`programs/wgan.py`): `for i in range(d_iters): sess.run(d_optim);
    sess.run(clip_d)`, then `sess.run(g_optim)` with global_step=, d_iters large for the
    first generator steps. The job used to be judged not migratable for good after 16
    training runs without an advance ("no training run advances the global step"; the CLI
    said it "cannot resume from a checkpoint"), though its loop resumes from the step read.
    Now the first advance judges it again: migrated at a step's end, the saved variables
    those of that step."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        crit = tf.compat.v1.get_variable("critic", initializer=tf.fill([3], 0.5))
        gen = tf.compat.v1.get_variable("gen", initializer=tf.ones([3]))
        d_optim = tf.compat.v1.train.RMSPropOptimizer(0.05).minimize(
            tf.reduce_sum(crit * (tf.stop_gradient(gen) - x)), var_list=[crit])
        clip_d = crit.assign(tf.clip_by_value(crit, -0.3, 0.3))
        g_optim = tf.compat.v1.train.RMSPropOptimizer(0.05).minimize(
            -tf.reduce_sum(tf.stop_gradient(crit) * gen), var_list=[gen], global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        step, seen, exited = int(sess.run(gs)), {}, None
        try:
            while step < 6:
                d_iters = ADVANCE_WITHIN_RUNS if step < 2 else 3
                for i in range(d_iters):
                    sess.run(d_optim, {x: np.full(3, 0.1 * (step + i), np.float32)})
                    sess.run(clip_d)
                sess.run(g_optim)
                step = int(sess.run(gs))
                seen[step] = sess.run([crit, gen])
                if step == 2:
                    ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
        except Exited as e:
            exited = e.code
        verdicts = [v for v, _ in ctl.channel.migratability]  # type: ignore[union-attr]
        assert verdicts[0] is False and verdicts[-1] is True, ctl.channel.migratability  # type: ignore[union-attr]
        ack = acks(ctl)[0]
        assert exited == EXIT_MIGRATED and ctl.migratable is True and ack.ok, ack
    for name, value in zip(("critic", "gen"), seen[ack.step], strict=True):
        np.testing.assert_array_equal(tf.train.load_variable(str(tmp_path / "m" / "model"), name), value)
