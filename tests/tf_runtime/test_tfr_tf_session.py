"""Real TensorFlow (CPU) in-process: run classification, checkpoints with replicas,
throw-away sessions, MonitoredTrainingSession with hooks, concurrent background runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime import shim
from tf_runtime.checkpoint import CheckpointError, TowersChanged, validate
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import EXIT_MIGRATED, Controller, Settings
from tf_runtime.testing import Exited, FakeChannel

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


@pytest.fixture
def controller() -> Iterator[Controller]:
    def exit_fn(code: int) -> None:
        raise Exited(code)

    ctl = Controller(Settings(job_id="t"), channel=FakeChannel(), exit_fn=exit_fn)
    shim.install(ctl)
    yield ctl
    shim.uninstall()


@contextlib.contextmanager
def shimmed(restore_dir: Path | None = None) -> Iterator[Controller]:
    """A controller installed for the block (a restarted process's, with `restore_dir`)."""
    def exit_fn(code: int) -> None:
        raise Exited(code)

    ctl = Controller(Settings(job_id="t", restore_dir=str(restore_dir) if restore_dir else None),
                     channel=FakeChannel(), exit_fn=exit_fn)
    shim.install(ctl)
    try:
        yield ctl
    finally:
        shim.uninstall()


def mlp_graph(replicas: int = 1, seed: int = 0) -> tuple[Any, Any, Any, Any, argparse.Namespace]:
    from tf_runtime.examples.common import build_replicated
    from tf_runtime.examples.mlp import model

    g = tf.Graph()
    args = argparse.Namespace(seed=seed, batch=4, replicas=replicas, hidden=64)
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)
        gs, train, loss = build_replicated(lambda s, i: model(args, s, i), args,
                                           tf.compat.v1.train.MomentumOptimizer(0.05, 0.9))
    return g, gs, train, loss, args


def trainable_graph(replicas: int) -> tuple[Any, Any, Any, Any, list[Any]]:
    """mlp_graph plus its initializer and global variables: (g, gs, train, init, variables)."""
    g, gs, train, _, _ = mlp_graph(replicas=replicas)
    with g.as_default():
        return (g, gs, train, tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.global_variables())


def session(g: Any, replicas: int = 1) -> Any:
    return tf.compat.v1.Session(graph=g, config=tf.compat.v1.ConfigProto(
        device_count={"CPU": replicas}, intra_op_parallelism_threads=1))


def checkpoint_at_the_next_step(ctl: Controller, sess: Any, train: Any, path: Path) -> None:
    """A checkpoint into `path` at the end of the next training run (taken right before the
    run after it, the cut between the two steps), then that run."""
    sess.run(train)
    ctl.enqueue(Command("c", Kind.CHECKPOINT, str(path)))
    sess.run(train)


def fed_graph() -> tuple[Any, Any, Any, Any]:
    """In the current graph: a global step, an input `x` ([2, 3], ones unless fed), one
    layer trained on it, and a pool of ten mini-batches to feed: (gs, x, train, pool)."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder_with_default(tf.ones([2, 3]), [2, 3])
    w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        tf.reduce_sum(tf.tanh(tf.matmul(x, w))), global_step=gs)
    return gs, x, train, np.linspace(-1, 1, 60, dtype=np.float32).reshape(10, 2, 3)


def acks(ctl: Controller) -> list[Any]:
    return ctl.channel.acks  # type: ignore[union-attr, no-any-return]


def refused_or_migrated(ctl: Controller, exited: int | None, ck: Path, refusal: str) -> None:
    """The first ack was a stop for migration: refused saying `refusal` (nothing saved, the
    program went on), or, with no refusal expected, applied (exit 75)."""
    ack = acks(ctl)[0]
    if refusal:
        assert exited is None and ctl.migratable is False
        assert not ack.ok and refusal in ack.message, ack.message
        assert not ck.exists()
    else:
        assert exited == EXIT_MIGRATED and ctl.migratable is True and ack.ok, ack


def test_runs_are_classified_like_a_person_would(controller: Controller, tmp_path: Path) -> None:
    g, gs, train, loss, _ = mlp_graph()
    with g.as_default():
        summary = tf.compat.v1.summary.scalar("loss", loss)
        own_saver = tf.compat.v1.train.Saver()
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        adapter = sess._gandiva_chain.adapter
        assert adapter.classify(init).initializes
        assert not adapter.classify(init).is_training
        for fetch in (loss, summary, [loss, summary], gs):
            assert not adapter.classify(fetch).is_training
        assert adapter.classify(gs).reads_global_step
        info = adapter.classify([train, loss])
        assert info.is_training and info.reads_global_step
        assert [name for _, name in info.metric_slots] == ["loss"]
        sess.run(init)
        assert not adapter.classify(own_saver.saver_def.save_tensor_name).is_training
        own_saver.save(sess, str(tmp_path / "own" / "m"), write_meta_graph=False)
        own_saver.restore(sess, str(tmp_path / "own" / "m"))
        assert controller.meter.steps == 0  # the program's saver runs are no steps
        for _ in range(3):
            sess.run(loss)  # an evaluation
            sess.run([train, loss])
        snap = controller.meter.snapshot()
        assert snap.steps == 3 and "loss" in snap.metrics


def test_which_training_runs_advance_the_step_and_which_read_unsaved_input(
        controller: Controller, caplog: pytest.LogCaptureFixture) -> None:
    """A GAN's discriminator run trains without advancing the global step; a run fed by
    a queue, a stateful random op (dropout) or a Python function given no tensor (the next
    item of a Python iterator) reads input no checkpoint holds, and the verdict names the op
    (a Python function of the global step does not); one fed by a tf.data iterator reads
    input whose position the checkpoint holds, unless TensorFlow cannot save it
    (`from_generator`: the verdict names the read and TensorFlow's reason). Fetching the global step with its
    own increment (an unordered read) is warned about; the increment's value is not."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_generator(
            lambda: iter([np.ones([2, 3], np.float32)] * 100),
            output_signature=tf.TensorSpec([2, 3], tf.float32))).get_next()
        w = tf.compat.v1.get_variable("w", [3, 1])
        d = tf.compat.v1.get_variable("d", [3, 1])
        loss = tf.reduce_sum(tf.matmul(tf.ones([2, 3]), w))
        d_train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(tf.ones([2, 3]), d)), var_list=[d])
        g_train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, var_list=[w], global_step=gs)
        fed = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(x, w)), var_list=[w])
        dropout = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(tf.compat.v1.nn.dropout(tf.ones([2, 3]), rate=0.5), w)),
            var_list=[w], global_step=gs)
        batches = iter(np.ones((100, 2, 3), np.float32))
        from_python = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(tf.reshape(tf.numpy_function(
                lambda: next(batches), [], tf.float32), [2, 3]), w)), var_list=[w])
        of_step = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(tf.reshape(tf.compat.v1.py_func(
                lambda s: np.full((2, 3), s, np.float32), [gs], tf.float32), [2, 3]), w)),
            var_list=[w])
        with tf.control_dependencies([d_train]):  # the step set by hand
            d_assigns = gs.assign(gs + 1)
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        adapter = sess._gandiva_chain.adapter
        assert adapter.classify(d_assigns).advances_step
        with g.as_default(), tf.control_dependencies([g_train]):
            ordered = tf.identity(gs.read_value())
        adapter.classify([g_train, ordered])
        assert "does not order the two" not in caplog.text
        adapter.classify([g_train, gs])
        assert "does not order the two" in caplog.text
        d_info, g_info = adapter.classify(d_train), adapter.classify(g_train)
        assert d_info.is_training and not d_info.advances_step and not d_info.stateful_input
        assert g_info.is_training and g_info.advances_step and not g_info.stateful_input
        assert adapter.classify(fed).iterators == ("OneShotIterator",)
        assert not adapter.classify(fed).stateful_input  # its state may be saved: tried at the run
        assert adapter.classify(dropout).stateful_input.startswith("RandomUniform")
        assert adapter.classify(from_python).stateful_input.startswith("PyFunc")
        assert not adapter.classify(of_step).stateful_input  # computed from the step
        sess.run(init)
        sess.run(gs)
        for _ in range(2):
            sess.run(d_train)
            sess.run(g_train)
        assert controller.migratable is True and controller.meter.steps == 2
        sess.run(fed)  # a later run reads a tf.data iterator: judged again
        assert controller.migratable is False
        migratability = controller.channel.migratability  # type: ignore[union-attr]
        reason = migratability[-1][1]
        assert "IteratorGetNext" in reason and "tf.data" in reason and "cannot be saved" in reason


@contextlib.contextmanager
def control_flow(version: str) -> Iterator[None]:
    """Graphs built in the block use v1 control flow and reference variables (as programs
    calling `disable_v2_behavior()` do) or TensorFlow 2's functional control flow."""
    if version == "v1":
        tf.compat.v1.disable_control_flow_v2()
        tf.compat.v1.disable_resource_variables()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()
        tf.compat.v1.enable_resource_variables()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_updates_inside_control_flow_are_training_runs(version: str,
                                                        controller: Controller) -> None:
    """An update inside a `tf.while_loop` (several per run), a `tf.cond` (a step skipped
    when the gradients are not finite: TensorFlow's own dynamic loss scaling, or by hand),
    a cond nested in a loop or a `tf.function` called from the graph trains and advances
    the global step: the shim used to see none of them (v2 control flow hides them in
    functions, v1 passes the step through Enter/Switch), so the job counted no step and
    took no command. Dropout inside a loop reads unsaved input; a loop that only
    evaluates does not train."""
    g = tf.Graph()
    with control_flow(version), g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 1]))
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)

        def loss_at(i: Any, rate: float = 0.0) -> Any:
            x = tf.random.stateless_normal([2, 3], seed=tf.stack([tf.cast(i, tf.int32), 1]))
            if rate:
                x = tf.compat.v1.nn.dropout(x, rate=rate)
            return tf.reduce_sum(tf.matmul(x, w) ** 2)

        def loop(body_loss: Any, apply: bool = True) -> Any:
            def body(i: Any) -> Any:
                with tf.control_dependencies([i]):
                    step = tf.identity(gs)
                done = opt.minimize(body_loss(step), global_step=gs) if apply \
                    else tf.identity(body_loss(step))
                with tf.control_dependencies([done]):
                    return i + 1
            return tf.while_loop(lambda i: i < 3, body, [tf.constant(0)])

        per_run = loop(loss_at)
        dropout_loop = loop(lambda i: loss_at(i, rate=0.5))
        evaluation = loop(loss_at, apply=False)
        grads = tf.gradients(loss_at(gs), [w])

        def skip_unless_finite() -> Any:
            def apply() -> Any:
                with tf.control_dependencies([opt.apply_gradients(zip(grads, [w]),
                                                                  global_step=gs)]):
                    return tf.constant(True)
            return tf.cond(tf.reduce_all(tf.math.is_finite(grads[0])), apply,
                           lambda: tf.constant(False))

        by_hand = skip_unless_finite()
        loss_scaled = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), "dynamic").minimize(
                loss_at(gs), global_step=gs)
        nested = tf.while_loop(lambda i: i < 2, lambda i: tf.tuple(
            [i + 1], control_inputs=[skip_unless_finite()])[0], [tf.constant(0)])
        runs = {"loop": per_run, "cond": by_hand, "loss scale": loss_scaled,
                "cond in a loop": nested}
        if version == "v2":
            @tf.function
            def step_fn() -> Any:
                return gs.assign_add(1)

            runs["tf.function"] = step_fn()
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        adapter = sess._gandiva_chain.adapter
        for name, run in runs.items():
            info = adapter.classify(run)
            assert info.is_training and info.advances_step, name
            assert not info.stateful_input, name
        info = adapter.classify(dropout_loop)
        assert info.is_training and "RandomUniform" in info.stateful_input
        assert not adapter.classify(evaluation).is_training
        sess.run(init)
        step = sess.run(gs)
        for _ in range(3):
            sess.run(per_run)
            step = sess.run(gs)
        assert step == 9  # three updates a run
        assert controller.meter.steps == 3 and controller.migratable is True


def test_an_assignment_trains_when_computed_from_its_variable(tmp_path: Path) -> None:
    """Gradient descent written by hand (`assign(w, w - rate * grad)`, `gs.assign(gs + 1)`)
    is a training run: the shim used to see no step of it. Loading a layer from NumPy
    (`w.assign(array)`) is not; run after the restore point of a restarted job, it used to
    overwrite the restored weights with the pre-trained ones: now the shim restores again
    before the first training step. Accumulating into a variable (`acc.assign_add(grad)`,
    a micro-batch run before the step's apply run) is neither: it is part of the step."""
    def build() -> tuple[Any, Any, Any, Any, Any]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, -2.0]))
        (grad,) = tf.gradients(tf.reduce_sum(w * w), [w])
        with tf.control_dependencies([tf.compat.v1.assign(w, w - 0.1 * grad)]):
            train = gs.assign(gs + 1)
        array = tf.compat.v1.placeholder(tf.float32, [2])
        return gs, w, train, w.assign(array), array

    pretrained = np.array([5.0, 5.0], np.float32)
    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train, load, array = build()
        adapter = sess._gandiva_chain.adapter
        manual = adapter.classify(train)
        assert manual.is_training and manual.advances_step and not manual.initializes_some
        loading = adapter.classify(load)
        assert not loading.is_training and loading.initializes_some
        with g.as_default():
            acc = tf.compat.v1.get_variable("acc", initializer=tf.zeros([2]), trainable=False)
            for accumulate in (acc.assign_add(w), acc.assign(acc + w)):
                info = adapter.classify(accumulate)
                assert not info.is_training and not info.initializes_some
            # Sparse updates of an embedding's rows, resource and reference variables: a
            # scatter_sub is a training update even in a run that leaves the step alone; a
            # scatter_update trains when computed from the table, loads when not.
            for resource in (True, False):
                table = tf.compat.v1.Variable(tf.ones([4, 2]), use_resource=resource,
                                              name=f"table_{resource}")
                rows = tf.compat.v1.scatter_sub(table, [1, 3], 0.1 * tf.ones([2, 2]))
                info = adapter.classify(rows)
                assert info.is_training and not info.advances_step, resource
                halved = tf.compat.v1.scatter_update(table, [0], tf.gather(table, [1]) * 0.5)
                assert adapter.classify(halved).is_training, resource
                loading = adapter.classify(tf.compat.v1.scatter_update(
                    table, [0], tf.zeros([1, 2])))
                assert not loading.is_training and loading.initializes_some, resource
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(load, {array: pretrained})
        assert sess.run(gs) == 0
        sess.run(train)
        checkpoint_at_the_next_step(source, sess, train, tmp_path / "ck")  # step 2
        expected = sess.run(w)
    assert acks(source)[-1].ok and acks(source)[-1].step == 2 and source.meter.steps == 3

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train, load, array = build()
        sess.run(tf.compat.v1.global_variables_initializer())  # the restore point
        sess.run(load, {array: pretrained})  # the program loads its pre-trained layer
        assert sess.run(gs) == 2
        sess.run(train)  # the shim restores again right before this
        np.testing.assert_array_equal(sess.run(w), expected)


def test_throwaway_session_then_the_real_one(controller: Controller, tmp_path: Path) -> None:
    g, _gs, train, _, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as probe:  # a program checking its setup first
        probe.run(init)
    with session(g) as sess:
        sess.run(init)
        for _ in range(6):
            sess.run(train)
        # Asked for after the last step: taken when the program closes its session.
        controller.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
    ack = acks(controller)[-1]
    assert ack.ok and ack.step == 6 and validate(tmp_path / "ck")["global_step"] == 6


def test_replicas_saved_once_and_restored_into_every_replica(controller: Controller,
                                                             tmp_path: Path) -> None:
    g, _gs, train, init, variables = trainable_graph(replicas=4)
    with session(g, 4) as sess:
        sess.run(init)
        for _ in range(3):
            sess.run(train)
        adapter = sess._gandiva_chain.adapter
        info = adapter.save(str(tmp_path / "ck"), "t")
        saved = {v.name: sess.run(v) for v in variables}
        # Perturb every replica differently, then restore.
        for v in variables:
            v.load(np.random.default_rng(len(v.name)).normal(size=v.shape).astype(
                v.dtype.as_numpy_dtype), sess)
        adapter.restore(str(tmp_path / "ck"))
        for v in variables:
            canonical = v.name.split("/", 1)[1] if v.name.startswith("tower_") else v.name
            np.testing.assert_array_equal(sess.run(v), saved["tower_0/" + canonical]
                                          if v.name.startswith("tower_") else saved[v.name])
    names = dict(tf.train.list_variables(str(tmp_path / "ck" / "model")))
    assert info.replicas == 4 and validate(tmp_path / "ck")["replicas"] == 4
    assert "fc1/w" in names and "fc1/w/Momentum" in names and "global_step" in names
    assert not any(n.startswith("tower_") for n in names)  # one copy, canonical names
    trainable_per_tower = 6
    assert len(names) == 2 * trainable_per_tower + 1

    # A 2-replica graph (the job shrank, one tower per device) refuses it, untouched:
    # averaging 2 towers' gradients instead of 4 would change the result.
    g2, gs2, *_ = mlp_graph(replicas=2)
    with g2.as_default():
        init2 = tf.compat.v1.global_variables_initializer()
        w1 = next(v for v in tf.compat.v1.global_variables() if v.name == "tower_1/fc1/w:0")
    with session(g2, 2) as sess2:
        sess2.run(init2)
        before = sess2.run(w1)
        with pytest.raises(TowersChanged, match="holds 4 tower copies .* builds 2"):
            sess2._gandiva_chain.adapter.restore(str(tmp_path / "ck"))
        np.testing.assert_array_equal(sess2.run(w1), before)
        assert sess2.run(gs2) == 0


def test_rehearsal_undoes_all_training_state_and_leaves_no_scratch(controller: Controller) -> None:
    """The warm rehearsal: one real step between a snapshot and its restore (weights,
    momentum slots and global step of every replica back as before); scratch
    directories of killed writers are swept."""
    import os
    import subprocess

    from tf_runtime.tf_session import _scratch_dir

    mine = _scratch_dir("rehearsal")
    proc = subprocess.Popen(["true"])
    proc.wait()  # a writer that has died
    dead_stale = mine.parent / f".rehearsal.tmp-{proc.pid}-gone"
    dead_stale.mkdir()
    mine.rmdir()
    g, gs, train, init, variables = trainable_graph(replicas=2)
    with session(g, 2) as sess:
        sess.run(init)
        sess.run(train)
        before = {v.name: sess.run(v) for v in variables}
        adapter = sess._gandiva_chain.adapter
        stepped: list[int] = []
        timings = adapter.rehearse(lambda: stepped.append(int(sess.run(train))))
        assert stepped == [2] and set(timings) == {"snapshot_s", "warm_step_s", "unwind_s"}
        after = {v.name: sess.run(v) for v in variables}
        assert [n for n in before if not np.array_equal(before[n], after[n])] == []
        assert sess.run(gs) == 1
    assert not dead_stale.exists()
    assert [p for p in mine.parent.iterdir() if f"-{os.getpid()}-" in p.name] == []


def saved_after_one_step(sess: Any, init: Any, train: Any, directory: Path) -> tuple[Any, Path]:
    """Initialise, train one step and save through the shim's adapter into ``directory``;
    the adapter and the checkpoint's data file (for a test to damage)."""
    sess.run(init)
    sess.run(train)
    adapter = sess._gandiva_chain.adapter
    adapter.save(str(directory), "t")
    return adapter, next(directory.glob("model.data-*"))


def test_truncated_checkpoint_is_refused_and_nothing_changes(controller: Controller,
                                                             tmp_path: Path) -> None:
    g, gs, train, _, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        adapter, data = saved_after_one_step(sess, init, train, tmp_path / "ck")
        data.write_bytes(data.read_bytes()[:100])
        sess.run(train)
        with pytest.raises(CheckpointError, match="truncated"):
            adapter.restore(str(tmp_path / "ck"))
        assert sess.run(gs) == 2


def test_monitored_training_session_with_hooks(controller: Controller, tmp_path: Path) -> None:
    g, _gs, train, loss, _ = mlp_graph()
    with g.as_default():
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=40),
                 tf.compat.v1.train.LoggingTensorHook({"loss": loss}, every_n_iter=10),
                 tf.compat.v1.train.NanTensorHook(loss)]
        ck = tmp_path / "mts"
        controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "ours")))
        runs = 0
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=str(ck), hooks=hooks, save_checkpoint_steps=15,
                save_summaries_steps=None, log_step_count_steps=None) as mon:
            assert g.finalized  # the shim's saver had to be built before this
            while not mon.should_stop():
                mon.run(train)
                runs += 1
                if runs == 20:
                    controller.enqueue(Command("c2", Kind.CHECKPOINT, str(tmp_path / "ours")))
    by_id = {a.command_id: a for a in acks(controller)}
    assert by_id["c1"].ok and by_id["c1"].step == 1
    assert by_id["c2"].ok and by_id["c2"].step == 20  # at the cut before the 21st
    assert controller.meter.steps == runs == 40  # hook and saver runs are not steps
    assert controller.migratable is True  # StopAtStepHook reads the global step
    assert validate(tmp_path / "ours")["global_step"] == 20


def test_suspend_holds_a_background_thread_without_deadlock(controller: Controller) -> None:
    g, gs, train, loss, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        sess.run(init)
        sess.run(train)
        stop = threading.Event()
        background_runs = [0]

        def summary_thread() -> None:  # like a Supervisor's summary/step-counter thread
            while not stop.is_set():
                sess.run(loss)
                background_runs[0] += 1

        bg = threading.Thread(target=summary_thread)
        bg.start()
        controller.enqueue(Command("s", Kind.SUSPEND))
        trainer = threading.Thread(target=sess.run, args=(train,))
        trainer.start()
        controller.channel.wait_ack("s")  # type: ignore[union-attr]
        time.sleep(0.1)
        held = background_runs[0]
        time.sleep(0.3)
        assert background_runs[0] == held  # held at the gate while suspended
        controller.enqueue(Command("r", Kind.RESUME))
        trainer.join(10)
        time.sleep(0.2)
        stop.set()
        bg.join(10)
        assert not trainer.is_alive() and not bg.is_alive()
        assert background_runs[0] > held
        assert sess.run(gs) == 2



def fed_program(loop: str, steps: int, after_step: Any = None) -> Any:
    """A job whose loop goes on from the global step it reads and feeds the mini-batch of
    that step, in a plain Session or a MonitoredTrainingSession (StopAtStepHook); calls
    `after_step(step)` after each training run; returns its trained weights."""
    with tf.Graph().as_default() as g:
        gs, x, train, pool = fed_graph()
        (w,) = [v for v in tf.compat.v1.global_variables() if v.op.name == "w"]
        if loop == "session":
            with session(g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                while (step := int(sess.run(gs))) < steps:
                    sess.run(train, {x: pool[step]})
                    if after_step is not None:
                        after_step(step + 1)
                return sess.run(w)

        class Keep(tf.compat.v1.train.SessionRunHook):
            def end(self, session: Any) -> None:
                self.weights = session.run(w)

        keep = Keep()
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=[tf.compat.v1.train.StopAtStepHook(last_step=steps), keep],
                save_checkpoint_secs=None, save_summaries_steps=None,
                save_summaries_secs=None, log_step_count_steps=None) as mon:
            while not mon.should_stop():
                step = int(mon.run(gs))
                mon.run(train, {x: pool[step]})
                if after_step is not None:
                    after_step(step + 1)
        return keep.weights


@pytest.mark.parametrize("restored", [False, True], ids=["new", "restored"])
@pytest.mark.parametrize("loop", ["session", "monitored"])
def test_a_suspend_queued_before_the_first_training_run_holds_before_it(
        loop: str, restored: bool, tmp_path: Path) -> None:
    """A job placed into a time-slice group (or restarted from its checkpoint into one) is
    suspended as soon as its shim connects. The suspend used to be applied at the end of
    its first training run: it trained that mini-batch beside the group's running job, on
    one GPU. Now it holds before that run (after the restore), acked with the step it
    starts from, and trains only once resumed, to the weights of an uninterrupted run."""
    with shimmed():
        expected = fed_program(loop, 6)
    start = 0
    if restored:
        ck = tmp_path / "ck"
        with shimmed() as source:
            fed_program(loop, 6, lambda step: step == 2 and source.enqueue(
                Command("c", Kind.CHECKPOINT, str(ck))))
        assert acks(source)[0].ok, acks(source)
        start = validate(ck)["global_step"]
        assert 2 <= start < 6
    with shimmed(tmp_path / "ck" if restored else None) as ctl:
        ctl.enqueue(Command("s", Kind.SUSPEND, reason="time slice over"))
        result: list[Any] = []
        trainer = threading.Thread(target=lambda: result.append(fed_program(loop, 6)))
        trainer.start()
        try:
            ack = ctl.channel.wait_ack("s", timeout=60)  # type: ignore[union-attr]
            assert ack.ok and ack.step == start, ack
            assert ctl.boundaries == 0, "a training run returned before the suspend"
            assert ctl.suspended and trainer.is_alive()
        finally:
            ctl.enqueue(Command("r", Kind.RESUME))
            trainer.join(60)
        assert not trainer.is_alive() and ctl.channel.wait_ack("r").ok  # type: ignore[union-attr]
        assert ctl.meter.steps == 6
    np.testing.assert_array_equal(result[0], expected)


@pytest.mark.parametrize("form", ["op", "list", "options", "feeds", "from_options"])
def test_training_through_a_callable_is_seen_like_run(form: str, controller: Controller,
                                                      tmp_path: Path) -> None:
    """`Session.make_callable` without feeds (and `_make_callable_from_options`, which
    graph-mode Keras uses) runs without `Session.run`. Its training steps must count,
    commands must act at its boundaries, and it must return what TensorFlow's own
    callable returns."""
    g, gs, train, loss, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
        lr_scale = tf.compat.v1.placeholder_with_default(1.0, [])
        scaled = loss * lr_scale
    with session(g) as sess:
        sess.run(init)
        if form == "op":
            op = train.op  # an Operation: its callable returns nothing
            step_fn, expect = sess.make_callable(op), type(None)
        elif form == "list":
            step_fn, expect = sess.make_callable([train, loss]), list
        elif form == "options":
            with_opts = sess.make_callable({"t": train, "l": loss}, accept_options=True)
            meta = tf.compat.v1.RunMetadata()

            def step_fn() -> Any:
                return with_opts(options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE), run_metadata=meta)
            expect = dict
        elif form == "feeds":
            fed = sess.make_callable([train, scaled], feed_list=[lr_scale])

            def step_fn() -> Any:
                return fed(1.0)
            expect = list
        else:
            from tensorflow.core.protobuf.config_pb2 import CallableOptions

            opts = CallableOptions()
            opts.fetch.append(scaled.name)
            opts.target.append(train.name)
            opts.feed.append(lr_scale.name)
            raw = sess._make_callable_from_options(opts)

            def step_fn() -> Any:
                return raw(np.float32(1.0))
            expect = list
        read_step = sess.make_callable(gs)
        assert read_step() == 0
        controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "ours")))
        results = [step_fn() for _ in range(5)]
        assert all(isinstance(r, expect) for r in results)
        if form == "from_options":
            assert len(results[0]) == 1 and np.isfinite(results[0][0])  # the fetch, no target
        if form == "options":
            assert meta.step_stats.dev_stats  # the run metadata was filled in
        assert read_step() == 5
    by_id = {a.command_id: a for a in acks(controller)}
    assert by_id["c1"].ok and by_id["c1"].step == 1  # at the first callable step's boundary
    assert validate(tmp_path / "ours")["global_step"] == 1
    assert controller.meter.steps == 5
    assert controller.migratable is True  # it reads the step through its callable


def test_training_through_partial_run_is_seen_like_run(controller: Controller,
                                                      tmp_path: Path) -> None:
    """`Session.partial_run` runs without `Session.run`: a program training through it
    (`h = sess.partial_run_setup([loss, train], [scale])`, the loss fetched first, then the
    update) reached no boundary, so no command was ever applied (a suspend never answered,
    a migration never made). Its steps now count and commands act after the call that
    fetches the update; a rehearsal (warm mode) never makes the program's partial run."""
    g, gs, train, loss, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
        scale = tf.compat.v1.placeholder(tf.float32, [])
        scaled = loss * scale
    with session(g) as sess:
        sess.run(init)
        assert sess.run(gs) == 0
        controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "ours")))
        for _ in range(3):
            h = sess.partial_run_setup([scaled, train], [scale])
            assert np.isfinite(sess.partial_run(h, scaled, {scale: 1.0}))
            sess.partial_run(h, train)
        h = sess.partial_run_setup([scaled, train], [scale])
        sess.partial_run(h, scaled, {scale: 1.0})
        adapter = sess._gandiva_chain.adapter
        with pytest.raises(RuntimeError, match="not rehearsed"):
            adapter.rehearse(lambda: sess.partial_run(h, train))
        # TensorFlow applied the update at the first call (its inputs were all fed); the
        # rehearsal is undone and left the handle to the program.
        assert sess.run(gs) == 4
        sess.partial_run(h, train)
        assert sess.run(gs) == 4
    by_id = {a.command_id: a for a in acks(controller)}
    assert by_id["c1"].ok and by_id["c1"].step == 1  # at the first partial step's boundary
    assert validate(tmp_path / "ours")["global_step"] == 1
    assert controller.meter.steps == 4


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_a_hand_made_global_step_never_breaks_the_program(dtype: str, controller: Controller,
                                                          tmp_path: Path) -> None:
    """`tf.Variable(0, name="global_step")` with resource variables: TensorFlow's lookup by
    name raises on it (its `global_step:0` is the handle), which used to stop the program
    at its first run. An integer one is the job's step; a float one is none (the job is
    then not migratable, and trains on)."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.Variable(tf.zeros([], dtype), trainable=False, name="global_step")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        loss = tf.reduce_sum(w * w)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.control_dependencies([train]):
            train = gs.assign_add(tf.ones([], dtype)) if dtype == "int32" else tf.group(
                train, gs.assign_add(1.0))
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        sess.run(init)
        controller.enqueue(Command("c1", Kind.CHECKPOINT, str(tmp_path / "ours")))
        step = sess.run(gs)  # a loop that starts from the step
        while step < 3:
            sess.run(train)
            step = sess.run(gs)
        assert sess.run(gs) == 3
    ack = {a.command_id: a for a in acks(controller)}["c1"]
    assert ack.ok
    if dtype == "int32":
        assert ack.step == 1 and validate(tmp_path / "ours")["global_step"] == 1
        assert controller.migratable is True
    else:
        assert controller.migratable is False


def test_a_fault_in_the_shims_classification_leaves_the_run_alone(
        controller: Controller, caplog: pytest.LogCaptureFixture) -> None:
    g, gs, train, loss, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        adapter = sess._gandiva_chain.adapter

        def broken(fetches: Any) -> Any:
            raise RuntimeError("shim bug")
        adapter._classify = broken
        sess.run(init)
        assert np.isfinite(sess.run(loss))
        assert sess.run(train) == 1 and sess.run(gs) == 1  # the program goes on
    assert "could not classify a run" in caplog.text and "shim bug" in caplog.text


def test_variables_created_after_the_restore_come_back_from_the_checkpoint(
        tmp_path: Path) -> None:
    """A program that builds its second optimizer once it reads a step past a phase switch
    creates the optimizer's slots after the shim's restore and initialises them itself.
    They must come back from the checkpoint before its first training step (its next step
    then equals the source's), while a variable the checkpoint lacks keeps the program's
    own value."""
    def phase1() -> tuple[Any, Any, Any]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, -2.0, 3.0]))
        return gs, w, tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * w), global_step=gs)

    def phase2(gs: Any, w: Any) -> Any:
        return tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(w * w),
                                                              global_step=gs)

    def state(sess: Any) -> dict[str, Any]:
        return {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()
                if v.op.name != "extra"}

    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, w, _ = phase1()
        train = phase2(gs, w)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        checkpoint_at_the_next_step(source, sess, train, tmp_path / "ck")  # step 4
        expected = state(sess)  # step 5
    assert acks(source)[-1].ok and acks(source)[-1].step == 4

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, w, _ = phase1()
        sess.run(tf.compat.v1.global_variables_initializer())  # the restore point
        assert sess.run(gs) == 4  # past the switch: build phase 2 now
        before = set(tf.compat.v1.global_variables())
        train = phase2(gs, w)
        extra = tf.compat.v1.get_variable("extra", initializer=tf.constant(7.0))
        sess.run(tf.compat.v1.variables_initializer(
            [v for v in tf.compat.v1.global_variables() if v not in before]))
        sess.run(train)  # the shim restores again right before this
        got = state(sess)
        assert sess.run(extra) == 7.0  # not in the checkpoint: the program's own value
    assert set(got) == set(expected) and {"w/Adam", "w/Adam_1", "beta1_power"} <= set(got)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_state_outside_the_global_variables_travels_with_the_checkpoint(
        tmp_path: Path) -> None:
    """A trainable variable in a collection of the program's own (not among the global
    variables) and a streaming metric (local variables) updated in the training run come
    back from the checkpoint; before, a restarted job retrained the first from its
    initial value and restarted the metric. A checkpoint taken while the local variables
    are not yet initialised (a metric reset only at evaluation) still succeeds, without
    them; and the program's own initialisation of them after the restore (MonitoredSession's
    local_init_op) is undone before its first training step."""
    def build() -> tuple[Any, Any, Any, Any, Any]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, -2.0]))
        scale = tf.compat.v1.get_variable(
            "scale", initializer=tf.constant(1.5),
            collections=["model", tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES])
        loss = tf.reduce_sum(w * w) * scale + tf.square(scale)
        mean, update = tf.compat.v1.metrics.mean(loss)
        plain = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=gs)
        with tf.control_dependencies([plain]):
            train = tf.group(update)
        return gs, scale, mean, (plain, train), tf.group(
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.variables_initializer([scale]))

    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, scale, mean, (plain, train), init = build()
        sess.run(init)
        sess.run(gs)
        source.enqueue(Command("c0", Kind.CHECKPOINT, str(tmp_path / "early")))
        sess.run(plain)
        sess.run(plain)  # taken right before it: the local variables are not initialised yet
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run(train)
        checkpoint_at_the_next_step(source, sess, train, tmp_path / "ck")  # step 4
        expected = sess.run({"gs": gs, "scale": scale, "mean": mean})
    assert [a.ok for a in acks(source)] == [True, True]
    assert not (tmp_path / "early" / "locals.index").exists()
    assert (tmp_path / "ck" / "locals.index").exists()

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, scale, mean, (_, train), init = build()
        sess.run(init)  # the restore point
        assert sess.run(gs) == 4 and sess.run(scale) != 1.5
        sess.run(tf.compat.v1.local_variables_initializer())  # undone before training
        sess.run(train)
        got = sess.run({"gs": gs, "scale": scale, "mean": mean})
    assert got == expected


def test_an_evaluation_session_initialised_first_does_not_decide_the_restore(
        tmp_path: Path) -> None:
    """A restarted program whose evaluation graph (one tower, a variable of its own) is
    initialised before its two-tower training graph: the checkpoint fits neither the
    evaluation graph's variables nor its tower count, which used to end the process there.
    It is restored into the training session, which trains on from the checkpoint."""
    g, gs, train, init, _ = trainable_graph(replicas=2)
    with shimmed() as source, session(g, 2) as sess:
        sess.run(init)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        for _ in range(3):
            sess.run(train)
    assert acks(source)[-1].ok and acks(source)[-1].step == 1

    with shimmed(tmp_path / "ck") as restarted:
        eval_graph, _, _, _, _ = mlp_graph(replicas=1)
        with eval_graph.as_default():
            tf.Variable(0, name="evaluations")
            eval_init = tf.compat.v1.global_variables_initializer()
        g, gs, train, init, _ = trainable_graph(replicas=2)
        with session(eval_graph) as eval_sess, session(g, 2) as sess:
            eval_sess.run(eval_init)  # not fatal: it may never train
            sess.run(init)
            assert sess.run(gs) == 1  # restored into the session that trains
            sess.run(train)
            assert sess.run(gs) == 2
    assert restarted.restored_step == 1


@pytest.mark.parametrize("module,params", [("resnet50", 25.5e6), ("vgg16", 138.3e6)])
def test_big_examples_have_the_real_models_sizes(module: str, params: float) -> None:
    import importlib

    model = importlib.import_module(f"tf_runtime.examples.{module}").model
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        loss = model(argparse.Namespace(seed=0, batch=1, image_size=32), gs, 0)
        count = sum(int(np.prod(v.shape.as_list())) for v in tf.compat.v1.trainable_variables())
        assert loss.shape.rank == 0
    assert abs(count - params) / params < 0.01


def test_ref_variables_of_disable_v2_behavior_programs(controller: Controller,
                                                       tmp_path: Path) -> None:
    """Programs calling disable_v2_behavior() get reference variables (VariableV2, Apply*)."""
    tf.compat.v1.disable_resource_variables()
    try:
        g, gs, train, loss, _ = mlp_graph(replicas=2)
    finally:
        tf.compat.v1.enable_resource_variables()
    assert gs.op.type == "VariableV2"
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
        w1 = next(v for v in tf.compat.v1.global_variables() if v.name == "tower_1/fc1/w:0")
    with session(g, 2) as sess:
        sess.run(init)
        adapter = sess._gandiva_chain.adapter
        assert adapter.classify(train).is_training and adapter.classify(gs).reads_global_step
        for _ in range(3):
            sess.run([train, loss])
        sess.run(train)
        controller.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        saved = sess.run(w1)  # a read: the checkpoint is taken before the next step's run
        sess.run(train)
        adapter.restore(str(tmp_path / "ck"))
        np.testing.assert_array_equal(sess.run(w1), saved)
        assert sess.run(gs) == 4 == acks(controller)[-1].step


def test_state_carried_in_python_from_step_to_step_is_not_migratable(tmp_path: Path) -> None:
    """A recurrent cell whose state the program carries in Python from one mini-batch to
    the next (`state = sess.run(final_state, {initial_state: state})`): a restarted copy
    starts that state over, so a migrated job ended with other weights while the shim
    called it migratable (it reads the global step). Now the value fed back is recognised,
    the job is judged not migratable with the reason, and a migration asked for at its
    first step is refused rather than taken before the second step shows the feedback.
    Feeding back a read of the global step or of a weight (restored with it), feeding the
    state only into a run that does not train (what is logged), or fetching it without
    feeding it back, stays migratable (migrated at the second step)."""
    def build() -> tuple[Any, ...]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        h0 = tf.compat.v1.placeholder(tf.float32, [2, 3])
        s0 = tf.compat.v1.placeholder_with_default(0.0, [])
        m0 = tf.compat.v1.placeholder_with_default(tf.zeros([3, 3]), [3, 3])
        w = tf.compat.v1.get_variable("w", initializer=tf.eye(3) * 0.5)
        h1 = tf.tanh(tf.matmul(x + h0, w) + 0.0 * (s0 + tf.reduce_sum(m0)))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(h1 * h1), global_step=gs)
        return gs, x, h0, s0, m0, w, h1, train, tf.identity(gs)

    data = np.ones((2, 3), np.float32)
    for carry in ("state", "tuple", "step", "weights", "logged", "none"):
        with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
            gs, x, h0, s0, m0, w, h1, train, step_value = build()
            sess.run(tf.compat.v1.global_variables_initializer())
            ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / carry)))
            feeds: dict[Any, Any] = {x: data, h0: data}
            exited = None
            try:
                for _ in range(4):
                    sess.run(gs)  # a loop that resumes from the step it reads
                    if carry == "tuple":  # a structure of fetches, fed back leaf by leaf
                        got = sess.run({"train": train, "state": (h1, gs)}, feeds)
                        feeds = {x: data, h0: got["state"][0]}
                    elif carry == "step":
                        _, step = sess.run([train, step_value], feeds)
                        feeds = {x: data, h0: data, s0: step}
                    elif carry == "weights":
                        _, weights = sess.run([train, w], feeds)
                        feeds = {x: data, h0: data, m0: weights}
                    else:
                        _, h = sess.run([train, h1], feeds)
                        feeds = {x: data, h0: h if carry == "state" else data}
                        if carry == "logged":  # fed into a run that does not train
                            sess.run(h1, {x: data, h0: h})
            except Exited as e:
                exited = e.code
            ack = acks(ctl)[0]
            if carry in ("state", "tuple"):
                assert exited is None and ctl.migratable is False, carry
                assert "fed back" in ctl.channel.migratability[-1][1]  # type: ignore[union-attr]
                assert not ack.ok and "not migratable" in ack.message, carry
                assert not (tmp_path / carry).exists()
            else:
                assert exited == EXIT_MIGRATED and ctl.migratable is True, carry
                assert ack.ok and ack.step == 2, (carry, ack)


def test_tower_copies_that_differ_are_saved_one_by_one(tmp_path: Path) -> None:
    """Names alone cannot tell a replica from a variable built alike: a two-tower model's
    query and document towers (`tower_0/own`, `tower_1/own`, their own initial values and
    updates) used to be saved as one copy, and a restore wrote the query tower into the
    document tower (a migrated job ended with other weights). Now copies are compared
    before each save: those that differ (and their Adam slots) are saved one entry per copy,
    the manifest lists them, and a restarted process restores each into its own tower;
    copies that are equal (`tower_i/shared`) are still saved once, under the canonical
    name. Every variable comes back bit for bit, in a new process's graph too."""
    def build() -> tuple[Any, Any, list[Any]]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
        loss = 0.0
        for i in range(2):
            with tf.compat.v1.variable_scope(f"tower_{i}"):
                shared = tf.compat.v1.get_variable("shared", initializer=tf.ones([3]),
                                                   trainable=False)
                own = tf.compat.v1.get_variable(
                    "own", initializer=np.random.RandomState(i).standard_normal((3, 2)).astype(np.float32))
                loss += tf.reduce_sum(tf.tanh(tf.matmul(x * shared, own)) * (i + 1.0))
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=gs)
        return train, tf.compat.v1.global_variables_initializer(), tf.compat.v1.global_variables()

    with shimmed(), tf.Graph().as_default() as g, session(g) as sess:
        train, init, variables = build()
        sess.run(init)
        for _ in range(3):
            sess.run(train)
        sess._gandiva_chain.adapter.save(str(tmp_path / "ck"), "t")
        saved = {v.name: sess.run(v) for v in variables}
        assert not np.array_equal(saved["tower_0/own:0"], saved["tower_1/own:0"])
    manifest = validate(tmp_path / "ck")
    assert manifest["split"] == ["own", "own/Adam", "own/Adam_1"] and manifest["replicas"] == 2
    names = dict(tf.train.list_variables(str(tmp_path / "ck" / "model")))
    assert {"tower_0/own", "tower_1/own", "tower_1/own/Adam_1", "shared"} <= set(names)
    assert "tower_1/shared" not in names and "own" not in names

    with shimmed(), tf.Graph().as_default() as g, session(g) as sess:  # a restarted copy
        train, init, variables = build()
        sess.run(init)
        sess._gandiva_chain.adapter.restore(str(tmp_path / "ck"))
        for v in variables:
            np.testing.assert_array_equal(sess.run(v), saved[v.name], err_msg=v.name)


@pytest.mark.parametrize("reads", ["batch", "noise", "staged", "evaluation"])
def test_input_fetched_in_a_run_of_its_own_and_fed_to_training(reads: str, tmp_path: Path) -> None:
    """The common `batch = sess.run(next_element); sess.run(train, {x: batch})`: the
    iterator's position (or a stateful random op's sequence, `noise`) is in no checkpoint,
    so a restarted copy reads its input from the beginning; the shim used to look for such
    input in training runs only and called the job migratable (it reads the global step),
    and a migrated job trained on other data. Now a run of its own that reads it before two
    consecutive steps is taken as the training input: not migratable, with the reason, and
    a migration asked for is refused. `staged`: the batch assigned to a variable in a run of
    its own (`sess.run(staged.assign(next_element))`, as SyncReplicasOptimizer assigns the
    token it dequeues to its local step), the training run reading the variable: that run
    used to be taken for a one-time load, its input unseen, and the job for migratable. An
    evaluation that reads from its own iterator now and then (here every third step), and
    the initialiser's random ops, leave the job migratable."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [4, 3])
        w = tf.compat.v1.get_variable("w", [3, 2])  # a random (glorot) initialiser
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(x, w) ** 2), global_step=gs)
        data = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices(np.ones((100, 4, 3), np.float32)).shuffle(
                100, seed=1).repeat()).get_next()
        noise = tf.random.normal([4, 3])
        staged = tf.compat.v1.get_variable("staged", [4, 3], trainable=False)
        stage = staged.assign(data)
        train_staged = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.matmul(staged, w) ** 2), global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "ck")))
        exited = None
        try:
            for _ in range(6):
                step = int(sess.run(gs))  # a loop that resumes from the step it reads
                if reads == "batch":
                    batch = sess.run(data) * 0.5
                elif reads == "noise":
                    batch = np.ones((4, 3), np.float32) + sess.run(noise)
                elif reads == "staged":
                    sess.run(stage)
                    sess.run(train_staged)
                    continue
                else:
                    batch = np.full((4, 3), step, np.float32)
                    if step % 3 == 0:
                        sess.run(data)  # an evaluation batch, not fed to training
                sess.run(train, {x: batch})
        except Exited as e:
            exited = e.code
        ack = acks(ctl)[0]
        if reads == "evaluation":
            assert exited == EXIT_MIGRATED and ctl.migratable is True
            assert ack.ok and ack.step == 2
        else:
            assert exited is None and ctl.migratable is False
            reason = ctl.channel.migratability[-1][1]  # type: ignore[union-attr]
            assert "a run of its own reads" in reason
            assert ("RandomStandardNormal" if reads == "noise" else "IteratorGetNext") in reason
            assert not ack.ok and "not migratable" in ack.message
            assert not (tmp_path / "ck").exists()


def test_an_update_in_a_run_of_its_own_after_the_training_run_is_part_of_the_step(tmp_path: Path) -> None:
    """`sess.run(train); sess.run(ema_op); step = sess.run(gs)`: the average of the weights
    is updated in a run of its own after the step advanced. A checkpoint used to be taken
    between the two, so it held the step's weights with the previous step's average, and a
    restored copy, resuming at the next step, never made that update (a migrated job ended
    with another average). Now the checkpoint waits for it: it holds the average as it is
    when the program reads the step. A fed run after the training run (the next
    mini-batch's accumulation) is not waited for."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.tanh(tf.matmul(x, w))), global_step=gs)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
        ema_op = ema.apply([w])
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(4):
            if step == 2:
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            sess.run(train)
            sess.run(ema_op)
            if step == 2:
                average, at = sess.run(ema.average(w)), sess.run(gs)
            sess.run(gs)
        assert acks(ctl)[0].ok and acks(ctl)[0].step == 3
    prefix = str(tmp_path / "ck" / "model")
    assert tf.train.load_variable(prefix, "global_step") == at == 3
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "w/ExponentialMovingAverage"), average)


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "reference"])
def test_fetching_the_op_that_increments_the_step_is_no_read_of_it(
        resource: bool, controller: Controller, tmp_path: Path) -> None:
    """`train = opt.minimize(loss, global_step=gs)` returns the op that increments the
    step, and `for i in range(n): sess.run(train)` is the most common TF1 loop. Fetching
    that op returns None, yet the shim took it for a read of the step: such a loop, which
    restarts from 0 (or from a count of its own), was judged migratable, and a migrated
    copy trained other steps than an uninterrupted run. Now only a fetched tensor reads."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step() if resource else tf.Variable(
            0, trainable=False, name="global_step", use_resource=False,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                         tf.compat.v1.GraphKeys.GLOBAL_STEP])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]), use_resource=resource)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * w), global_step=gs)
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        sess.run(init)
        assert not sess._gandiva_chain.adapter.classify(train).reads_global_step
        assert sess._gandiva_chain.adapter.classify([train, gs.value()]).reads_global_step
        for _ in range(3):
            sess.run(train)
        assert controller.migratable is False
        reason = controller.channel.migratability[-1][1]  # type: ignore[union-attr]
        # true for a loop resuming from a count of its own too, and says what to do
        assert "never reads the global step" in reason and "restart from 0" not in reason
        assert "step = sess.run(global_step)" in reason
        controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
        sess.run(train)
    ack = acks(controller)[-1]
    assert not ack.ok and "not migratable" in ack.message


@pytest.mark.parametrize("collections", [[], None], ids=["none", "default"])
def test_a_variable_in_no_collection_updated_by_training_is_not_migratable(
        collections: Any, controller: Controller, tmp_path: Path) -> None:
    """`seen = tf.compat.v1.Variable(0.0, collections=[])`, initialised by the program
    (`seen.initializer`), incremented after each training run in the training op and read
    by the loss. The checkpoint is made of the graph's collections, so it never held `seen`:
    the job was judged migratable and a restored copy started it from 0 again (probed: a
    checkpoint at step 2 restored, 4 steps, other weights). Now not migratable, naming it;
    the same variable in the default collections stays migratable."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        seen = tf.compat.v1.Variable(0.0, collections=collections, trainable=False, name="seen")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            tf.reduce_sum(w * w) * (1.0 + seen), global_step=gs)
        with tf.control_dependencies([train]):
            train = tf.group(train, seen.assign_add(1.0))
        init = [tf.compat.v1.global_variables_initializer(), seen.initializer]
    with session(g) as sess:
        sess.run(init)
        while sess.run(gs) < 2:
            sess.run(train)
        if collections is None:
            assert controller.migratable is True
            return
        assert controller.migratable is False
        reason = controller.channel.migratability[-1][1]  # type: ignore[union-attr]
        assert "updates 'seen', a variable in no collection" in reason
        controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
        sess.run(train)
    ack = acks(controller)[-1]
    assert not ack.ok and "not migratable" in ack.message


@pytest.mark.parametrize("count", ["minimize", "group", "collection"])
def test_a_step_counter_of_the_programs_own_is_named_by_the_refusal(
        count: str, controller: Controller) -> None:
    """No global step: the program counts its iterations in an int64 variable of its own,
    `iterations`, passed to `minimize(global_step=iterations)` (or incremented by an
    `assign_add` in the training op's group), its loop reading it (`programs/own_counter.py`).
    Not migratable, but the reason told it to "pass it to the optimizer's
    minimize(global_step=...)", which it does; now it names the counter and says how to make
    it the global step. Made so (`--collection`: added to the GLOBAL_STEP collection), the
    job is migratable (probed: migrated warm, naive and after a kill, bit-identical)."""
    g = tf.Graph()
    with g.as_default():
        iterations = tf.compat.v1.get_variable("iterations", initializer=tf.constant(0, tf.int64),
                                               trainable=False)
        if count == "collection":
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP, iterations)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        loss = tf.reduce_sum(w * w) * tf.cast(iterations + 1, tf.float32)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        train = tf.group(opt.minimize(loss), tf.compat.v1.assign_add(iterations, 1)) \
            if count == "group" else opt.minimize(loss, global_step=iterations)
        init = tf.compat.v1.global_variables_initializer()
    with session(g) as sess:
        sess.run(init)
        while sess.run(iterations) < 3:
            sess.run(train)
    if count == "collection":
        assert controller.migratable is True
        return
    assert controller.migratable is False
    reason = controller.channel.migratability[-1][1]  # type: ignore[union-attr]
    assert "counts in 'iterations'" in reason and "GraphKeys.GLOBAL_STEP, iterations" in reason
    assert "pass it to the optimizer's minimize" not in reason


@pytest.mark.parametrize("order", ["read_between", "summary_between", "every_k", "before",
                                   "every_k_before"])
def test_an_update_after_the_step_is_read_is_part_of_the_step(order: str,
                                                               tmp_path: Path) -> None:
    """`sess.run(train); step = sess.run(gs); sess.run(ema_op)` (or a summary fetched, fed,
    in between; or a rate halved in a run of its own when the step read is a multiple of
    5): a run that updates the training state after the step advanced, with a read in
    between. The shim waited only for such a run right after the training run, so it took
    a checkpoint between the read and the update, and a restored copy, resuming at the
    next step, never made it (a migrated job ended with another average or rate). Now
    runs that change nothing are looked through. An update run before the first training
    step (`before`: `sess.run(ema_op); sess.run(train)`), or earlier in the program's loop
    than its training run (`every_k_before`: the halving at the top of the loop, which a
    restored copy makes again), begins a step: not waited for."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        rate = tf.compat.v1.get_variable("rate", initializer=0.1, trainable=False)
        halve = rate.assign(rate * 0.5)
        loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)))
        summary = tf.compat.v1.summary.scalar("loss", loss)
        train = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=gs)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
        ema_op = ema.apply([w])
        feed = {x: np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
        sess.run(tf.compat.v1.global_variables_initializer())
        step = sess.run(gs)
        state = [ema.average(w), rate, gs]
        seen = {}
        while step < 12:
            # Pending at the end of step 8 or 9 (every_k: just before the halving at 10).
            if step == {"every_k": 9, "every_k_before": None}.get(order, 8):
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            if order == "every_k_before" and step % 5 == 0 and step:
                sess.run(halve)
            if order == "before":
                sess.run(ema_op)
            sess.run(train, feed)
            if order == "every_k_before" and step == 9:  # pending from step 10 on
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            if order == "summary_between":
                sess.run(summary, feed)
                sess.run(ema_op)
            step = int(sess.run(gs))
            if order == "read_between":
                sess.run(ema_op)
            elif order == "every_k" and step % 5 == 0:
                sess.run(halve)
            seen[step] = sess.run(state)  # as a restarted copy starts from
        ack = acks(ctl)[0]
        # After the updates of the step it was enqueued at (pending still), or the next.
        assert ack.ok and ack.step in (8, 9, 10, 11)
    prefix = str(tmp_path / "ck" / "model")
    average, at_rate, at = seen[ack.step]
    assert tf.train.load_variable(prefix, "global_step") == at == ack.step
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "w/ExponentialMovingAverage"),
                                  average)
    assert tf.train.load_variable(prefix, "rate") == at_rate



_SUPERVISED = """
import sys, time
import tensorflow as tf
from tf_runtime import shim
from tf_runtime.controller import Controller, Settings
from tf_runtime.testing import FakeChannel

tf.compat.v1.disable_eager_execution()  # as the program does: the Supervisor's threads run ops
ctl = Controller(Settings(job_id="t"), channel=FakeChannel(), exit_fn=sys.exit)
shim.install(ctl)
gs = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w * w),
                                                                 global_step=gs)
sv = tf.compat.v1.train.Supervisor(logdir=sys.argv[1], global_step=gs, summary_op=None,
                                   save_model_secs=0, save_summaries_secs=0.01)
with sv.managed_session(config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)) as s:
    for _ in range(4):
        s.run(train)
        if sys.argv[2] == "step":
            s.run(gs)
        time.sleep(0.05)  # the step counter thread reads the step meanwhile
    sv.request_stop()
print("migratable", ctl.migratable)
"""


def test_the_supervisors_own_reads_of_the_step_are_not_the_programs(tmp_path: Path) -> None:
    """`with sv.managed_session() as sess: for i in range(n): sess.run(train)`: the
    Supervisor reads the global step itself (the session log it writes at the start, its
    step counter thread), which made any such program look as if its loop resumed from
    the step: judged migratable, a migrated copy trained n more steps. Now only the
    program's own reads count (a Supervisor program that reads the step stays migratable:
    `test_finalized_graph_programs_migrate_bit_identical`). In a process of its own: the
    Supervisor's threads need eager execution off."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SUPERVISED, str(tmp_path / "sv"), "python"],
                         check=False, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "False"


@pytest.mark.parametrize("order", ["advance_first", "advance_last"])
def test_a_training_run_called_after_the_step_advancing_one_is_part_of_the_step(
        order: str, tmp_path: Path) -> None:
    """Two training runs per step, the first advancing the global step (a generator
    updated with `global_step=gs`, then the discriminator): commands were applied right
    after the first, so a checkpoint held the generator's update of a step without the
    discriminator's, and a restored copy, reading the advanced step, never made the
    latter. Now a training run the program calls from a later line of its loop than the
    advancing run ends the step; one from an earlier line (`advance_last`, the usual
    order) begins the next, as before. A checkpoint asked for in the second step, before
    the program's loop is known (from the second step's runs), waits for it."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        a = tf.compat.v1.get_variable("a", initializer=tf.ones([3]))
        b = tf.compat.v1.get_variable("b", initializer=tf.ones([3]))
        sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        advance = sgd.minimize(tf.reduce_sum(tf.sin(a * x)), global_step=gs)
        other = sgd.minimize(tf.reduce_sum(tf.cos(b * x + tf.stop_gradient(a))), var_list=[b])
        sess.run(tf.compat.v1.global_variables_initializer())
        step, seen = int(sess.run(gs)), {}
        while step < 8:
            if step in (1, 4):
                ctl.enqueue(Command(f"c{step}", Kind.CHECKPOINT, str(tmp_path / f"ck{step}")))
            feed = {x: np.full(3, 0.1 * step, np.float32)}
            first, second = (advance, other) if order == "advance_first" else (other, advance)
            sess.run(first, feed)
            sess.run(second, feed)
            step = int(sess.run(gs))
            seen[step] = sess.run([a, b])  # what a restarted copy resumes from
        # The first, asked for in the second step, waits for its end: before the loop is
        # seen, which run ends a step is not known. The second, asked for at the top of the
        # fifth step, is applied at that cut (before the fifth step's first run) in both
        # orders: advance_first's wait goes on through the reads after its second run
        # (until s51 those reads ended it, and this one waited for the fifth step's end).
        last = 4
        assert [(a.ok, a.step) for a in acks(ctl)] == [(True, 2), (True, last)]
    for at in (2, last):
        prefix = str(tmp_path / f"ck{1 if at == 2 else 4}" / "model")
        for name, value in zip("ab", seen[at], strict=True):
            np.testing.assert_array_equal(tf.train.load_variable(prefix, name), value)


def test_a_global_step_set_back_after_training_refuses_migration(controller: Controller,
                                                                  tmp_path: Path) -> None:
    """`sess.run(gs.assign(0))` after training, a second phase counted from step 0 again: a
    restarted copy would start the program's loop over at its first phase with the restored
    step and weights, and such a migration used to be made (docs/tf_runtime.md, Known
    limits). Now the step going back is seen at the next step's end: the job's progress
    follows it, and a stop for migration is refused saying why."""
    g, gs, train, _, _ = mlp_graph()
    with g.as_default():
        init = tf.compat.v1.global_variables_initializer()
        back = gs.assign(0)
    with session(g) as sess:
        sess.run(init)
        for phase in range(2):
            step = int(sess.run(gs))
            while step < 3:
                sess.run(train)
                step = int(sess.run(gs))
            if phase == 0:
                assert controller.migratable is True
                sess.run(back)
        controller.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "m")))
    ack = acks(controller)[0]
    assert not ack.ok and ack.message.startswith(
        "not migratable: it set its global step back after training (from 3 to 0")
    assert not (tmp_path / "m").exists()
    assert controller.meter.steps == 3 and controller.migratable is False


def test_the_programs_own_restore_after_initialising_never_shows_its_older_step(
        tmp_path: Path) -> None:
    """The most common TF1 start: `sess.run(init)`, then `saver.restore(sess, latest)`
    from its own directory, then `step = sess.run(gs)`. Restarted from a migration, the
    shim restores at the initialiser, the program's own (older) checkpoint overwrites that,
    and the shim restored again only right before the first training run: the program had
    read its own checkpoint's step meanwhile and fed that step's batches onto the restored
    weights (a migrated job ended with other weights). Now the shim restores again before
    the first run that reads after such an overwrite."""
    def build() -> tuple[Any, Any, Any]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * w), global_step=gs)
        return gs, train, tf.compat.v1.train.Saver()

    own = str(tmp_path / "own" / "model")
    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, train, saver = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
            sess.run(gs)
        saver.save(sess, own, global_step=2)
        sess.run(train)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))  # at 3's end
        sess.run(gs)
        sess.run(train)
        sess.run(gs)
    assert acks(source)[-1].ok and acks(source)[-1].step == 3

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, train, saver = build()
        sess.run(tf.compat.v1.global_variables_initializer())  # the restore point
        saver.restore(sess, tf.compat.v1.train.latest_checkpoint(str(tmp_path / "own")))
        assert sess.run(gs) == 3


@pytest.mark.parametrize("reset", ["init", "row"])
def test_state_reset_at_the_top_of_the_loop_is_not_restored_over(reset: str,
                                                                 tmp_path: Path) -> None:
    """A recurrent state kept in variables the training run assigns, reset at the top of
    the loop every 2 steps (a new sequence: `if step % 2 == 0 and step: sess.run(reset)`),
    by its initializer run again (`variables_initializer([state])`) or by a sliced assign of
    a row (`state[0].assign(state[0] * 0.5)`); `programs/carried_state.py --reset-every`.
    Cut at step 2, before the reset: restarted, the copy reads step 2 and resets, but the
    shim took the initializer for an overwrite of restored state and restored again over
    it (the reset undone); the sliced assign was taken to change nothing, so the cut came
    after it and the copy halved the row twice. Both ended with other weights."""
    def build() -> tuple[Any, ...]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        state = tf.compat.v1.get_variable("state", initializer=tf.ones([2, 3]), trainable=False)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        h = tf.tanh(state * w + 1.0)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(h), global_step=gs)
        with tf.control_dependencies([train]):
            train = state.assign(h)
        again = tf.compat.v1.variables_initializer([state]) if reset == "init" else \
            state[0].assign(state[0] * 0.5)
        return gs, w, train, again

    def loop(sess: Any, gs: Any, train: Any, again: Any, until: int) -> None:
        step = int(sess.run(gs))
        while step < until:
            if step % 2 == 0 and step:
                sess.run(again)
            sess.run(train)
            step = int(sess.run(gs))

    with tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train, again = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, again, 4)
        expected = sess.run(w)
    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train, again = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, again, 2)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        loop(sess, gs, train, again, 3)
    assert acks(source)[-1].ok and acks(source)[-1].step == 2
    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train, again = build()
        sess.run(tf.compat.v1.global_variables_initializer())  # the restore point
        loop(sess, gs, train, again, 4)
        np.testing.assert_array_equal(sess.run(w), expected)


def test_a_batch_staged_in_variables_after_the_step_is_read_is_not_restored_over(
        tmp_path: Path) -> None:
    """`step = sess.run(gs); sess.run(batch_var.assign(x), {x: batch(step)});
    sess.run(train)` (the training run reads the batch from the variable). Restarted, the
    shim took that load for an overwrite of restored state and restored again right before
    the first training run: the checkpoint's batch (the previous step's) replaced the one
    the program had just staged, and a migrated job ended with other weights. A load of
    non-trainable variables made after the program read the restored step is left alone;
    a trainable weight loaded there is still restored again."""
    def build() -> tuple[Any, ...]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        staged = tf.Variable(tf.zeros([3]), trainable=False, name="staged")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * staged), global_step=gs)
        return gs, x, staged.assign(x), w, w.assign(x), train

    def batch(step: int) -> np.ndarray:
        return np.full(3, step + 1, np.float32)

    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, x, stage, _, _, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        for _ in range(3):
            step = int(sess.run(gs))
            sess.run(stage, {x: batch(step)})
            sess.run(train)
    assert acks(source)[-1].ok and acks(source)[-1].step == 1

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, x, stage, w, load_w, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())  # the restore point
        step = int(sess.run(gs))
        assert step == 1
        sess.run(stage, {x: batch(step)})
        before = sess.run(w)
        sess.run(train)
        # Trained on the batch of step 1 (2.0 each), not the checkpoint's of step 0 (1.0).
        np.testing.assert_array_equal(sess.run(w), before - np.float32(0.1) * batch(step))

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, x, stage, w, load_w, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(gs) == 1
        sess.run(load_w, {x: np.zeros(3, np.float32)})  # a pre-trained layer, after the read
        sess.run(train)
        # The checkpoint's weight (and staged batch) won over the load: restored again.
        np.testing.assert_array_equal(sess.run(w), before - np.float32(0.1) * batch(0))


def test_variables_initialised_in_pieces_make_the_restore_point(tmp_path: Path) -> None:
    """`sess.run(variables_initializer(model_vars)); sess.run(variables_initializer(
    opt_vars)); step = sess.run(gs)`: no one run initialises every global variable, so the
    session used to be bound only at its first training run. The program's read of the step
    before it was not its own (not migratable, "reads the global step only after its first
    training run"), and a restarted copy would have read the step before the restore. Now
    the run that completes the initialisation is the restore point."""
    def build() -> tuple[Any, ...]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        model = tf.compat.v1.global_variables()
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(w * w),
                                                              global_step=gs)
        opt = [v for v in tf.compat.v1.global_variables() if all(v is not m for m in model)]
        return (gs, train, tf.compat.v1.variables_initializer(model),
                tf.compat.v1.variables_initializer(opt))

    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, train, init_model, init_opt = build()
        sess.run(init_model)
        sess.run(init_opt)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        for _ in range(3):
            sess.run(gs)
            sess.run(train)
    assert source.migratable is True
    assert acks(source)[-1].ok and acks(source)[-1].step == 1

    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, train, init_model, init_opt = build()
        sess.run(init_model)
        sess.run(init_opt)  # the restore point
        assert sess.run(gs) == 1

    # The step read between the pieces, before the restore point: refused, saying so.
    with shimmed() as early, tf.Graph().as_default() as g, session(g) as sess:
        gs, train, init_model, init_opt = build()
        sess.run(init_model)
        sess.run(gs)
        sess.run(init_opt)
        for _ in range(3):
            sess.run(train)
            sess.run(gs)
    assert early.migratable is False
    assert "before it has initialised all its variables" in \
        early.channel.migratability[-1][1]  # type: ignore[union-attr]

    # Gradient accumulators initialised in the first piece and zeroed after each apply by
    # their initialiser run again: that reset is part of the step from the first one on.
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        acc = tf.Variable(tf.zeros([3]), trainable=False, name="acc")
        first = tf.compat.v1.variables_initializer([acc, w])
        add = acc.assign_add(tf.gradients(tf.reduce_sum(w * w), w)[0])
        apply = tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            [(acc.read_value(), w)], global_step=gs)
        zero = tf.compat.v1.variables_initializer([acc])
        sess.run(first)
        sess.run(tf.compat.v1.variables_initializer([gs]))  # the restore point
        for i in range(3):
            if i == 1:
                ctl.enqueue(Command("z", Kind.CHECKPOINT, str(tmp_path / "zeroed")))
            sess.run(gs)
            sess.run(add)
            sess.run(apply)
            sess.run(zero)
    assert acks(ctl)[-1].ok and acks(ctl)[-1].step == 1  # right after step 1's reset
    reader = tf.compat.v1.train.load_checkpoint(str(tmp_path / "zeroed" / "model"))
    assert reader.get_tensor("acc").tolist() == [0.0, 0.0, 0.0]


def test_an_update_after_the_step_first_made_behind_an_initialiser_is_learned(
        tmp_path: Path) -> None:
    """`if step % 5 == 0: ckpt.save(prefix, session=sess)` with a
    `tf.compat.v1.train.Checkpoint`: its first save creates and initialises a save counter,
    then increments it, in runs after the step. The initialiser hid the increment from
    the shim, so it learned that the step ends with such an update only at the second
    save, and a checkpoint taken there lacked that increment (a migrated copy ended with
    another save counter). Now an initialiser in that place is looked through."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * w), global_step=gs)
        own = tf.compat.v1.train.Checkpoint(step=gs, w=w)
        sess.run(tf.compat.v1.global_variables_initializer())
        step, seen = int(sess.run(gs)), {}
        while step < 11:
            if step == 9:  # applied at the end of step 9 (or, without the fix, in step 10)
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            sess.run(train)
            step = int(sess.run(gs))
            if step % 5 == 0:
                own.save(str(tmp_path / "own" / "ck"), session=sess)
            if step >= 5:
                seen[step] = int(sess.run(own.save_counter))  # as a restarted copy resumes
        ack = acks(ctl)[0]
        assert ack.ok and ack.step in (9, 10)
    assert seen[9] == 1 and seen[10] == 2
    prefix = str(tmp_path / "ck" / "model")
    assert tf.train.load_variable(prefix, "save_counter") == seen[ack.step]


def test_random_ops_of_sampled_losses_and_augmentation_read_unsaved_input(
        controller: Controller) -> None:
    """The negative classes of `nce_loss` / `sampled_softmax_loss` (word2vec), Inception's
    random crop boxes and fractional pooling are drawn by generators inside their kernels,
    like dropout's: a restarted copy draws others. The shim used to take these runs as
    computed from the step, called such a program migratable, and a migrated word2vec job
    ended with other weights (`programs/sampled_loss.py`). A `tf.random.Generator` keeps
    its state in a variable the checkpoint holds: not unsaved input."""
    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([5, 4]))
        b = tf.compat.v1.get_variable("b", initializer=tf.zeros([5]))
        labels = tf.constant([[1], [3]], tf.int64)
        inputs = tf.ones([2, 4])
        image = tf.reshape(tf.range(4 * 4 * 1, dtype=tf.float32), [1, 4, 4, 1])

        def train(loss: Any) -> Any:
            return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                tf.reduce_sum(loss), global_step=gs)

        def sampled(sampler: Any, loss_fn: Any = tf.nn.nce_loss) -> Any:
            values = sampler(labels, 1, 2, True, 5, seed=1)
            return train(loss_fn(w, b, labels, inputs, num_sampled=2, num_classes=5,
                                 sampled_values=values))

        begin, size, _ = tf.image.sample_distorted_bounding_box(
            [4, 4, 1], tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=1,
            min_object_covered=0.1)
        crop = tf.slice(image[0], begin, size)
        pooled, _, _ = tf.nn.fractional_max_pool(image * tf.reduce_sum(w), [1.0, 1.5, 1.5, 1.0],
                                                 seed=1)
        runs = {
            "LogUniformCandidateSampler": sampled(tf.random.log_uniform_candidate_sampler),
            "UniformCandidateSampler": sampled(tf.random.uniform_candidate_sampler,
                                               tf.nn.sampled_softmax_loss),
            "LearnedUnigramCandidateSampler": sampled(
                tf.random.learned_unigram_candidate_sampler),
            "SampleDistortedBoundingBox": train(tf.reduce_sum(crop) * w),
            "FractionalMaxPool": train(pooled),
        }
        generator = tf.random.Generator.from_seed(1)
        from_generator = train(w * generator.normal([5, 4]))
    with session(g) as sess:
        adapter = sess._gandiva_chain.adapter
        for op, run in runs.items():
            assert adapter.classify(run).stateful_input.startswith(op), op
        assert not adapter.classify(from_generator).stateful_input


def test_accumulators_zeroed_by_their_initialiser_after_each_apply_are_part_of_the_step(
        tmp_path: Path) -> None:
    """Gradient accumulation whose accumulators are zeroed after each apply by running their
    initialiser again (`sess.run(tf.compat.v1.variables_initializer(accs))`, as often
    written): that run used to be taken for a one-time initialiser, so a checkpoint was
    taken between the apply and the reset, and a restored copy added its next micro-batches
    onto the old sums (other weights). Now an initialiser run again over variables it
    already initialised is a reset: the checkpoint waits for it and holds zeroed sums. A
    second optimizer's slots initialised once mid-training are still a one-time initialiser."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        acc = tf.compat.v1.get_variable("acc", initializer=tf.zeros([3, 2]), trainable=False)
        grad, = tf.gradients(tf.reduce_sum(tf.tanh(tf.matmul(x, w))), [w])
        accumulate = acc.assign_add(grad)
        apply = tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            [(acc / 2, w)], global_step=gs)
        zero = tf.compat.v1.variables_initializer([acc])
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(4):
            if step == 2:
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            sess.run(accumulate)
            sess.run(accumulate)
            sess.run(apply)
            sess.run(zero)
            sess.run(gs)
        # Asked for between steps 2 and 3: applied at that cut, after step 2's reset (until
        # s51 the read after the reset ended the wait, and it waited for step 3's end).
        assert acks(ctl)[0].ok and acks(ctl)[0].step == 2, acks(ctl)[0]
    prefix = str(tmp_path / "ck" / "model")
    assert tf.train.load_variable(prefix, "global_step") == 2
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "acc"), np.zeros((3, 2)))


@pytest.mark.parametrize("again", ["all", "accumulators"])
def test_a_sweep_that_initialises_its_step_again_for_each_trial_is_not_migratable(
        again: str, tmp_path: Path) -> None:
    """A hyperparameter sweep in one job: for each learning rate,
    `sess.run(global_variables_initializer())`, then `while step < N` reading the step.
    It used to be migratable: a copy restarted in the second trial began at its first
    trial with the restored step and weights, trained that trial's rest on them, and
    reported other results for it (probed). Now a run that initialises the global step
    again after training makes the job not migratable, saying why; initialising other
    variables again (accumulators zeroed) does not."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        rate = tf.compat.v1.placeholder(tf.float32, [])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        acc = tf.compat.v1.get_variable("acc", initializer=tf.zeros([]), trainable=False)
        loss = tf.reduce_sum(tf.tanh(tf.matmul(x, w)))
        train = tf.group(tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=gs),
                         acc.assign_add(loss))
        init = tf.compat.v1.global_variables_initializer()
        reset = init if again == "all" else tf.compat.v1.variables_initializer([acc])
        sess.run(init)
        exited = None
        try:
            for trial in range(2):
                if trial:
                    sess.run(reset)
                while sess.run(gs) < 3 * (trial + 1 if again == "accumulators" else 1):
                    sess.run(train, {x: np.full((2, 3), trial + 1.0, np.float32), rate: 0.1 * (trial + 1)})
                if trial:
                    ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "ck")))
                    sess.run(train, {x: np.ones((2, 3), np.float32), rate: 0.1})
        except Exited as e:
            exited = e.code
        refused_or_migrated(ctl, exited, tmp_path / "ck",
                            "initialises its global step again after training" if again == "all" else "")


@pytest.mark.parametrize("draws", ["shuffle", "samples"])
def test_a_seeded_shuffle_in_a_run_of_its_own_once_an_epoch_is_not_migratable(
        draws: str, tmp_path: Path) -> None:
    """`order = sess.run(tf.random.shuffle(tf.range(n), seed=5))` at each epoch's start,
    the epoch's batches fed from it (`programs/epoch_shuffle.py --shuffle tf`): the op's
    sequence is in no checkpoint and a restarted copy draws the first epoch's order again.
    Only such runs before every step used to count, so the job was judged migratable and a
    copy migrated after a reshuffle, or at the first epoch's last step, ended with other
    weights. Now a run of its own that draws from a stateful random op and reads nothing of
    the model, after the restore point, makes the job not migratable, naming the op. Sample
    images drawn now and then through the model (noise into the generator) do not."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        out = tf.tanh(tf.matmul(x, w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(out), global_step=gs)
        permute = tf.random.shuffle(tf.range(4), seed=5)
        samples = tf.matmul(tf.random.normal([2, 3], seed=2), w)
        pool = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
        sess.run(tf.compat.v1.global_variables_initializer())
        ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "ck")))
        exited = None
        try:
            step = int(sess.run(gs))
            while step < 6:
                pos = step % 2
                if draws == "shuffle" and pos == 0:
                    order = sess.run(permute)
                elif draws == "samples" and pos == 0:
                    sess.run(samples)  # images to look at: the model's, not training data
                    order = np.arange(4)
                sess.run(train, {x: pool[order[2 * pos:2 * pos + 2]]})
                step = int(sess.run(gs))
        except Exited as e:
            exited = e.code
        ack = acks(ctl)[0]
        if draws == "samples":
            assert exited == EXIT_MIGRATED and ctl.migratable is True and ack.ok
        else:
            assert exited is None and ctl.migratable is False
            assert not ack.ok and "RandomShuffle" in ack.message, ack.message
            assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("loop", ["own_counter", "reads_step", "unfed"])
def test_a_monitored_loop_fed_from_its_own_counter_is_not_migratable(loop: str,
                                                                    tmp_path: Path) -> None:
    """`while not sess.should_stop(): sess.run(train, batch(i)); i += 1` under a
    StopAtStepHook: the hook reads the global step, the program never does and picks its
    mini-batches by a counter of its own. It used to be judged migratable (the hook's read
    was taken for the program's), and a restored copy fed its batches from the first one
    again: other weights. Now a program whose step only hooks read and whose training runs
    are fed other values at each step is not migratable; one that reads the step itself,
    or is fed nothing (its input computed in the graph), still is."""
    with shimmed() as ctl, tf.Graph().as_default():
        gs, x, train, pool = fed_graph()
        ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "ck")))
        exited = None
        try:
            with tf.compat.v1.train.MonitoredTrainingSession(
                    hooks=[tf.compat.v1.train.StopAtStepHook(last_step=6)],
                    save_checkpoint_secs=None, save_summaries_steps=None,
                    save_summaries_secs=None, log_step_count_steps=None) as mon:
                i = 0
                while not mon.should_stop():
                    if loop == "reads_step":
                        i = int(mon.run(gs))
                    mon.run(train, None if loop == "unfed" else {x: pool[i]})
                    i += 1
        except Exited as e:
            exited = e.code
        refused_or_migrated(ctl, exited, tmp_path / "ck",
                            "only its MonitoredSession's hooks" if loop == "own_counter" else "")


def test_moving_averages_updated_in_a_run_of_their_own_fed_the_steps_batch_end_the_step(
        tmp_path: Path) -> None:
    """Batch normalisation's moving averages updated after the training run in a run of
    their own, fed the same mini-batch (`sess.run(train, feed); sess.run(update_ops, feed)`,
    `programs/bn_updates.py --updates after`). A fed run after the training run used to be
    taken for the next step's start (the next micro-batch accumulated), so a checkpoint was
    taken between the two and a restored copy never made that update: other moving averages
    after a migration. Now a run fed the very values the training run was fed ends the step:
    the checkpoint holds the update. One fed the next mini-batch still begins the next step."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        h = tf.matmul(x, w)
        mean, _ = tf.nn.moments(h, [0])
        moving = tf.compat.v1.get_variable("moving_mean", initializer=tf.zeros([2]),
                                           trainable=False)
        update = moving.assign(moving * 0.5 + mean * 0.5)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.tanh(h - mean)), global_step=gs)
        pool = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 2, 3)
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(gs))
        while step < 4:
            if step == 2:
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            feed = {x: pool[step]}
            sess.run(train, feed)
            sess.run(update, feed)
            if step == 2:
                expected = sess.run(moving)
            step = int(sess.run(gs))
        assert acks(ctl)[0].ok and acks(ctl)[0].step == 3, acks(ctl)[0]
    np.testing.assert_array_equal(
        tf.train.load_variable(str(tmp_path / "ck" / "model"), "moving_mean"), expected)


@pytest.mark.parametrize("state", ["table", "generator"])
def test_a_table_or_a_generator_changed_in_a_run_of_its_own_before_training_begins_the_step(
        state: str, tmp_path: Path) -> None:
    """State the checkpoint holds that changes by other ops than assignments, in a run of
    its own before each training run: a MutableHashTable counting the ids of the mini-batch
    it is fed (`sess.run(table.insert(...), feed)`, `programs/tables.py --update before`),
    or noise drawn from a `tf.random.Generator`, whose draws advance its state variable
    (`z = sess.run(gen.normal(...))`, then fed to training; `programs/rng_generator.py`).
    Such a run was taken to change nothing, so a checkpoint asked for at step 2 was taken
    after the next step's run of it: a restored copy, reading step 3, counted that
    mini-batch twice or drew the next noise (other weights after any migration). Now the
    checkpoint is taken before it, as it holds the state when the program read the step."""
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 2]))
        if state == "table":
            table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, 0.0,
                                                            name="seen")
            key = tf.constant([0], tf.int64)
            before = table.insert(key, table.lookup(key) + tf.reduce_sum(x[:1, :1] * 0 + 1))
            held = table.lookup(key)
        else:
            gen = tf.random.Generator.from_seed(7)
            before = gen.normal([2, 3])
            held = gen.state
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.tanh(tf.matmul(x, w))), global_step=gs)
        pool = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 2, 3)
        sess.run(tf.compat.v1.global_variables_initializer())
        step = int(sess.run(gs))
        while step < 4:
            feed = {x: pool[step]}
            if state == "table":
                sess.run(before, feed)
            else:
                feed = {x: pool[step] + sess.run(before)}
            if step == 2:
                ctl.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
            sess.run(train, feed)
            if step == 2:
                expected = sess.run(held)
            step = int(sess.run(gs))
        assert acks(ctl)[0].ok and acks(ctl)[0].step == 3, acks(ctl)[0]
    if state == "table":
        values = tf.train.load_variable(str(tmp_path / "ck" / "tables"), "seen-values")
        assert list(values) == list(expected) == [3.0]  # steps 0, 1 and 2, not 3
    else:
        np.testing.assert_array_equal(
            tf.train.load_variable(str(tmp_path / "ck" / "model"), "random_generator/StateVar"),
            expected)


def test_a_warm_process_whose_training_run_takes_from_an_accumulator_holds_unrehearsed(
        tmp_path: Path) -> None:
    """Gradient accumulation through `ConditionalAccumulator`: micro-batch runs apply
    gradients, the training run takes their mean (`take_grad(2)`) and advances the step.
    A pre-warmed destination rehearsing that run from the source's signature found its
    accumulator empty and blocked in the take for good (never ready, the pre-warm timed
    out). Now it holds without a rehearsal, and after activation trains on normally."""
    import json

    g = tf.Graph()
    with g.as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        x = tf.compat.v1.placeholder(tf.float32, [3])
        grad = tf.gradients(tf.reduce_sum(w * x), w)[0]
        acc = tf.compat.v1.ConditionalAccumulator(tf.float32, shape=[3])
        apply_grad = acc.apply_grad(grad, local_step=gs)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            [(acc.take_grad(2), w)], global_step=gs)
        init = tf.compat.v1.global_variables_initializer()
    control_r, control_w = os.pipe()
    os.write(control_w, b'{"cmd": "activate"}\n')  # read once it holds
    signature = json.dumps({"fetches": [train.name], "feeds": {}, "options": ""})
    ctl = Controller(Settings(job_id="t", warm=True, warm_step=True, control_fd=control_r,
                              warm_signature=signature),
                     channel=FakeChannel(), exit_fn=lambda code: None)
    shim.install(ctl)
    done: list[Any] = []

    def program() -> None:
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            step = sess.run(gs)  # the warm process holds before this read
            while step < 2:
                for i in range(2):
                    sess.run(apply_grad, {x: np.full(3, step * 2 + i + 1, np.float32)})
                sess.run(train)
                step = sess.run(gs)
            done.append(sess.run(w))

    try:
        t = threading.Thread(target=program, daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "the warm process blocked in its rehearsal"
    finally:
        shim.uninstall()
        os.close(control_w)
    # Two steps of the mean gradient: 1 - 0.1 * (1.5 + 3.5) = 0.5.
    assert done and done[0].tolist() == pytest.approx([0.5] * 3)


def test_a_warm_process_holds_in_the_training_graph_not_in_a_step_before_it(
        tmp_path: Path) -> None:
    """A job whose command runs a preprocessing step with TensorFlow first (its own
    session, a non-trainable variable of its own, no global step), then the trainer: in
    a pre-warmed launch the preprocessing session used to hold, be activated and have the
    checkpoint restored into it, and the trainer read its own step 0 (other data). Now the
    hold is in the first session bound whose graph has a global step."""
    import json

    g, gs, train, init, _ = trainable_graph(1)
    with shimmed(), session(g) as sess:
        saved_after_one_step(sess, init, train, tmp_path / "ck")
    prep = tf.Graph()
    with prep.as_default():
        d = tf.compat.v1.placeholder(tf.float32, [None])
        total = tf.compat.v1.get_variable("total", initializer=0.0, trainable=False)
        add = total.assign_add(tf.reduce_sum(d))
        prep_init = tf.compat.v1.global_variables_initializer()
    control_r, control_w = os.pipe()
    os.write(control_w, json.dumps({"cmd": "activate", "restore_checkpoint": str(tmp_path / "ck")})
             .encode() + b"\n")
    ctl = Controller(Settings(job_id="t", warm=True, warm_step=True, control_fd=control_r),
                     channel=FakeChannel(), exit_fn=lambda code: None)
    shim.install(ctl)
    try:
        with tf.compat.v1.Session(graph=prep) as sess:
            sess.run(prep_init)
            assert sess.run(add, {d: [1.0, 2.0]}) == 3.0  # no hold, no restore here
        with session(g) as sess:
            sess.run(init)
            assert sess.run(gs) == 1  # held before this read, restored: the checkpoint's step
            sess.run(train)
            assert sess.run(gs) == 2
    finally:
        shim.uninstall()
        os.close(control_w)


@pytest.mark.parametrize("kind", ["counter", "method", "stateless"])
def test_a_py_func_that_keeps_state_of_its_own_between_steps_is_not_migratable(
        kind: str, tmp_path: Path) -> None:
    """`tf.numpy_function(aug, [x], ...)` in the training run, `aug` changing state of its
    own at every call (a call counter in a module-level dict; a running mean kept on the
    object whose method it is): a restarted copy starts it over, so a migrated job trained
    on other data while the shim judged it migratable. Now it is not migratable, naming the
    function; a function that keeps nothing (`stateless`) stays migratable."""
    calls = {"n": 0}

    class Normaliser:
        def __init__(self) -> None:
            self.mean = np.zeros(3, np.float32)

        def __call__(self, xb: Any) -> Any:
            return xb

        def apply(self, xb: Any) -> Any:
            self.mean = 0.9 * self.mean + 0.1 * xb
            return (xb - self.mean).astype(np.float32)

    def count(xb: Any) -> Any:
        calls["n"] += 1
        return (xb * (1.0 + 0.01 * calls["n"])).astype(np.float32)

    def scale(xb: Any) -> Any:
        return (xb * 2.0).astype(np.float32)

    fn = {"counter": count, "method": Normaliser().apply, "stateless": scale}[kind]
    with shimmed() as ctl, tf.Graph().as_default() as g, session(g) as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [3])
        xa = tf.numpy_function(fn, [x], tf.float32)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * xa), global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / kind)))
        exited = None
        try:
            for _ in range(4):
                step = sess.run(gs)
                sess.run(train, {x: np.full(3, step + 1.0, np.float32)})
        except Exited as e:
            exited = e.code
        ack = acks(ctl)[0]
        if kind == "stateless":
            assert exited == EXIT_MIGRATED and ctl.migratable is True and ack.ok
            return
        assert exited is None and ctl.migratable is False and not ack.ok
        reason = ctl.channel.migratability[-1][1]  # type: ignore[union-attr]
        name = {"counter": "count (calls)", "method": "Normaliser.apply (self)"}[kind]
        assert name in reason and "py_func/numpy_function" in reason, reason


@pytest.mark.parametrize("kind", ["resource", "ref"])
def test_a_variable_whose_shape_grows_is_saved_and_restored(kind: str, tmp_path: Path) -> None:
    """`tf.compat.v1.Variable(..., validate_shape=False)` (a resource one made with
    `shape=tf.TensorShape(None)`) whose shape grows: a loss history, one entry appended by
    the training run each step (`tf.concat`), its mean weighting the loss. The shim's
    checkpointer read every variable's shape as a list and raised on its unknown shape
    inside the program's first training run, ending the program (probed: the job died at
    its first step under `gandiva-submit`); a restore assigned the saved (longer) value with
    the shape checked. Now saved, restored into a copy whose own history is shorter, and the
    copy ends as an uninterrupted run does."""
    def build() -> tuple[Any, ...]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        own = {} if kind == "ref" else {"shape": tf.TensorShape(None)}
        hist = tf.compat.v1.Variable(np.zeros(1, np.float32), validate_shape=False,
                                     trainable=False, name="history",
                                     use_resource=kind == "resource", **own)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
        loss = tf.reduce_sum(w * w) * (1.0 + 0.1 * tf.reduce_mean(hist))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        with tf.control_dependencies([train]):
            longer = tf.concat([tf.identity(hist), tf.reshape(loss, [1])], 0)
            train = tf.compat.v1.assign(hist, longer, validate_shape=False)
        return gs, w, hist, train

    def loop(sess: Any, gs: Any, train: Any, until: int) -> None:
        while sess.run(gs) < until:
            sess.run(train)

    with tf.Graph().as_default() as g, session(g) as sess:
        gs, w, hist, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, 4)
        expected = sess.run([w, hist])
    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, w, hist, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, 2)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        loop(sess, gs, train, 3)
    assert acks(source)[-1].ok and acks(source)[-1].step == 2, acks(source)[-1].message
    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, w, hist, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, 4)
        got = sess.run([w, hist])
    assert got[1].shape == (5,)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_a_warm_start_file_deleted_after_initialising_is_not_needed_by_a_restored_copy(
        tmp_path: Path) -> None:
    """`init_from_checkpoint(pre, {"backbone/": "backbone/"})` of a pre-trained checkpoint the
    program deletes once its variables are initialised (a staged download, a scratch copy);
    fine-tuned from the step read. Migrated (probed: `programs/warm_deleted` naive at step 3),
    the restarted copy died building its graph (`NotFoundError: Unsuccessful
    TensorSliceReader constructor: Failed to find any matching files for .../pre`), the job
    lost though the shim's restore overwrites every variable the warm start sets. Now a
    copy that restores (restarted or pre-warmed) skips a warm start whose checkpoint is gone,
    saying so, and ends as the uninterrupted run; without a restore pending the program's
    own error is unchanged."""
    pre = tmp_path / "pre"
    with tf.Graph().as_default() as g, session(g) as sess:
        bb = tf.compat.v1.get_variable("backbone/w", initializer=tf.fill([3], 0.5))
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver([bb]).save(sess, str(pre / "model"))

    def build() -> tuple[Any, Any, Any]:
        gs = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable("backbone/w", initializer=tf.ones([3]))
        tf.compat.v1.train.init_from_checkpoint(str(pre), {"backbone/": "backbone/"})
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(w * w * tf.cast(gs + 1, tf.float32)), global_step=gs)
        return gs, w, train

    def loop(sess: Any, gs: Any, train: Any, until: int) -> None:
        while sess.run(gs) < until:
            sess.run(train)

    with tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, 4)
        expected = sess.run(w)
    with shimmed() as source, tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        shutil.rmtree(pre)  # the program's cleanup
        loop(sess, gs, train, 2)
        source.enqueue(Command("c", Kind.CHECKPOINT, str(tmp_path / "ck")))
        loop(sess, gs, train, 3)
    assert acks(source)[-1].ok and acks(source)[-1].step == 2
    with shimmed(), tf.Graph().as_default(), pytest.raises((ValueError, tf.errors.NotFoundError)):
        build()  # nothing to restore: the program's own error
    with shimmed(tmp_path / "ck"), tf.Graph().as_default() as g, session(g) as sess:
        gs, w, train = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        loop(sess, gs, train, 4)
        np.testing.assert_array_equal(sess.run(w), expected)
