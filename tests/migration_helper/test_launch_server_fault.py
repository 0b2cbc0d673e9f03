"""A server that cannot start jobs (its helper's job-log disk full) is no black hole: a
launch that fails there for a reason of the server's puts the job back in the queue and
keeps new jobs off that server for a while, instead of failing the job, and every job
after it that the policy placed on the server with free GPUs. The two jobs then go to
the other server in one round, time-sliced from the start: neither waits for the suspend
of the other, which is not launched yet. Real scheduler (in process), real helper
processes, the fake job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .test_helper_faults import DONE, SETTINGS, helpers  # noqa: F401 - helpers: a fixture
from .test_ramdisk_transfer import small_tmpfs  # noqa: F401 - a fixture


def test_jobs_launched_on_a_server_with_its_log_disk_full_go_elsewhere_instead_of_failing(
        make_scheduler: Any, sqlite_url: str, helpers: Any, small_tmpfs: Path,  # noqa: F811
        tmp_path: Path, fake_job: str, wait_for: Any) -> None:
    (small_tmpfs / "logs").mkdir()
    with open(small_tmpfs / "fill", "wb") as fill:  # the disk full
        try:
            while True:
                fill.write(b"\0" * 65536)
                fill.flush()
        except OSError:
            pass
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    # A round's wait for the GPUs it suspends, made long: the two jobs below are placed on
    # one GPU in one round, one of them suspended at once, and must not wait for it.
    sched.server.engine.vacate_timeout_s = 60.0
    api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(sched.address))
    helpers("full", sched.address, "--log-dir", str(small_tmpfs / "logs"))

    def submit(name: str) -> str:
        spec = common_pb2.JobSpec(name=name, command=[fake_job], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEPS": "20", "FAKE_STEP_S": "0.02"})
        return api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id

    def job(job_id: str) -> common_pb2.Job:
        return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=5)

    first = submit("first")
    back = wait_for(lambda: next((t for t in job(first).history if "reason of the server's" in t.reason), None), 30)
    assert back.to_state == common_pb2.JOB_STATE_QUEUED and "No space left on device" in back.reason, back.reason
    events = api.ListEvents(scheduler_pb2.ListEventsRequest()).events
    assert any(e.kind == "server.launch_failed" and e.server == "full" for e in events), events
    second = submit("second")  # not placed on the full server meanwhile
    helpers("ok", sched.address)
    for job_id in (first, second):
        done = wait_for(lambda j=job_id: (got := job(j)).state in DONE and got, 30)
        assert done.state == common_pb2.JOB_STATE_SUCCEEDED and done.steps == 20, (done.message, done.history)
        on_full = [t.reason for t in done.history if " on full/" in t.reason]
        assert len(on_full) == (1 if job_id == first else 0), on_full  # the failed launch only
