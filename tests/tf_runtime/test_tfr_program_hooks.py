"""Real TensorFlow in process: a MonitoredSession fed by a SessionRunHook of the
program's own (`programs/user_hooks.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tf_runtime.commands import Command, Kind
from tf_runtime.testing import Exited

from .test_tfr_tf_session import fed_graph, refused_or_migrated, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("feeder", ["input_hook", "program_counter"])
def test_a_hook_of_the_programs_own_that_reads_the_step_and_feeds_it_is_migratable(
        feeder: str, tmp_path: Path) -> None:
    """`input_hook`: the program's own hook reads the global step in
    `after_create_session`, feeds each step's mini-batch through `before_run`'s
    `SessionRunArgs(feed_dict=...)` and counts on in `after_run`; the loop is only
    `while not sess.should_stop(): sess.run(train)`. Its read was taken for TensorFlow's
    StopAtStepHook's, and the job refused for feeding "a counter of its own" (through the
    real CLI: "cannot resume from a checkpoint"), though a restored copy's hook reads the
    restored step: now it migrates. `program_counter`: the same hook reads the step only
    to stop at a step, and the program feeds its mini-batches by a counter of its own in
    its `run` call: still refused."""
    with shimmed() as ctl, tf.Graph().as_default():
        gs, x, train, pool = fed_graph()

        class StepHook(tf.compat.v1.train.SessionRunHook):
            def after_create_session(self, session: Any, coord: Any) -> None:
                self.step = int(session.run(gs))

            def before_run(self, run_context: Any) -> Any:
                if feeder == "input_hook":
                    return tf.compat.v1.train.SessionRunArgs(None, feed_dict={x: pool[self.step]})
                return None

            def after_run(self, run_context: Any, run_values: Any) -> None:
                self.step += 1
                if self.step >= 6:
                    run_context.request_stop()

        ctl.enqueue(Command("m", Kind.STOP_FOR_MIGRATION, str(tmp_path / "ck")))
        exited = None
        try:
            with tf.compat.v1.train.MonitoredSession(
                    session_creator=tf.compat.v1.train.ChiefSessionCreator(),
                    hooks=[StepHook()]) as mon:
                i = 0
                while not mon.should_stop():
                    mon.run(train, None if feeder == "input_hook" else {x: pool[i]})
                    i += 1
        except Exited as e:
            exited = e.code
        refused_or_migrated(ctl, exited, tmp_path / "ck",
                            "only its MonitoredSession's hooks" if feeder == "program_counter" else "")
