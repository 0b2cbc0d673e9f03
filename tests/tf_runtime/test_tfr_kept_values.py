"""Real TensorFlow in process: a value a run returned that the program keeps in Python
from one run to the next (the best validation loss of early stopping), which no
checkpoint holds (tf_runtime.kept_values)."""

from __future__ import annotations

import numpy as np
import pytest

from .test_tfr_tf_session import session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("keeps", ["eval", "plateau", ""])
def test_early_stopping_that_keeps_its_best_loss_in_python_is_not_migratable(keeps: str) -> None:
    """`vl = sess.run(loss, val)` every 3 steps, `if vl < best: best, bad = vl, 0 else: bad
    += 1`, stop at `bad >= patience` (s44's early_stop.py); or the training run's loss kept
    so (a rate cut on a plateau, `programs/curriculum.py --by plateau`). It used to be
    judged migratable, and a copy restarted while the count was above 0 started best and
    the count over and stopped later, with other weights (probed: cut at step 237 of 245).
    Now the value kept under a second name makes it not migratable, naming both; a loop
    that only logs the value stays migratable."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        loss = tf.reduce_sum(tf.square(w * x - 1.0))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        best, bad = float("inf"), 0
        logged = shown = None  # two names of one object, but no value a run returned
        while (step := int(sess.run(gs))) < 12 and bad < 3:
            _, vl = sess.run([train, loss], {x: np.full(3, 0.1 * step + 0.5, np.float32)})
            if step % 3 == 2:
                vl = sess.run(loss, {x: np.full(3, 0.7, np.float32)})
            if keeps and (step % 3 == 2 or keeps == "plateau"):
                best, bad = (vl, 0) if vl < best else (best, bad + 1)
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
        assert logged is shown
    assert verdicts, "never judged"
    if keeps == "plateau":  # kept from the first step: never judged migratable
        assert [v for v, _ in verdicts] == [False], verdicts
    if keeps:
        assert verdicts[-1][0] is False and "'vl'" in verdicts[-1][1] and "'best'" in verdicts[-1][1], verdicts
    else:
        assert [v for v, _ in verdicts] == [True], verdicts
