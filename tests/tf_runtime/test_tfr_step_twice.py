"""Real TensorFlow in process: a step that advances the global step in two of its runs
(a DCGAN updating its generator twice a step, `programs/dcgan.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def test_a_step_that_advances_the_global_step_twice_is_cut_after_both(tmp_path: Path) -> None:
    """`sess.run(d_optim); sess.run(g_optim); sess.run(g_optim)`, g_optim made with
    `global_step=gs` (carpedm20's DCGAN runs the generator twice a step): the step advances
    twice a step. A checkpoint asked for between the two generator runs used to be taken
    there, and a restored copy, reading the step advanced once, began a new step (its
    discriminator run, the noise of that step): other weights (probed end to end with
    programs/dcgan.py, naive migration). Now it waits for the second, the later line of the
    loop; the checkpoint holds the state the program has at that step's end."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        d = tf.compat.v1.get_variable("d", initializer=tf.ones([3]))
        gen = tf.compat.v1.get_variable("g", initializer=tf.ones([3]))
        adam = tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.5)
        d_optim = adam.minimize(tf.reduce_sum(tf.sin(d * x + tf.stop_gradient(gen))), var_list=[d])
        g_optim = tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.5).minimize(
            tf.reduce_sum(tf.cos(gen * x + tf.stop_gradient(d))), var_list=[gen], global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        step, seen = int(sess.run(gs)), {}
        while step < 10:
            feed = {x: np.full(3, 0.1 * (step + 1), np.float32)}
            sess.run(d_optim, feed)
            sess.run(g_optim, feed)
            if step == 4:  # asked for between the generator's two runs
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            sess.run(g_optim, feed)
            step = int(sess.run(gs))
            seen[step] = sess.run([d, gen])
        assert [(a.ok, a.step) for a in acks(ctl)] == [(True, 6)]
    for name, value in zip(("d", "g"), seen[6], strict=True):
        np.testing.assert_array_equal(tf.train.load_variable(str(tmp_path / "ck" / "model"), name), value)
