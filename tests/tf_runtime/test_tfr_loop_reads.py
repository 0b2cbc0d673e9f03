"""Real TensorFlow in process: what the program's own reads in runs of their own tell the
shim about its loop (s45): a loop that reads only a counter kept in a variable (not the
global step), and one that reads the step once a step and then advances it twice from
one line (`for _ in range(2): sess.run(train)`), with no other training run between."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def test_a_loop_on_a_counter_kept_in_a_variable_is_refused_saying_so() -> None:
    """Gradient accumulation on a micro-step variable (`programs/accumulate.py`'s shape in
    one op, probed s44 as `accum_cond.py --read micro`): the loop reads only its micro-step
    (`m = sess.run(micro)`), never the global step. It used to be refused with "its loop
    counts in Python", untrue of a counter the checkpoint holds; now the refusal names that
    counter and says what to read."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        micro = tf.compat.v1.get_variable("micro_step", [], tf.int64, tf.zeros_initializer(),
                                          trainable=False)
        acc = tf.compat.v1.get_variable("acc", initializer=tf.zeros([3]), trainable=False)
        loss = tf.reduce_sum(tf.sin(w * x))
        with tf.control_dependencies([acc.assign_add(tf.gradients(loss, [w])[0])]):
            count = micro.assign_add(1)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)

        def apply() -> object:
            with tf.control_dependencies([opt.apply_gradients([(acc / 2, w)], global_step=gs)]):
                return tf.group(acc.assign(tf.zeros_like(acc)))

        train = tf.cond(tf.equal(count % 2, 0), apply, tf.no_op)
        sess.run(tf.compat.v1.global_variables_initializer())
        while (m := int(sess.run(micro))) < 16:
            sess.run(train, {x: np.full(3, 0.1 * m, np.float32)})
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
    assert verdicts and verdicts[-1][0] is False, verdicts
    reason = verdicts[-1][1]
    assert "micro_step" in reason and "counts in Python" not in reason, reason
    assert "read the global step in the loop" in reason, reason


def test_a_step_read_then_advanced_twice_from_one_line_is_cut_after_both(tmp_path: Path) -> None:
    """`step = sess.run(gs); for _ in range(2): sess.run(train, batch(step))`: two
    advancing runs a step from one line, no other training run between the steps. A
    checkpoint asked for between the two used to be taken there (an odd step), and a
    restored copy, reading a step the program never read, trained on other batches. Now the
    program's read of the step in a run of its own marks where its steps begin, as a
    discriminator run does, and commands wait for as many advancing runs as the last step
    made, from the second read on (the first step is cut as before: a read once before
    `for i in range(n): sess.run(train)` looks the same until then)."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(
            tf.reduce_sum(tf.sin(w * x)), global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        seen = {}
        while (step := int(sess.run(gs))) < 12:
            seen[step] = sess.run(w)
            for i in range(2):
                if step in (2, 6) and i == 1:  # between the two runs
                    ctl.enqueue(Command(f"c{step}", Kind.CHECKPOINT, str(tmp_path / f"ck{step}")))
                sess.run(train, {x: np.full(3, 0.1 * (step + 1), np.float32)})
        assert [(a.ok, a.step) for a in acks(ctl)] == [(True, 4), (True, 8)]
    for asked, cut in ((2, 4), (6, 8)):
        np.testing.assert_array_equal(
            tf.train.load_variable(str(tmp_path / f"ck{asked}" / "model"), "w"), seen[cut])


def test_a_warm_up_loop_counted_in_python_before_a_loop_on_the_step_says_so() -> None:
    """The training op run from two places (probed s46, `programs/warm_up_loop.py`): a
    warm-up `for i in range(4)` that never reads the step, then `while sess.run(gs) < n`.
    Rightly not migratable (a restarted copy runs the warm-up again on top of the restored
    weights), but `gandiva migrate` at step 129 of 300 said "the program never reads the
    global step", which it had done in every step since its warm-up. Now the reason says
    that its first steps counted in Python."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        loss = tf.reduce_sum(tf.sin(tf.compat.v1.get_variable("w", initializer=tf.ones([3])) * x))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(4):
            sess.run(train, {x: np.full(3, 0.1 * i, np.float32)})
        while (step := int(sess.run(gs))) < 8:
            sess.run(train, {x: np.full(3, 0.1 * step, np.float32)})
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
    assert [v for v, _ in verdicts] == [False, False], verdicts
    assert "never reads the global step" in verdicts[0][1], verdicts
    reason = verdicts[-1][1]
    assert "never reads" not in reason and "counted in Python" in reason, reason
    assert "at least 2" in reason or "at least 3" in reason or "at least 4" in reason, reason
