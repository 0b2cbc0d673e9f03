"""A program that sets CUDA_VISIBLE_DEVICES itself (`os.environ["CUDA_VISIBLE_DEVICES"] =
"0"` before importing TensorFlow, a `--gpu 1` flag) is kept on the GPUs its job was launched
on (tf_runtime.launch_devices): it used to use the server's GPU 0, another job's, whatever
GPU the helper gave it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tf_runtime import launch_devices
from tf_runtime.autoload import DIRECTORY
from tf_runtime.launch_devices import ENV, within

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("launch,wanted,used", [
    ("2", "0", "2"), ("2,5", "1", "5"), ("2,5", "1,0", "5,2"),   # numbered within the job's
    ("2", "1", "2"), ("2", "0,3", "2"), ("2", "GPU-x", "2"),     # beyond them: the job's own
    ("2", None, "2"), ("2", "\u00b2", "2"),                        # removed: not every GPU; no number
    ("2", "-1", "-1"), ("2", "", ""),                             # no GPU at all: kept
    ("GPU-a,GPU-b", "GPU-b", "GPU-b")])                           # a UUID the job holds
def test_a_programs_gpu_list_is_read_within_the_jobs(launch: str, wanted: str | None,
                                                     used: str) -> None:
    value, why = within(launch, wanted)
    assert value == used
    assert (why == "") == (wanted == "GPU-b"), why


@pytest.mark.parametrize("launch,wanted", [("3,5", "5"), ("3,5", "5,3"), ("2,3", "2")])
def test_a_launcher_that_splits_the_jobs_own_list_among_its_workers_keeps_their_gpus(
        launch: str, wanted: str) -> None:
    """A launcher reading the job's CUDA_VISIBLE_DEVICES ("3,5") and giving each worker one
    of its GPUs ("5"): GPUs the job holds, no numbers within it (5 is past its two): kept, as
    without the shim. They used to read as beyond the job's GPUs: each worker got both and
    trained on GPU 3 beside the other."""
    assert within(launch, wanted) == (wanted, "")


def test_the_helpers_list_is_recorded_before_the_programs_code_runs(tmp_path: Path) -> None:
    """The autoload's sitecustomize records it at the interpreter's start, in every process
    of a job (a wrapper's python too)."""
    code = ("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
            "from tf_runtime import launch_devices\nlaunch_devices.keep()\n"
            "print(os.environ['CUDA_VISIBLE_DEVICES'])\n")
    env = {"PATH": os.environ["PATH"], "GANDIVA_JOB_ID": "j-1", ENV: "3",
           "PYTHONPATH": os.pathsep.join([DIRECTORY, str(REPO)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["3"], (out.stdout, out.stderr)
    assert "numbered from 0 within the job" in out.stderr


@pytest.fixture
def launched_on_gpu_3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(launch_devices, "_LAUNCH", ["3"])
    monkeypatch.setattr(launch_devices, "_SETTLED", [])
    monkeypatch.setenv(ENV, "0")  # the program's own line
    yield


@pytest.mark.tf
def test_a_session_of_the_program_is_made_on_the_jobs_gpu(launched_on_gpu_3: None) -> None:
    import tensorflow as tf

    from tf_runtime import shim
    from tf_runtime.controller import Controller, Settings
    from tf_runtime.testing import FakeChannel

    shim.install(Controller(Settings(job_id="t"), channel=FakeChannel(), exit_fn=lambda code: None))
    try:
        with tf.Graph().as_default():
            tf.compat.v1.Session().close()
    finally:
        shim.uninstall()
    assert os.environ[ENV] == "3"


def test_a_python_started_by_a_wrapper_that_set_the_gpus_is_kept_on_the_jobs(tmp_path: Path) -> None:
    """A job `sh run.sh` whose script runs `CUDA_VISIBLE_DEVICES=0 python train.py`: the
    wrapper's "0" was recorded as the launch's list and the job used the server's GPU 0."""
    from migration_helper.launch_rule import job_environment

    code = ("import os\nfrom tf_runtime import launch_devices\nlaunch_devices.keep()\n"
            "print(os.environ['CUDA_VISIBLE_DEVICES'])\n")
    env = job_environment({"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}, {}, job_id="j-1",
                          incarnation="i-1", scheduler="127.0.0.1:1", server="s", gpu_indices=[3])
    out = subprocess.run(["sh", "-c", f'CUDA_VISIBLE_DEVICES=0 "{sys.executable}" -c "$CODE"'],
                         env={**env, "CODE": code}, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["3"], (out.stdout, out.stderr)
