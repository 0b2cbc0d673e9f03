"""Grow and shrink keep a job's result bit-identical (issue 9).

A feed_step program with a fixed number of logical towers (4: the most devices it may
ever hold), placed on however many devices its launch holds (tf_runtime.towers), is
grown and shrunk the way the scheduler does it, by migrations onto more or fewer
devices: pre-warmed 1 -> 4, naive 4 -> 2, and a restart after a loss onto 1. Its final variables equal, bit for bit, those of an uninterrupted run on
4 devices (one tower each). Real TensorFlow processes under a real Runtime server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tf_runtime.towers import tower_devices, visible_device_count

from .conftest import FEED_SCRIPT, FeedJob, assert_same_variables, feed_args

pytestmark = [pytest.mark.tf, pytest.mark.slow]

TOWERS = 4


# The MonitoredTrainingSession + Adam case only with GANDIVA_FULL_TESTS=1 (tests/conftest.py):
# integration/test_grow_towers.py grows that program (2 logical towers) live by default.
@pytest.mark.parametrize("loop,optimizer", [("session", "momentum"),
                                            pytest.param("mts", "adam", marks=pytest.mark.full)])
def test_grow_and_shrink_keep_the_uninterrupted_variables(loop: str, optimizer: str, runtime_server: Any,
                                                          launch: Any, tmp_path: Path) -> None:
    args = feed_args(loop, optimizer, TOWERS)
    baseline = launch(FEED_SCRIPT, *args, "--devices", str(TOWERS), "--dump", str(tmp_path / "base.npz"),
                      status=False)
    job = FeedJob(launch, runtime_server, f"gs-{loop}-{optimizer}", args, tmp_path / "run.npz", tmp_path)
    job.devices = 1
    job.start()
    job.pause(0.1)
    job.migrate_warm(devices=4)         # grow, pre-warmed
    job.pause(0.1)
    job.migrate_naive(devices=2)        # shrink, cold start
    job.pause(0.1)
    job.checkpoint()
    job.pause(0.1)
    job.crash_and_restart(devices=1)    # host lost: back to the checkpoint, on one device
    job.finish()
    assert baseline.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")


def test_towers_are_spread_round_robin_over_the_devices_a_launch_holds() -> None:
    assert tower_devices(4, 1) == ["/gpu:0"] * 4
    assert tower_devices(4, 2, kind="cpu") == ["/cpu:0", "/cpu:1", "/cpu:0", "/cpu:1"]
    assert tower_devices(2, 4) == ["/gpu:0", "/gpu:1"]  # more devices than towers: the rest idle
    for bad in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="towers|devices"):
            tower_devices(*bad)
    with pytest.raises(ValueError, match="kind"):
        tower_devices(1, 1, kind="tpu")
    assert visible_device_count(3, {"CUDA_VISIBLE_DEVICES": "4,5"}) == 2
    assert visible_device_count(3, {"CUDA_VISIBLE_DEVICES": ""}) == 3
    assert visible_device_count(3, {}) == 3
