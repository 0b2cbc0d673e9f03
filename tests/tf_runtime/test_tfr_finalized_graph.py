"""The shim's ops rebuilt in a graph that MonitoredTrainingSession has finalized."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tf_runtime.checkpoint import validate
from tf_runtime.commands import Command, Kind

from .test_tfr_tf_session import acks, shimmed

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1


def test_a_checkpoint_of_differing_tower_copies_in_a_finalized_graph_does_not_hang(
        tmp_path: Path) -> None:
    """Two towers (`tower_0/`, `tower_1/`) whose copies of `b` hold different values, trained
    under MonitoredTrainingSession (its graph finalized): the first checkpoint finds the
    copies differ and rebuilds the saver to save them one by one, the graph briefly
    unfinalized. Re-finalizing it ran the shim's Graph.finalize, which waited on the lock
    its own thread held: the training thread hung at that boundary for good (the job never
    acked, never trained again). Now the checkpoint is taken and holds both copies."""
    g = tf.Graph()
    with g.as_default():
        gs = v1.train.get_or_create_global_step()
        losses = []
        for i in range(2):
            with v1.variable_scope(f"tower_{i}"):
                w = v1.get_variable("w", initializer=np.ones((3, 1), np.float32))
                b = v1.get_variable("b", initializer=np.full((1,), float(i), np.float32))
                losses.append(tf.reduce_sum(tf.matmul(tf.ones([2, 3]), w) + b))
        train = v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.add_n(losses), global_step=gs)
    ck = tmp_path / "ck"
    done: list[int] = []

    def program() -> None:
        with shimmed() as ctl, g.as_default(), v1.train.MonitoredTrainingSession(
                hooks=[v1.train.StopAtStepHook(last_step=4)], save_checkpoint_secs=None,
                save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None) as sess:
            step = sess.run(gs)
            ctl.enqueue(Command("c", Kind.CHECKPOINT, str(ck)))
            while not sess.should_stop():
                sess.run(train)
                if not sess.should_stop():
                    step = sess.run(gs)
            done.append(int(step))
            done.append(int(acks(ctl)[0].ok))

    thread = threading.Thread(target=program, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the training thread hung at the checkpoint"
    assert done == [3, 1], done
    assert set(validate(ck)["split"]) == {"b"}
