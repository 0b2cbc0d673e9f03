"""A preemption-aware TF1 program behind a shell script, its helper stopped (SIGTERM, as a
rolling restart of the helpers does): a real scheduler, real `gandiva helper` processes
and real TensorFlow. The program saves its own checkpoint in its SIGTERM handler and
exits; the job goes back to the queue, restarts on another server, where the program
restores that checkpoint itself (no checkpoint of Gandiva's was taken), and ends with
the variables of an uninterrupted run. Before s52 the program was SIGKILLed as soon as
the SIGTERM ended its shell, its save never made (the restart began at step 0).

Marked `full`: the mechanism is checked by default, with real processes and no
TensorFlow, in tests/migration_helper/test_wrapped_stop.py -k saves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from protos.gandiva.v1 import common_pb2

from ..tf_runtime.conftest import assert_same_variables
from .test_wrapped_launch import cluster, deadline_s, submit  # noqa: F401

pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.full]

PROGRAMS = Path(__file__).resolve().parents[1] / "tf_runtime" / "programs"
DONE = {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED}


def left_running(job_id: str) -> list[int]:
    """Processes that carry the job's id in their environment (any launch of it)."""
    mark = f"GANDIVA_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_program_behind_a_script_saves_on_its_helpers_sigterm_and_resumes_from_it(
        cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    flags = f"{PROGRAMS / 'own_signals.py'} --sigterm save --restore --workdir own --steps 400 --step-sleep 0.05"
    base = tmp_path / "base"
    (base / "own").mkdir(parents=True)
    subprocess.run([sys.executable, *flags.split(), "--dump", "base.npz"], cwd=base, check=True, timeout=900,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    cluster.add_helper("a", 1)
    wd = tmp_path / "wd"
    wd.mkdir()
    # python is bash's child (a script's commands are not exec'd), a line after it.
    (wd / "run.sh").write_text(f"#!/bin/bash\nmkdir -p own\npython {flags} --dump run.npz\necho trained\n")
    job_id = submit(cluster, "preemptible", ["bash", str(wd / "run.sh")], wd)
    cluster.wait_for(lambda: cluster.job(job_id).steps >= 20, 300)
    helper = cluster.helpers[0]
    helper.send_signal(signal.SIGTERM)  # it stops its jobs (SIGTERM, then SIGKILL after the grace)
    helper.wait(120)
    log = (tmp_path / "logs" / f"{job_id}.log").read_text()
    assert "SIGTERM: saved at step" in log, log[-3000:]
    saved = int(log.split("SIGTERM: saved at step")[1].split()[0])
    assert saved < 400
    cluster.add_helper("b", 1)
    done = cluster.wait_for(lambda: (j := cluster.job(job_id)).state in DONE and j, 600)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, done.message
    log = (tmp_path / "logs" / f"{job_id}.log").read_text()
    assert f"restored its own model-{saved}" in log, log[-3000:]
    assert log.count("trained\n") == 1  # the rest of the script ran once, at the real end
    assert_same_variables(base / "base.npz", wd / "run.npz")
    assert left_running(job_id) == []
