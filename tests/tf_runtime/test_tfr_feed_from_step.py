"""Programs that feed each mini-batch from the global step they read into Python.

`tf_runtime/examples/feed_step.py` reads the global step right after
initialisation and computes every feed from it, in a plain Session loop and a
MonitoredTrainingSession loop, with Momentum or Adam (slot variables), on 1 or 2
replicated towers. Each journey below interrupts one job in every way the runtime
offers (suspend/resume, checkpoint, stop for migration to a pre-warmed process
with and without the rehearsed first step, a cold restart from the checkpoint, a
kill and a restart from the last periodic checkpoint) and checks that the final
variables are bit-identical to an uninterrupted run of the same program.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import FEED_SCRIPT, FeedJob, assert_same_variables, feed_args

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# Both loop styles, both optimizers, both tower counts (the finding's own program, session +
# Momentum + 2 towers, is the regression test below; the property test draws the rest).
FAMILY = [("session", "adam", 2), ("mts", "momentum", 1)]


@pytest.mark.parametrize("loop,optimizer,replicas", FAMILY)
def test_every_interruption_keeps_the_result(loop: str, optimizer: str, replicas: int,
                                             runtime_server: Any, launch: Any,
                                             tmp_path: Path) -> None:
    args = feed_args(loop, optimizer, replicas)
    baseline = launch(FEED_SCRIPT, *args, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, f"fs-{loop}-{optimizer}-{replicas}", args,
                  tmp_path / "run.npz", tmp_path)
    job.start()
    job.pause(0.1)
    job.checkpoint()                      # while suspended
    job.pause(0.1)
    a1 = job.migrate_warm()               # pre-warmed, first step rehearsed (the default)
    job.pause(0.1)
    a2 = job.migrate_warm(rehearse=False)  # pre-warmed, GANDIVA_WARM_STEP=0
    assert a2.step > a1.step
    job.pause(0.1)
    job.migrate_naive()                   # stop, cold start, restore
    job.pause(0.1)
    job.checkpoint()
    job.pause(0.1)
    job.crash_and_restart()               # host lost: back to the last checkpoint
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
    with np.load(tmp_path / "run.npz") as data:
        assert int(data["global_step:0"]) == 60


@pytest.mark.parametrize("signature", [True, False])
def test_rehearsal_never_runs_a_feed_computed_before_the_restore(signature: bool,
                                                                 runtime_server: Any,
                                                                 launch: Any,
                                                                 tmp_path: Path) -> None:
    """The finding of issue 9: with the rehearsal on, the held first run used to execute
    after the restore with the feed of the pre-restore step (0), so the migrated job
    trained one mini-batch on the wrong data and ended with different variables. Now
    the warm process holds before the program reads the step, and rehearses the
    source's signature (or nothing, without one)."""
    args = feed_args("session", "momentum", 2)
    baseline = launch(FEED_SCRIPT, *args, "--dump", str(tmp_path / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, "f1", args, tmp_path / "run.npz", tmp_path)
    job.start()
    job.pause(0.3)
    ack = job.migrate_warm(rehearse=True, signature=signature)
    assert ack.step > 0
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
