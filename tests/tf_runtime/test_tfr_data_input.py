"""tf.data input travels with the checkpoint: the position of every iterator a training run
reads (one-shot or initializable; range / from_tensor_slices, a seeded shuffle, repeat,
batch, map, prefetch) is saved with the variables and put back in the new copy, so a job
migrated naive or pre-warmed, or checkpointed, killed and restarted, ends bit-identical to
an uninterrupted run and trains on each mini-batch exactly once (`seen`, the sum of the
example ids trained on). A pipeline whose state TensorFlow cannot save (`from_generator`)
is still refused, with TensorFlow's reason.

In process (a fresh graph, session and controller stand for each process) for the family;
one end-to-end migration with real processes for the pre-warmed path."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tf_runtime.checkpoint import CheckpointError
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import EXIT_MIGRATED, Controller
from tf_runtime.testing import Exited

from .conftest import FeedJob, assert_same_variables
from .test_tfr_tf_session import shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1

N, STEPS = 40, 20  # 40 examples, batches of 8: an epoch is 5 steps
EPOCH_IDS = sum(range(N))
PROGRAM = Path(__file__).parent / "programs" / "data_input.py"


def build(source: str, iterator: str, loop: str, optimizer: str, cache: str = "",
          staged: bool = False) -> Any:
    """The graph of programs/data_input.py, built in a graph of its own (`cache`: the
    examples cached into that file first; `staged`: each batch put into a StagingArea by
    the training run and taken by the next one, the first put by a run of its own)."""
    g = tf.Graph()
    rng = np.random.RandomState(7)
    features = rng.standard_normal((N, 6)).astype(np.float32)
    labels = rng.randint(0, 3, size=N).astype(np.int64)
    ids = np.arange(N, dtype=np.int64)
    with g.as_default():
        v1.set_random_seed(1)
        gs = v1.train.get_or_create_global_step()
        fed = iterator == "init" and loop == "session"
        fx = v1.placeholder(tf.float32, [N, 6]) if fed else features
        if source == "slices":
            ds = tf.data.Dataset.from_tensor_slices((ids, fx, labels))
        elif source == "range":
            table, classes = tf.constant(features), tf.constant(labels)
            ds = tf.data.Dataset.range(N).map(
                lambda i: (i, tf.gather(table, i), tf.gather(classes, i)))
        else:
            ds = tf.data.Dataset.from_generator(
                lambda: ((i, features[i], labels[i]) for i in range(N)), output_signature=(
                    tf.TensorSpec([], tf.int64), tf.TensorSpec([6], tf.float32),
                    tf.TensorSpec([], tf.int64)))
        if cache:
            ds = ds.cache(cache)
        ds = ds.shuffle(N, seed=5).repeat().batch(8).map(lambda i, x, y: (i, x * 2.0, y))
        ds = ds.prefetch(2)
        handles: Any = None
        if iterator in ("oneshot", "feedable", "unfed", "identity"):
            it = v1.data.make_one_shot_iterator(ds)
        else:
            it = v1.data.make_initializable_iterator(ds)
            if loop == "mts":
                v1.add_to_collection(v1.GraphKeys.TABLE_INITIALIZERS, it.initializer)
        if iterator in ("feedable", "unfed", "identity"):
            # The programmer's guide's feedable iterator: one `from_string_handle` switched
            # between the training iterator and an evaluation one by the handle fed (`unfed`:
            # the handle computed in the graph instead, which names no iterator by itself;
            # `identity`: the handle fed passed through `tf.identity` first).
            val = v1.data.make_initializable_iterator(
                tf.data.Dataset.from_tensor_slices((ids[:12] * 0, features[:12], labels[:12])).batch(4))
            handle = it.string_handle() if iterator == "unfed" else v1.placeholder(tf.string, [])
            handles = SimpleNamespace(fed=handle, train=it.string_handle(),
                                      val=val.string_handle(), val_init=val.initializer)
            it = v1.data.Iterator.from_string_handle(
                tf.identity(handle) if iterator == "identity" else handle, v1.data.get_output_types(ds),
                                                     v1.data.get_output_shapes(ds))
        batch_ids, x, y = it.get_next()
        stage = None
        if staged:
            from tensorflow.python.ops.data_flow_ops import StagingArea

            area = StagingArea(dtypes=[tf.int64, tf.float32, tf.int64])
            stage = area.put([batch_ids, x, y])
            batch_ids, x, y = area.get()
        w = v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
            (6, 3)).astype(np.float32) * 0.3)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.matmul(x, w)))
        seen = v1.get_variable("seen", initializer=np.int64(0), trainable=False)
        opt = (v1.train.MomentumOptimizer(0.05, 0.9) if optimizer == "momentum"
               else v1.train.AdamOptimizer(0.01))
        train = tf.group(opt.minimize(loss, global_step=gs),
                         seen.assign_add(tf.reduce_sum(batch_ids)), *[stage] if staged else [])
        return SimpleNamespace(
            g=g, gs=gs, train=train, loop=loop, iterator=iterator, init=v1.global_variables_initializer(),
            it_init=it.initializer if fed else None, feed={fx: features} if fed else None,
            variables=v1.global_variables(), handles=handles, loss=loss, stage=stage)


def run(p: Any, restore: Path | None = None, command: Kind | None = None,
        directory: Path | None = None, at: int = -1, abandon: int = -1) -> dict[str, bytes] | None:
    """Train `p` to STEPS in a new process (restoring `restore`); before the training run
    of step `at` ask for `command` into `directory`; `abandon`: the process dies at that
    step (killed). The final variables, or None when the process ended before."""
    with shimmed(restore) as ctl:  # one process's controller
        try:
            if p.loop == "session":
                with v1.Session(graph=p.g, config=v1.ConfigProto(
                        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)) as sess:
                    sess.run(p.init)
                    if p.it_init is not None:
                        sess.run(p.it_init, p.feed)
                    return _loop(ctl, sess, p, command, directory, at, abandon)
            final = Final(p.variables)
            with p.g.as_default(), v1.train.MonitoredTrainingSession(
                    hooks=[v1.train.StopAtStepHook(last_step=STEPS), final],
                    config=v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=1),
                    save_checkpoint_secs=None, save_summaries_steps=None,
                    save_summaries_secs=None, log_step_count_steps=None) as sess:
                if _loop(ctl, sess, p, command, directory, at, abandon) is None:
                    return None
            return final.values
        except Exited as exc:
            assert exc.code == EXIT_MIGRATED
            return None
        finally:
            p.ctl = ctl


class Final(tf.compat.v1.train.SessionRunHook):
    """The variables' values when a MonitoredSession ends."""

    def __init__(self, variables: list[Any]) -> None:
        self.variables, self.values = variables, None

    def end(self, session: Any) -> None:
        self.values = _values(self.variables, session.run(self.variables))


def _values(variables: list[Any], values: list[Any]) -> dict[str, bytes]:
    return {v.name: np.asarray(x).tobytes() for v, x in zip(variables, values)}


def _loop(ctl: Controller, sess: Any, p: Any, command: Kind | None, directory: Path | None,
          at: int, abandon: int) -> dict[str, bytes] | None:
    """The program's loop: read the step, train until STEPS (or until a MonitoredSession's
    StopAtStepHook stops it); the final variables of a plain Session (a MonitoredSession's
    come from `Final`), {} for a MonitoredSession, None when abandoned."""
    monitored = p.loop == "mts"
    feed, h = None, p.handles
    if h is not None and p.iterator != "unfed":  # fetched once, fed to every run
        train_handle, val_handle = sess.run([h.train, h.val])
        feed = {h.fed: train_handle}
    step = sess.run(p.gs)
    if p.stage is not None:
        sess.run(p.stage)  # the first batch staged
    while not sess.should_stop() if monitored else step < STEPS:
        if step == abandon:
            return None
        if step == at and command is not None:
            ctl.enqueue(Command("c", command, str(directory)))
        sess.run(p.train, feed)
        if not monitored or not sess.should_stop():
            step = sess.run(p.gs)
        if feed is not None and step % 5 == 0 and not monitored:  # an evaluation through it
            sess.run(h.val_init)
            while True:
                try:
                    sess.run(p.loss, {h.fed: val_handle})
                except tf.errors.OutOfRangeError:
                    break
    return {} if monitored else _values(p.variables, sess.run(p.variables))


def acks(ctl: Controller) -> list[Any]:
    return ctl.channel.acks  # type: ignore[union-attr, no-any-return]


@pytest.mark.parametrize("source,iterator,loop,optimizer,how", [
    ("slices", "oneshot", "session", "momentum", "naive"),
    ("range", "init", "session", "adam", "kill"),
    ("slices", "init", "mts", "momentum", "naive"),
    ("range", "oneshot", "mts", "adam", "kill"),
    ("slices", "feedable", "session", "momentum", "naive"),
    pytest.param("range", "feedable", "mts", "adam", "kill", marks=pytest.mark.full),
    ("slices", "identity", "session", "adam", "kill")])
def test_a_job_reading_tf_data_restarts_bit_identical(
        source: str, iterator: str, loop: str, optimizer: str, how: str, tmp_path: Path) -> None:
    """Migrated naive (stopped at step 7) or checkpointed at step 7, trained on to step 12
    and killed, then restarted from the checkpoint: the same variables as an uninterrupted
    run, and every mini-batch trained once (the ids summed over 4 epochs). Before, such a
    job was not migratable (`IteratorGetNext`): a restarted copy read its pipeline from the
    beginning. `feedable`: read through `Iterator.from_string_handle`, the training
    iterator's handle fed to every training run and an evaluation iterator's every 5 steps
    (refused as unsaved input until s50; the handle fed names the iterator whose position
    is saved). `identity`: the handle fed through `tf.identity` into `from_string_handle`
    (until s51 taken for a handle computed in the graph: refused, "is not fed")."""
    base = run(build(source, iterator, loop, optimizer))
    assert base is not None
    assert np.frombuffer(base["seen:0"], np.int64)[0] == EPOCH_IDS * STEPS // 5
    ck = tmp_path / "ck"
    first = build(source, iterator, loop, optimizer)
    if how == "naive":
        assert run(first, command=Kind.STOP_FOR_MIGRATION, directory=ck, at=7) is None
    else:
        assert run(first, command=Kind.CHECKPOINT, directory=ck, at=7, abandon=12) is None
    ack = acks(first.ctl)[0]
    assert ack.ok and first.ctl.migratable is True, ack.message
    manifest = json.loads((ck / "gandiva.json").read_text())
    assert len(manifest["iterators"]) == 1, manifest
    again = build(source, iterator, loop, optimizer)
    assert run(again, restore=ck) == base
    assert again.ctl.restored_step == ack.step


@pytest.mark.parametrize("source,iterator,reason", [
    ("generator", "oneshot", "cannot be saved: PyFunc is stateful"),
    ("cache", "oneshot", "cannot be saved: it caches into a file"),
    ("generator", "feedable", "cannot be saved: PyFunc is stateful")])
def test_a_pipeline_whose_position_cannot_be_saved_is_still_refused_with_the_reason(
        source: str, iterator: str, reason: str, tmp_path: Path) -> None:
    """`Dataset.from_generator` keeps its position in a Python generator, which TensorFlow
    cannot save (its reason); `.cache(filename)` is saved by TensorFlow, but a restored copy
    needs the cache files and lockfile as the source left them (after a kill, probed: the
    restarted copy failed, "There appears to be a concurrent caching iterator running").
    The job is not migratable, the stop for migration is refused naming the iterator read
    and the reason, and the job trains on to its end; so is one read through a feedable
    iterator fed its handle."""
    p = build("slices" if source == "cache" else source, iterator, "session", "momentum",
              cache=str(tmp_path / "cache") if source == "cache" else "")
    assert run(p, command=Kind.STOP_FOR_MIGRATION, directory=tmp_path / "ck", at=4) is not None
    ack = acks(p.ctl)[0]
    assert not ack.ok and p.ctl.migratable is False
    assert "not migratable" in ack.message and "IteratorGetNext" in ack.message, ack.message
    assert reason in ack.message, ack.message
    assert not (tmp_path / "ck").exists()


def test_a_feedable_iterator_whose_handle_is_not_fed_is_refused_naming_it(tmp_path: Path) -> None:
    """A feedable iterator whose handle is computed in the graph, not fed: which iterator it
    reads is not known from the run, so the job stays not migratable, the reason naming the
    feedable iterator and its handle; it trains on to its end."""
    p = build("slices", "unfed", "session", "momentum")
    assert run(p, command=Kind.STOP_FOR_MIGRATION, directory=tmp_path / "ck", at=4) is not None
    ack = acks(p.ctl)[0]
    assert not ack.ok and p.ctl.migratable is False
    assert "of a feedable iterator" in ack.message and "is not fed" in ack.message, ack.message


def test_a_batch_staged_ahead_from_an_iterator_is_refused_naming_the_staging_area(
        tmp_path: Path) -> None:
    """Input staged one step ahead in a StagingArea (tf_cnn_benchmarks' shape): each
    training run takes the staged batch and puts the iterator's next one. The iterator's
    saved position is past the staged batch, which no checkpoint holds, so a restored copy
    staged the batch after it and skipped one: migrated naive, other weights (probed s50,
    programs/staging_area.py). Now not migratable, naming the take and its input; the job
    trains on. (Staged from a feed of the step read, programs/staging_area.py --source
    feed, it stays migratable: live kind `staging_feed`, GANDIVA_FULL_TESTS=1.)"""
    p = build("slices", "oneshot", "session", "momentum", staged=True)
    assert run(p, command=Kind.STOP_FOR_MIGRATION, directory=tmp_path / "ck", at=4) is not None
    ack = acks(p.ctl)[0]
    assert not ack.ok and p.ctl.migratable is False
    assert "Unstage op" in ack.message and "staged ahead" in ack.message, ack.message
    assert "IteratorGetNext" in ack.message, ack.message


def test_a_damaged_iterator_position_is_refused_before_anything_is_restored(
        tmp_path: Path) -> None:
    """A checkpoint whose iterator file changed after it was written (sizes intact) is
    refused as damaged, like a variable's file."""
    p = build("slices", "oneshot", "session", "momentum")
    ck = tmp_path / "ck"
    run(p, command=Kind.CHECKPOINT, directory=ck, at=3, abandon=5)
    state = ck / json.loads((ck / "gandiva.json").read_text())["iterators"][
        "OneShotIterator"]["file"]
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged"):
        run(build("slices", "oneshot", "session", "momentum"), restore=ck)


def _cycles(own: Path, restore: Path | None = None, at: int = -1) -> dict[str, bytes] | None:
    """tf.estimator's train_and_evaluate by hand (probed s45 as estimator_cycles.py): cycles of 4 steps to 8, each building data_input's graph anew in a session of its
    own that restores the program's own latest checkpoint and saves one at its end; a stop
    for migration into `own`/ck asked before the training run of step `at`. The final
    variables, or None when stopped."""
    with shimmed(restore) as ctl:
        try:
            while (step := int((tf.train.latest_checkpoint(str(own)) or "-0").rsplit("-", 1)[1])) < 8:
                p = build("slices", "oneshot", "session", "adam")
                with p.g.as_default():
                    saver = v1.train.Saver()
                with v1.Session(graph=p.g) as sess:
                    sess.run(p.init)
                    if step:
                        saver.restore(sess, str(own / f"m-{step}"))
                    while (now := int(sess.run(p.gs))) < step // 4 * 4 + 4:
                        if now == at:
                            ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(own / "ck")))
                        sess.run(p.train)
                    saver.save(sess, str(own / "m"), global_step=now)
                    values = _values(p.variables, sess.run(p.variables))
            return values
        except Exited as exc:
            assert exc.code == EXIT_MIGRATED
            return None


def test_a_pipeline_built_again_in_a_later_session_travels_with_the_checkpoint(
        tmp_path: Path) -> None:
    """A program that trains in turns, a new graph and session each (Estimator-style
    cycles), the same tf.data pipeline in each: migrated in its second session at step 6
    and restarted, it ends bit-identical to an uninterrupted run. Before, the second
    session's iterator, named as the first's, was taken as already checked and left out of
    every checkpoint: the restarted copy read that cycle's pipeline from its beginning (other
    weights; probed through the real CLI)."""
    (tmp_path / "base").mkdir()
    (tmp_path / "run").mkdir()
    base = _cycles(tmp_path / "base")
    assert _cycles(tmp_path / "run", at=6) is None
    manifest = json.loads((tmp_path / "run" / "ck" / "gandiva.json").read_text())
    assert len(manifest["iterators"]) == 1, manifest
    assert _cycles(tmp_path / "run", restore=tmp_path / "run" / "ck") == base


@pytest.mark.slow
def test_a_tf_data_job_migrated_pre_warmed_ends_bit_identical(
        runtime_server: Any, launch: Any, tmp_path: Path) -> None:
    """Real processes: data_input.py under MonitoredTrainingSession with an initializable
    iterator (run by the Scaffold's local_init_op) and Adam, suspended and migrated
    pre-warmed (the path no in-process test takes): bit-identical to an uninterrupted run,
    each mini-batch trained once."""
    flags = ["--source", "range", "--iterator", "init", "--loop", "mts", "--optimizer", "adam",
             "--steps", str(STEPS), "--step-sleep", "0.1"]
    baseline = launch(str(PROGRAM), *flags, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "data", flags, tmp_path / "run.npz", tmp_path,
                  script=str(PROGRAM))
    job.start()
    # The warm process holds before the Scaffold's local_init_op initialises the iterator:
    # it cannot rehearse a step that reads it.
    job.migrate_warm(rehearsed=False)
    job.pause(0.2)
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
    with np.load(tmp_path / "run.npz") as out:
        assert int(out["seen:0"]) == EPOCH_IDS * STEPS // 5
