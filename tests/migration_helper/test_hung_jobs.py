"""A job whose process lives but makes no progress (a deadlocked input pipeline, a hung
collective, a program asleep between its runs) holds its GPUs: the scheduler notices that
no mini-batch ended for longer than the job's own mini-batch time allows, says so
(describe's message, a `job.hung` event, `gandiva_jobs_hung`), and, still hung a while
later, stops it and resumes it from its checkpoint. A job that is merely slow is never
flagged. Real scheduler (in process, real gRPC), real helper processes, the fake job."""

from __future__ import annotations

import dataclasses
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .test_helper_faults import DONE, SETTINGS, _job_pids, _up, helpers  # noqa: F401 - helpers: a fixture

# Flagged after 1 s without a mini-batch (or 20 of its own), restarted 1 s later.
HANG = dataclasses.replace(SETTINGS, hang_after_s=1.0, hang_restart_after_s=1.0, checkpoint_interval_s=0.3)


def test_a_hung_job_is_flagged_then_resumed_from_its_checkpoint_and_a_slow_one_is_left_alone(
        make_scheduler: Any, sqlite_url: str, helpers: Any, tmp_path: Path, fake_job: str,  # noqa: F811
        wait_for: Any) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=HANG, http_listen="127.0.0.1:0")
    api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(sched.address))
    helpers("s1", sched.address)
    helpers("s2", sched.address)
    _up(api, wait_for, "s1", "s2")  # each job on a server of its own: launched once, and once after its hang

    def submit(name: str, **env: str) -> str:
        spec = common_pb2.JobSpec(name=name, command=[fake_job], workdir=str(tmp_path), gpus=1, env=env)
        return api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id

    def job(job_id: str) -> common_pb2.Job:
        return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=5)

    def hung_events(job_id: str) -> list[str]:
        return [e.message for e in api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
                if e.kind == "job.hung"]

    # Steps of 1.2 s, longer than the 1 s floor: its bound is 20 of its own steps.
    slow = submit("slow", FAKE_STEPS="5", FAKE_STEP_S="1.2")
    # Hangs at step 60 (after 1.2 s and a few checkpoints), once: its next launch trains on,
    # and lingers 3 s after its last step (past its 1-s bound): not hung, not restarted.
    hung = submit("hung", FAKE_STEPS="100", FAKE_STEP_S="0.02", FAKE_HANG_AT="60",
                  FAKE_HANG_ONCE=str(tmp_path / "hung-once"), FAKE_LINGER_S="3")
    (hung_pid,) = wait_for(lambda: _job_pids(hung, warm=False), 30)

    flagged = wait_for(lambda: (j := job(hung)).message.startswith("hung?") and j, 30)
    assert flagged.state == common_pb2.JOB_STATE_RUNNING and flagged.steps <= 60, (flagged.state, flagged.steps)
    assert "no mini-batch for" in flagged.message and "judged hung after 1s" in flagged.message, flagged.message
    metrics = scrape(sched)
    if job(hung).state == common_pb2.JOB_STATE_RUNNING:  # not restarted yet (a loaded machine)
        assert "gandiva_jobs_hung 1.0" in metrics, metrics

    # Still hung a second later: stopped, re-queued from its checkpoint; the hung process is gone.
    requeued = wait_for(lambda: next((t for t in job(hung).history if t.reason.startswith("hung: ")), None), 30)
    assert requeued.to_state == common_pb2.JOB_STATE_QUEUED, requeued
    assert "it resumes from its checkpoint" in requeued.reason and "(restart 1 of 2" in requeued.reason, \
        requeued.reason
    wait_for(lambda: hung_pid not in _job_pids(hung, warm=False), 15)

    done = wait_for(lambda: (j := job(hung)).state in DONE and j, 60)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED and done.steps == 100, (done.message, done.steps)
    assert [t.to_state for t in done.history].count(common_pb2.JOB_STATE_RUNNING) == 2
    events = hung_events(hung)
    assert events[0].startswith("hung? no mini-batch for") and events[1].startswith("hung: no mini-batch"), events
    assert len(events) == 3 and "program ended" in events[2] and "has not exited" in events[2], events

    finished = wait_for(lambda: (j := job(slow)).state in DONE and j, 60)
    assert finished.state == common_pb2.JOB_STATE_SUCCEEDED and finished.steps == 5, finished.message
    assert hung_events(slow) == [] and not finished.message.startswith("hung"), finished.message
    metrics = scrape(sched)
    for line in ('gandiva_job_hangs_total{outcome="flagged"} 1.0', 'gandiva_job_hangs_total{outcome="restarted"} 1.0',
                 'gandiva_job_hangs_total{outcome="not_exited"} 1.0',
                 "gandiva_jobs_hung 0.0"):
        assert line in metrics, line


def scrape(sched: Any) -> str:
    with urllib.request.urlopen(f"http://{sched.server.http_address}/metrics", timeout=5) as page:
        return page.read().decode()
