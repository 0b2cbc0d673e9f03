"""A host cut off in the middle of a packing trial: two jobs time-sliced on its one GPU,
the policy packs them (both RUNNING on it, the trial's clock running), and the host's link
is cut. The host is called down, both jobs go back to the queue; the link restored, both
frozen copies are stopped as stale and each job runs again from its periodic checkpoint.
Each ends once with the variables of an uninterrupted run, never two copies of one job at
once, and no GPU held past its server's count or by a job not running in the scheduler's
database (two running jobs on the one GPU are the pack itself)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from protos.gandiva.v1 import scheduler_pb2

from .conftest import assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import RUNNING, Cluster, _ends_once, _no_two_copies, _states
from .test_partition_faults import GpuWatch

STEPS = 400  # as test_flapping_link.py: one uninterrupted run per step count

pytestmark = [pytest.mark.tf, pytest.mark.slow]


@pytest.mark.full
def test_a_host_cut_off_mid_packing_trial_runs_each_job_once(multihost: Cluster, tmp_path: Path) -> None:
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    # Short time slices and a long trial: the pack starts soon and is still on when cut.
    c.kill9("scheduler")
    c.sched_args = ["--quantum", "1.5", "--policy-option", "pack_trial_s=60"]
    c.start_scheduler()
    c.add_helper("h1")
    dumps = {name: c.tmp / f"{name}.npz" for name in ("A", "B")}
    jobs = {name: c.submit(name, feed_command(STEPS, dumps[name], sleep=0.05)) for name in dumps}
    watch = GpuWatch(c.tmp / "state.db")

    def packed() -> bool:  # the trial is on: both RUNNING on h1's one GPU
        now = [c.job(j) for j in jobs.values()]
        return all(j.state == RUNNING for j in now) and any(
            j.history[-1].reason.startswith("trial: packed beside") for j in now)

    c.wait(packed, 150)
    steps_at_cut = {name: c.job(j).steps for name, j in jobs.items()}
    c.net.cut("h1")
    c.wait(lambda: not c.server_up("h1"), 30)
    time.sleep(1.0)
    c.net.restore("h1")
    c.wait(lambda: c.server_up("h1"), 30)
    done = {name: _ends_once(c, j, STEPS, 240) for name, j in jobs.items()}
    for name in jobs:
        assert_bit_identical(dumps[name], STEPS, tmp_path)
    history = {name: [t.reason for t in job.history] for name, job in done.items()}
    packs = [e.message for e in c.stub.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["job.pack"])).events]
    print(f"\nat the cut {steps_at_cut}; packs {packs}; {history}")
    assert all(_states(job)[1:].count("QUEUED") >= 1 for job in done.values()), history
    # The trial ends with h1's loss, its verdict naming it: not judged from rates sampled
    # apart, nor voided at the relaunch as "time-slice with new job" (before session 44).
    # (Relaunched together on h1, the pair may be packed for a new trial, judged on its own.)
    verdicts = [p for p in packs if p.startswith("packing trial with")]
    assert verdicts and "went back to the queue from h1 (a server went down" in verdicts[0], packs
    assert not any("time-slice with new job" in p for p in verdicts), packs
    # Two RUNNING jobs on h1's one GPU is the pack itself; anything else GpuWatch records is not.
    assert [w for w in watch.stop() if "held by running jobs" not in w] == []
    _no_two_copies(c)
