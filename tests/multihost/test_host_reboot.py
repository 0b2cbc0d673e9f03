"""A host that reboots: its helper killed with -9 (its jobs with it), its ramdisk, which
holds the job's periodic checkpoints, wiped (tmpfs) or left with every file cut to half
(a checkpoint root on a disk whose unsynced writes a power cut lost), and its helper started
again under the same name. The job must resume from a whole checkpoint or from step 0 with
a note saying so, never from a stale or half file: it ends once, with the variables of an
uninterrupted run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import RUNNING, Cluster, _ends_once, _no_two_copies

STEPS = 400  # test_i9s_faults.py's count: one uninterrupted run serves both

pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.full]


@pytest.mark.parametrize("ramdisk", ["wiped", "torn"])
def test_a_rebooted_host_resumes_its_job_from_a_whole_checkpoint_or_step_0(
        multihost: Cluster, tmp_path: Path, ramdisk: str) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    c.add_helper("h1")  # the only host: the job comes back to it
    dump = c.tmp / "final.npz"
    job_id = c.submit("feed", feed_command(STEPS, dump, sleep=0.05))
    c.wait(lambda: (j := c.job(job_id)).steps > 100 and j.state == RUNNING
           and any(e.kind == "job.checkpoint" for e in c.events(job_id)), 120)
    c.kill9("h1")
    root = c.tmp / "rd" / "h1"
    if ramdisk == "wiped":
        shutil.rmtree(root)
    else:
        for folder, _, files in os.walk(root):
            for name in files:
                path = Path(folder, name)
                os.truncate(path, path.stat().st_size // 2)
    c.add_helper("h1")
    done = _ends_once(c, job_id, STEPS, 240)
    history = [t.reason for t in done.history]
    print(f"\n{ramdisk}: {history}")
    assert any("from step 0" in r for r in history), history
    assert_bit_identical(dump, STEPS, tmp_path)
    _no_two_copies(c)
