"""`gandiva drain` of a job that cannot stop at a mini-batch boundary (its program connected
no runtime: here `sleep`, a process with no training loop): the drain leaves it where it
is and says why, and `drain --wait --timeout` gives up with exit 1 naming it; the job is not
touched (still running on the drained server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.core import Settings

from .conftest import Cluster


def test_drain_leaves_a_job_it_cannot_stop_and_says_so(make_scheduler: Any, sqlite_url: str, tmp_path: Path,
                                                       wait_for: Any) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.2,
                           settings=Settings(heartbeat_interval_s=1.0, down_after_s=4.0, runtime_connect_deadline_s=2.0))
    cluster = Cluster(sched, tmp_path, wait_for)
    try:
        cluster.add_helper("w1", 1)
        spec = common_pb2.JobSpec(name="plain", command=["sleep", "600"], workdir=str(tmp_path), gpus=1)
        job_id = cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.id
        wait_for(lambda: (j := cluster.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and not j.suspendable, 60)
        done = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "drain", "w1", "--wait", "--timeout", "3s",
                               "--scheduler", sched.address], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{job_id}: wait (it cannot be stopped at a mini-batch boundary" in done.stdout, done.stdout
        assert f"1 job(s) still on it after 3s: {job_id}" in done.stderr, done.stderr
        job = cluster.job(job_id)
        assert job.state == common_pb2.JOB_STATE_RUNNING and {g.server for g in job.placement} == {"w1"}
        events = cluster.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id, kinds=["job.drain"])).events
        assert len(events) == 1 and events[0].message.startswith("wait: "), events
        cluster.stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=10)
    finally:
        cluster.close()
