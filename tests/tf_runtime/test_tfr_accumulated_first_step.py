"""Real TensorFlow in process: gradient accumulation in runs of their own (a micro-batch's
gradients added to non-trainable sums and a micro-step counter, `sess.run(accumulate,
feed)`, then every 4th micro-batch `sess.run(apply)` advancing the global step and
`sess.run(zero)`), the loop picking its micro-batch by the counter it reads, with a
suspension queued before its first training run (a job placed into a time-slice group is
suspended as soon as its shim connects) and a checkpoint served while it is suspended."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind

from .test_tfr_step_families import _accumulation
from .test_tfr_tf_session import acks, session, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")


def _job(restore: Path | None, checkpoint: Path | None) -> tuple[dict[str, Any], list[Any]]:
    """One process to global step 3; with `checkpoint`, SUSPEND, CHECKPOINT and RESUME are
    queued right after initialising. Returns its variables and its acks."""
    with shimmed(restore) as ctl, tf.Graph().as_default() as g, session(g) as sess:
        ops = _accumulation("accumulate_micro_step")  # the step advances on the apply only
        gs, x, micro, accumulate, apply, zero = (ops[k] for k in ("gs", "x", "micro", "accumulate", "apply", "zero"))
        sess.run(tf.compat.v1.global_variables_initializer())
        if checkpoint is not None:
            for cmd in (Command("s", Kind.SUSPEND), Command("c", Kind.CHECKPOINT, str(checkpoint)),
                        Command("r", Kind.RESUME)):
                ctl.enqueue(cmd)
        step = int(sess.run(gs))
        while step < 3:
            m = int(sess.run(micro))
            sess.run(accumulate, {x: np.sin(np.arange(12, dtype=np.float32) + m).reshape(4, 3)})
            if (m + 1) % 4 == 0:
                sess.run(apply)
                sess.run(zero)
            step = int(sess.run(gs))
        variables = tf.compat.v1.global_variables()
        return dict(zip([v.op.name for v in variables], sess.run(variables), strict=True)), \
            acks(ctl)


def test_a_step_begun_by_accumulating_runs_is_not_suspended_within(tmp_path: Path) -> None:
    """The suspension queued before the first training run was applied right before it,
    after the step's four accumulating runs, and the checkpoint served while suspended held
    their sums and the counter at 4 without the apply: a copy restored from it read micro-step
    4 at the top of its loop, never applied the first sums, and ended with other weights (w,
    micro, Adam's slots). Now a step begun by runs that change the training state is not
    held within: its commands wait for the step's end (step 1)."""
    reference, _ = _job(None, None)
    uninterrupted, done = _job(None, tmp_path / "ck")
    assert [(a.command_id, a.ok) for a in done] == [("s", True), ("c", True), ("r", True)]
    assert done[1].step == 1
    restored, _ = _job(tmp_path / "ck", None)
    for name, value in reference.items():
        np.testing.assert_array_equal(uninterrupted[name], value, err_msg=name)
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_a_step_begun_by_accumulating_runs_logs_no_suspension_when_none_is_queued(
        caplog: pytest.LogCaptureFixture) -> None:
    """With no command queued, the first training run of such a program says nothing of a
    suspension. Before, every start of it logged "not suspended before the first training
    run ... commands wait for its end", as if a SUSPEND had been asked."""
    with caplog.at_level(logging.INFO, logger="tf_runtime.controller"):
        _job(None, None)
    assert "suspended" not in caplog.text
