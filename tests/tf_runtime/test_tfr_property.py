"""Property: whatever the runtime does to a job, it ends with the uninterrupted run's variables.

Hypothesis draws a program of the feed_step family (Session or MonitoredTrainingSession
loop, Momentum or Adam, 1, 2 or 4 towers; every feed computed from the global step the
program read) and a schedule of suspend/resume, checkpoint, migration (pre-warmed with
and without the rehearsal, and naive), grow and shrink (a pre-warmed migration onto
twice or half the devices, the towers staying fixed: tf_runtime.towers) and
restart-after-loss from the last checkpoint,
runs it on real processes under a real Runtime server, and compares the final variables
bit for bit with an uninterrupted run of the same program.

Each example starts several TensorFlow processes, so the example count is small for CI
(the schedules are drawn from a fixed seed); GANDIVA_PROPERTY_EXAMPLES=N draws N
random ones instead, for a longer local search.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import FEED_SCRIPT, FeedJob, assert_same_variables, feed_args

pytestmark = [pytest.mark.tf, pytest.mark.slow]

_EXAMPLES = int(os.environ.get("GANDIVA_PROPERTY_EXAMPLES", "0"))

PROGRAMS = st.tuples(st.sampled_from(["session", "mts"]), st.sampled_from(["momentum", "adam"]),
                     st.sampled_from([1, 2, 4]))
OPERATIONS = ["pause", "checkpoint", "migrate_warm", "migrate_warm_no_rehearsal",
              "migrate_naive", "crash_and_restart", "grow", "shrink"]
SCHEDULES = st.lists(st.sampled_from(OPERATIONS), min_size=1, max_size=3)


def apply(job: FeedJob, op: str) -> None:
    if op == "pause":
        job.pause(0.1)
    elif op == "checkpoint":
        job.checkpoint()
    elif op == "migrate_warm":
        job.migrate_warm()
    elif op == "migrate_warm_no_rehearsal":
        job.migrate_warm(rehearse=False)
    elif op == "migrate_naive":
        job.migrate_naive()
    elif op == "grow":
        job.migrate_warm(devices=min(job.towers, 2 * (job.devices or job.towers)))
    elif op == "shrink":
        job.migrate_warm(devices=max(1, (job.devices or job.towers) // 2))
    else:
        job.crash_and_restart()


@settings(max_examples=_EXAMPLES or 2, derandomize=not _EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=PROGRAMS, schedule=SCHEDULES)
def test_any_schedule_ends_with_the_uninterrupted_variables(program: tuple[str, str, int],
                                                            schedule: list[str],
                                                            runtime_server: Any, launch: Any,
                                                            tmp_path: Path) -> None:
    loop, optimizer, replicas = program
    args = feed_args(loop, optimizer, replicas)
    work = tmp_path / uuid.uuid4().hex[:8]  # one function-scoped tmp_path for all examples
    work.mkdir()
    baseline = launch(FEED_SCRIPT, *args, "--dump", str(work / "base.npz"), status=False)
    job = FeedJob(launch, runtime_server, f"prop-{work.name}", args, work / "run.npz", work)
    job.start()
    for op in schedule:
        apply(job, op)
        job.pause(0.05)
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(work / "base.npz", work / "run.npz")
