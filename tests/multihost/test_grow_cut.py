"""A host cut off in the middle of a grow: a grow-shrink job (feed_step, two logical
towers: growing it changes nothing of its result) trains alone on h1's four GPUs; the
GPUs idle, the policy grows it (MIGRATING: its destination, on h1 itself, pre-warms on
more GPUs), and h1's link is cut. h1 is called down, the job goes back to the queue and
resumes on h2 from its periodic checkpoint; the link restored, the frozen copies on h1
(the source and the pre-warmed destination) are stopped as stale. The job ends once with
the variables of an uninterrupted run, never two copies at once, and no GPU held twice
in the database."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

from .conftest import assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import Cluster, _ends_once, _no_two_copies, _states
from .test_partition_faults import GpuWatch

STEPS = 400  # as test_flapping_link.py: one uninterrupted run per step count
MIGRATING = common_pb2.JOB_STATE_MIGRATING

pytestmark = [pytest.mark.tf, pytest.mark.slow]


@pytest.mark.full  # the host-loss mechanism: test_i9s_faults.py; a cut mid-trial: test_pack_trial_cut.py
def test_a_host_cut_off_mid_grow_runs_its_job_once(multihost: Cluster, tmp_path: Path) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    c.kill9("scheduler")
    c.sched_args = ["--policy-option", "grow_idle_s=2"]
    c.start_scheduler()
    c.add_helper("h1", gpus=4)
    dump = c.tmp / "final.npz"
    spec = common_pb2.JobSpec(name="grower", command=feed_command(STEPS, dump, sleep=0.1), gpus=1,
                              workdir=str(c.tmp), priority=1, grow_shrink=True)
    job_id = c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    watch = GpuWatch(c.tmp / "state.db")
    c.wait(lambda: c.job(job_id).state == MIGRATING, 150)
    at_cut = c.job(job_id)
    c.net.cut("h1")
    c.add_helper("h2", gpus=4)
    c.wait(lambda: not c.server_up("h1"), 30)
    c.wait(lambda: c.where(job_id) == "h2", 90)
    c.net.restore("h1")
    c.wait(lambda: c.server_up("h1"), 30)
    done = _ends_once(c, job_id, STEPS, 240)
    assert_bit_identical(dump, STEPS, tmp_path)
    history = [f"{common_pb2.JobState.Name(t.to_state)}: {t.reason}" for t in done.history]
    print(f"\ncut at step {at_cut.steps} ({at_cut.history[-1].reason}); {history}")
    assert "QUEUED" in _states(done)[1:], history
    assert watch.stop() == []
    _no_two_copies(c)
