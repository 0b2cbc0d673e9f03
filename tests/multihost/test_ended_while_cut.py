"""A job that ends while its host is cut off from the scheduler, before the lease freezes
it: its exit cannot be delivered, and past the heartbeat timeout the scheduler takes the
job for lost and re-queues it. When the link comes back before anything ran the job again
(no other host could take it), the exit its helper still holds settles the job: it ends
once, launched once, never run a second time (from its checkpoint, or from the start)."""

from __future__ import annotations

import sys
import time

import pytest

from protos.gandiva.v1 import common_pb2

from .test_i9s_faults import DONE, RUNNING, Cluster, _states

pytestmark = [pytest.mark.slow]

# Each run appends a line to RUNS, then ends at once when GO exists (a program whose end
# the test chooses: its end falls inside the cut, well before the lease runs out).
PROGRAM = """
import os, sys, time
runs, go = sys.argv[1], sys.argv[2]
with open(runs, "a") as f:
    f.write(os.environ.get("GANDIVA_INCARNATION", "?") + "\\n")
while not os.path.exists(go):
    time.sleep(0.05)
"""


@pytest.mark.full  # the default run covers it: test_helper_replaced.py -k late_exit
def test_a_job_that_ends_while_its_host_is_cut_off_is_settled_by_its_late_exit(multihost: Cluster) -> None:
    c = multihost
    c.add_helper("h1")  # the only host: nothing can run the job again while it is cut off
    runs, go = c.tmp / "runs.txt", c.tmp / "go"
    job_id = c.submit("ends-in-cut", [sys.executable, "-c", PROGRAM, str(runs), str(go)])
    c.wait(lambda: c.job(job_id).state == RUNNING and runs.exists() and c.pids_of(job_id), 60)
    c.net.cut("h1")
    go.touch()
    cut_at = time.monotonic()
    c.wait(lambda: not c.pids_of(job_id), 30)
    ended_s = time.monotonic() - cut_at
    c.wait(lambda: not c.server_up("h1"), 30)  # the heartbeat timeout: the job taken for lost
    c.net.restore("h1")
    done = c.wait(lambda: (j := c.job(job_id)).state in DONE and j, 60)
    assert isinstance(done, common_pb2.Job)
    history = [t.reason for t in done.history]
    print(f"\nthe job ended {ended_s:.1f}s into the cut; {history}")
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, (done.message, history)
    assert _states(done).count("RUNNING") == 1, history
    time.sleep(2)  # a second launch, had there been one, has written its line by now
    assert len(runs.read_text().split()) == 1, runs.read_text()
