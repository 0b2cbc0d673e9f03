"""A program configured by TF_CONFIG (programs/tf_config.py): a one-worker cluster whose
gRPC server listens at the fixed address TF_CONFIG names, under a real Runtime server and
real processes."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from .conftest import FeedJob, assert_same_variables
from .test_tfr_feed_from_step import PROGRAMS

pytestmark = [pytest.mark.tf, pytest.mark.full]


def _tf_config() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"localhost:{port}"]},
                                     "task": {"type": "worker", "index": 0}})}


def test_a_program_whose_server_listens_where_tf_config_says_moves_by_restart(
        runtime_server: Any, launch: Any, tmp_path: Path) -> None:
    """No fix needed for a move by restart: migrated naive, then checkpointed, killed and
    restarted on the same host (the port free once the process is gone): bit-identical.
    Known limit (docs/tf_runtime.md): a pre-warmed copy on the host the job runs on cannot
    start its server while the source holds the port ("Could not start gRPC server") and
    exits 1 before it is ready, so such a move stays where it is (the helper's STAYED); the
    source trains on, unharmed, to the same result. (GANDIVA_FULL_TESTS=1: the mechanisms
    are those of test_tfr_feed_from_step.py's default kinds; the cluster shape, of its
    `cluster` kind.)"""
    script = str(PROGRAMS / "tf_config.py")
    flags = ["--steps", "30", "--step-sleep", "0.03"]
    base = launch(script, *flags, "--dump", str(tmp_path / "base.npz"), status=False, env=_tf_config())
    job = FeedJob(launch, runtime_server, "tf-config", flags, tmp_path / "run.npz", tmp_path,
                  script=script, env=_tf_config())
    job.start()
    job.pause(0.2)
    job.migrate_naive()
    job.pause(0.2)
    job.checkpoint()
    job.pause(0.2)
    job.crash_and_restart()
    job.pause(0.2)
    with pytest.raises(TimeoutError, match="no warm_ready event") as failed:
        job.migrate_warm()  # (the exception carries the warm copy's log)
    assert "Could not start gRPC server" in str(failed.value)
    job.finish()
    assert base.wait() == 0
    assert_same_variables(tmp_path / "base.npz", tmp_path / "run.npz")
