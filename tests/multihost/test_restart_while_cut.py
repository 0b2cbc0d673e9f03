"""Two faults at once: a host's link cut and, a moment later, the scheduler killed with -9
and started again (its in-memory view of helpers, leases and commands gone), then the link
restored: before the restarted scheduler calls the host down (the job was frozen by its
lease and trains on where it was) or after (the job was re-placed on the other host from
its periodic checkpoint, and the frozen copy must never train again). Either way the job
ends once, with the variables of an uninterrupted run, never two copies at once, and no
GPU held twice or by a job not running in the scheduler's database."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .conftest import assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import RUNNING, Cluster, _ends_once, _no_two_copies, _states
from .test_partition_faults import GpuWatch

STEPS = 200

pytestmark = [pytest.mark.tf, pytest.mark.slow]


@pytest.mark.full
@pytest.mark.parametrize("multihost", [{"heartbeat_timeout": 10.0}], indirect=True)
@pytest.mark.parametrize("restored", ["before_down", "after_down"])
def test_a_host_cut_off_while_the_scheduler_restarts_runs_its_job_once(
        multihost: Cluster, tmp_path: Path, restored: str) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    c.add_helper("h1")
    c.add_helper("h2")
    dump = c.tmp / "final.npz"
    # 0.08 s mini-batches: the lease (6 s) freezes the cut copy well before its last step.
    job_id = c.submit("feed", feed_command(STEPS, dump, sleep=0.08))
    watch = GpuWatch(c.tmp / "state.db")
    c.wait(lambda: (j := c.job(job_id)).steps > 20 and j.state == RUNNING
           and any(e.kind == "job.checkpoint" for e in c.events(job_id)), 90)
    src = c.where(job_id)
    other = "h2" if src == "h1" else "h1"
    (old,) = c.sampler.cpu_of(job_id)
    c.net.cut(src)
    time.sleep(1.0)
    c.kill9("scheduler")
    c.start_scheduler()
    restarted = time.monotonic()
    if restored == "before_down":
        # Back well within the restarted scheduler's first heartbeat timeout (10 s from its start).
        c.wait(lambda: time.monotonic() - restarted > 1.5, 10)
        c.net.restore(src)
    else:
        c.wait(lambda: c.where(job_id) == other, 60)
        assert old in c.sampler.cpu_of(job_id), "the cut host's copy was gone before its link came back"
        c.net.restore(src)
        # Back, its helper is told the copy is stale and kills it.
        c.wait(lambda: old not in c.sampler.cpu_of(job_id), 30)
    c.wait(lambda: c.server_up(src), 30)
    done = _ends_once(c, job_id, STEPS, 120)
    assert_bit_identical(dump, STEPS, tmp_path)
    history = [t.reason for t in done.history]
    requeued = _states(done)[1:].count("QUEUED")
    assert requeued == (0 if restored == "before_down" else 1), history
    print(f"\n{restored}: {history}")
    assert watch.stop() == []
    _no_two_copies(c)
    c.wait(lambda: not c.pids_of(job_id), 30)
