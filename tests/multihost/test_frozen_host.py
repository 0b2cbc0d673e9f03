"""A host that freezes and comes back (a paused VM, a kernel stall), with real TensorFlow:
its helper and its job's process stopped (SIGSTOP) past the heartbeat timeout, the job
re-placed on the other host meanwhile, then the host woken, its job's process first (the
helper may get the CPU last). The woken copy trains nothing more (the sampler), does not
rewrite the restore point its replacement resumed from, and the job ends once with the
variables of an uninterrupted run. The fast case, with the fake job, runs by default:
tests/migration_helper/test_frozen_host.py."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import CHECKPOINT_INTERVAL_S, assert_bit_identical, uninterrupted_variables
from .test_i9s_faults import Cluster, _ends_once, _no_two_copies, _start
from .test_partition_faults import GpuWatch

STEPS = 400  # as test_i9s_faults.py: one uninterrupted run per step count


def _periodic_steps(c: Cluster, job_id: str) -> list[int]:
    """The steps of the job's periodic checkpoints the scheduler recorded."""
    return [int(e.message.split()[1]) for e in c.events(job_id)
            if e.kind == "job.checkpoint" and "/periodic-" in e.message]

pytestmark = [pytest.mark.tf, pytest.mark.slow, pytest.mark.full]


@pytest.mark.parametrize("multihost", [{"heartbeat_timeout": 5.0}], indirect=True)
def test_a_frozen_host_woken_after_its_job_moved_trains_nothing_more(multihost: Cluster, tmp_path: Path) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    job_id, src, other, dump = _start(c, STEPS)
    (pid,) = c.pids_of(job_id)
    old_inc = c.sampler.copies[pid].incarnation
    periodic = c.tmp / "rd" / src / job_id / f"periodic-{old_inc}" / "gandiva.json"
    # A periodic checkpoint well into the run, answered (the restore point the replacement
    # resumes from), then the job frozen: the next one, asked meanwhile, waits unanswered.
    c.wait(lambda: max(_periodic_steps(c, job_id), default=0) >= 20, 60)
    os.kill(pid, signal.SIGSTOP)
    watch = GpuWatch(c.tmp / "state.db")
    time.sleep(CHECKPOINT_INTERVAL_S * 1.5)
    c.signal(src, signal.SIGSTOP)
    try:
        c.wait(lambda: c.where(job_id) == other and c.job(job_id).steps > 0, 60)
        restored = json.loads(periodic.read_text())["global_step"]
        c.wait(lambda: c.job(job_id).steps > restored + 20, 60)
    finally:
        woke = time.monotonic()
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
        c.signal(src, signal.SIGCONT)
    c.wait(lambda: pid not in c.pids_of(job_id), 30)
    gone_s = time.monotonic() - woke
    after = json.loads(periodic.read_text())["global_step"]
    c.wait(lambda: c.server_up(src), 30)
    done = _ends_once(c, job_id, STEPS, 180)
    print(f"\nfrozen host woken: its copy gone {gone_s:.2f}s later; restore point step {restored} -> {after}; "
          + " | ".join(t.reason for t in done.history))
    assert after == restored, "the woken copy wrote over the restore point its replacement resumed from"
    assert_bit_identical(dump, STEPS, tmp_path)
    assert watch.stop() == []
    _no_two_copies(c)
