"""Early feedback, live: on an oversubscribed GPU a newly submitted job gets its first 100
mini-batches at once by time-slicing, instead of queueing behind the long job already there
(the paper's central claim; docs/simulator.md measures it on traces)."""

from __future__ import annotations

import time

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_a_new_job_gets_its_first_100_minibatches_while_a_long_job_holds_the_gpu(cluster, mlp) -> None:  # type: ignore[no-untyped-def]
    cluster.add_helper("node-a", 1)
    # 100,000 steps of 20 ms: the long job would hold the only GPU for over half an hour.
    long_spec = common_pb2.JobSpec(name="long", command=mlp(100000, 0.02), workdir=str(cluster.tmp), gpus=1)
    long_id = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=long_spec)).job.id
    cluster.wait_for(lambda: cluster.job(long_id).steps >= 100, 180)
    new_spec = common_pb2.JobSpec(name="new", command=mlp(100000, 0.02), workdir=str(cluster.tmp), gpus=1)
    submitted = time.monotonic()
    new_id = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=new_spec)).job.id
    cluster.wait_for(lambda: cluster.job(new_id).steps >= 100, 180)
    waited = time.monotonic() - submitted
    long_job = cluster.job(long_id)
    # The long job is far from done: the newcomer's 100 mini-batches came from time-slicing.
    assert long_job.state != common_pb2.JOB_STATE_SUCCEEDED and long_job.steps < 100000
    assert waited < 180
    # The newcomer ran first: the incumbent was suspended for it.
    assert any(t.to_state == common_pb2.JOB_STATE_SUSPENDED and "time-slice with new job" in t.reason
               for t in long_job.history), [t.reason for t in long_job.history]
    for j in (long_id, new_id):
        cluster.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))
