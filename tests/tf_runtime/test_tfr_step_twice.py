"""Real TensorFlow in process: a step that advances the global step in two of its runs
(a DCGAN updating its generator twice a step, `programs/dcgan.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def _gan() -> tuple[Any, ...]:
    """A discriminator updated without the global step and a generator with it, both
    Adam(0.1, beta1=0.5): (gs, x, d, gen, d_optim, g_optim)."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [3])
    d = tf.compat.v1.get_variable("d", initializer=tf.ones([3]))
    gen = tf.compat.v1.get_variable("g", initializer=tf.ones([3]))
    d_optim = tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.5).minimize(
        tf.reduce_sum(tf.sin(d * x + tf.stop_gradient(gen))), var_list=[d])
    g_optim = tf.compat.v1.train.AdamOptimizer(0.1, beta1=0.5).minimize(
        tf.reduce_sum(tf.cos(gen * x + tf.stop_gradient(d))), var_list=[gen], global_step=gs)
    return gs, x, d, gen, d_optim, g_optim


def test_a_step_that_advances_the_global_step_twice_is_cut_after_both(tmp_path: Path) -> None:
    """`sess.run(d_optim); sess.run(g_optim); sess.run(g_optim)`, g_optim made with
    `global_step=gs` (carpedm20's DCGAN runs the generator twice a step): the step advances
    twice a step. A checkpoint asked for between the two generator runs used to be taken
    there, and a restored copy, reading the step advanced once, began a new step (its
    discriminator run, the noise of that step): other weights (probed end to end with
    programs/dcgan.py, naive migration). Now it waits for the second, the later line of the
    loop; the checkpoint holds the state the program has at that step's end."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, d, gen, d_optim, g_optim = _gan()
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


@pytest.mark.parametrize(("form", "asked_at"), [("loop", 0), ("loop", 4), ("lines", 0)])
def test_a_step_that_advances_the_global_step_twice_from_one_line_is_cut_after_both(
        tmp_path: Path, form: str, asked_at: int) -> None:
    """The same DCGAN step with its two generator runs made from one line (`for _ in
    range(2): sess.run(g_optim)`, `programs/dcgan.py --g-form loop`). A checkpoint asked for
    between them used to be taken there (at an odd step): the restored copy read the step
    advanced once and began a new step (other weights). Now a step's advancing runs from one
    line are counted between the runs that train without advancing it (the discriminator's),
    and commands wait for as many as the last step made (for the first step, for the next
    such run, within ADVANCES_PER_STEP_MAX), so one asked for in the first step is taken at
    its end too; so is one asked for in the first step of the two-line form (it used to be
    cut there, its loop not yet seen)."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, d, gen, d_optim, g_optim = _gan()
        sess.run(tf.compat.v1.global_variables_initializer())
        step, seen = int(sess.run(gs)), {}
        while step < 12:
            feed = {x: np.full(3, 0.1 * (step + 1), np.float32)}
            sess.run(d_optim, feed)
            if form == "loop":
                for i in range(2):
                    if step == asked_at and i == 1:  # between the generator's two runs
                        ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
                    sess.run(g_optim, feed)
            else:
                sess.run(g_optim, feed)
                if step == asked_at:
                    ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
                sess.run(g_optim, feed)
            step = int(sess.run(gs))
            seen[step] = sess.run([d, gen])
        cut = asked_at + 2
        assert [(a.ok, a.step) for a in acks(ctl)] == [(True, cut)]
    for name, value in zip(("d", "g"), seen[cut], strict=True):
        np.testing.assert_array_equal(tf.train.load_variable(str(tmp_path / "ck" / "model"), name), value)
