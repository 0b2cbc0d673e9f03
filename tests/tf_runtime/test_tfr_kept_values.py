"""Real TensorFlow in process: a value a run returned that the program keeps in Python
from one run to the next (the best validation loss of early stopping), which no
checkpoint holds (tf_runtime.kept_values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .test_tfr_tf_session import session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def _model(sess: Any) -> tuple[Any, Any, Any, Any]:
    """In the current graph: a global step, an input, a loss and its training op,
    initialised in `sess`: (gs, x, loss, train)."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [3])
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
    loss = tf.reduce_sum(tf.square(w * x - 1.0))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=gs)
    sess.run(tf.compat.v1.global_variables_initializer())
    return gs, x, loss, train


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
        gs, x, loss, train = _model(sess)
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


class _Trainer:
    """A trainer class of the program's own, keeping the best loss in an attribute."""

    def __init__(self) -> None:
        self.best = float("inf")
        self.history: list[Any] = []


@pytest.mark.parametrize("form", ["float", "item", "round", "attribute", "history", "dict",
                                  "attribute_history", "training_losses"])
def test_a_best_loss_kept_converted_or_in_an_attribute_or_a_list_is_not_migratable(form: str) -> None:
    """The s45 limit: the best validation loss kept after a conversion (`best =
    float(vl)`, `vl.item()`, `round(vl, 4)`), in an attribute (`trainer.best = vl`) or a
    list or dict (`history.append(vl)`, `stats["best"] = vl`) was not seen, so early
    stopping written so was judged migratable (a copy restarted mid-patience stops at
    another step, with other weights). Now each is refused naming where the value is
    kept; a training run's losses appended to a list (a running mean for the log) are
    left alone, as is a constant 0.5 of the program's."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, loss, train = _model(sess)
        best, trainer, stats, keep_prob = float("inf"), _Trainer(), {"best": float("inf")}, 0.5
        losses: list[Any] = []
        history: list[Any] = []
        while (step := int(sess.run(gs))) < 12:
            _, lv = sess.run([train, loss], {x: np.full(3, 0.1 * step + 0.5, np.float32)})
            if form == "training_losses":
                losses.append(lv)
                print("mean loss", np.mean(losses[-5:]), keep_prob)
            if step % 3 != 2:
                continue
            vl = sess.run(loss, {x: np.full(3, 0.7, np.float32)})
            if form == "float" and float(vl) < best:
                best = float(vl)
            elif form == "item" and vl.item() < best:
                best = vl.item()
            elif form == "round":
                best = min(best, round(float(vl), 4))
            elif form == "attribute" and vl < trainer.best:
                trainer.best = vl
            elif form == "history":
                history.append(vl)
                if len(history) > 3 and min(history[-3:]) > min(history):
                    break
            elif form == "dict" and vl < stats["best"]:
                stats["best"] = vl
            elif form == "attribute_history":
                trainer.history.append(vl)
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
    assert verdicts, "never judged"
    if form == "training_losses":
        assert [v for v, _ in verdicts] == [True], verdicts
        return
    where = {"float": "'best'", "item": "'best'", "round": "'best'", "attribute": "'trainer.best'",
             "history": "history[-1]", "dict": "stats['best']",
             "attribute_history": "trainer.history[-1]"}[form]
    assert verdicts[-1][0] is False and where in verdicts[-1][1], verdicts


def test_a_metric_near_a_constant_of_the_program_is_not_taken_for_a_kept_value() -> None:
    """A run's accuracy of 0.9003 (or a loss passing 0.9, 0.1 or 0.001 on its way down)
    rounded to 3 places is the program's `momentum = 0.9`: that constant was taken for a
    rounded copy of the value (`best = round(acc, 3)`), and a plain training loop that only
    logs its metric was refused as not migratable ("'acc' and 'momentum'"). A rounded copy
    counts only with 3 significant digits or more; `round(acc, 4)` kept still refuses."""
    for keeps in ("", "round"):
        with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
            gs, x, _loss, train = _model(sess)
            accuracy = tf.reduce_mean(x) * 3.0  # a scalar metric of the training run: 0.9003
            momentum, weight_decay, lr, best = 0.9, 0.001, 0.1, float("inf")
            while int(sess.run(gs)) < 6:
                _, acc = sess.run([train, accuracy], {x: np.full(3, 0.3001, np.float32)})
                print("accuracy", acc, momentum, weight_decay, lr)
                if keeps:
                    best = min(best, round(float(acc), 4))
            verdicts = ctl.channel.migratability  # type: ignore[union-attr]
        assert verdicts, "never judged"
        if keeps:
            assert verdicts[-1][0] is False and "'best'" in verdicts[-1][1], verdicts
        else:
            assert [v for v, _ in verdicts] == [True], verdicts


def test_the_look_does_not_keep_the_classes_a_program_makes_on_every_step_alive() -> None:
    """Which classes are the program's is remembered per class: a program that makes a
    class per step (`Batch = namedtuple(...)` in its batch function) had every one kept
    alive by that memory (1,000 after 1,000 looks); now it forgets a class once it goes."""
    import collections
    import gc
    import sys

    from tf_runtime import kept_values

    value = np.float32(0.3456)
    for _ in range(1000):
        batch = collections.namedtuple("Batch", "x y")(1, 2)
        assert kept_values.second_name(sys._getframe(), {id(value): value}) is None, batch
    del batch
    gc.collect()
    assert sum(t.__name__ == "Batch" for t in list(kept_values._PROGRAM_TYPES)) <= 1


class _Result:
    """An evaluation's values, made to log them."""

    def __init__(self, loss: Any, accuracy: Any) -> None:
        self.loss, self.accuracy = loss, accuracy


@pytest.mark.parametrize("form", ["results", "row", "object"])
def test_an_evaluations_values_put_in_a_new_dict_or_list_to_log_stay_migratable(form: str) -> None:
    """`results = {"val_loss": vl, "val_acc": va}; print(results)` or `row = [step, vl, va];
    print(*row)` after each evaluation keep nothing from one run to the next, but the
    dict's value or the list's last item was taken for a second name of the value ("two
    names ('vl' and "results['val_loss']")"): a job that logs its evaluations was refused.
    Now only a list or dict the program held while the run was in flight counts (a history
    or a dict of bests: the converted_or_in_an_attribute forms are still refused)."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, loss, train = _model(sess)
        accuracy = tf.reduce_mean(x) * 3.0
        while (step := int(sess.run(gs))) < 12:
            sess.run(train, {x: np.full(3, 0.1 * step + 0.5, np.float32)})
            if step % 3 != 2:
                continue
            vl, va = sess.run([loss, accuracy], {x: np.full(3, 0.7, np.float32)})
            if form == "results":
                results = {"val_loss": vl, "val_acc": va}
                print(results)
            elif form == "row":
                row = [step, vl, va]
                print(*row)
            else:
                result = _Result(vl, va)
                print(vars(result))
        verdicts = ctl.channel.migratability  # type: ignore[union-attr]
    assert verdicts and all(v for v, _ in verdicts), verdicts
