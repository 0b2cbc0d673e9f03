"""The destination's helper killed with -9 once it has pre-warmed a migration's copy of
the job (accepted, the copy loaded and waiting, not yet activated), then restarted: the
job trains on at its source, once; the copy its killed helper left is never activated
and does not outlive it; every step is trained exactly once. Real scheduler, real helper
processes, the fake job (the shim's protocols over real gRPC)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from .test_helper_faults import DONE, SETTINGS, _job_pids, _migrating, _submit, _up, helpers  # noqa: F401 - a fixture


@pytest.mark.full  # 20 s at load; a probe that held in session 53 (nothing to fix)
def test_a_destination_helper_killed_9_after_pre_warming_leaves_the_job_at_its_source_trained_once(
    make_scheduler: Any, sqlite_url: str, helpers: Any, tmp_path: Path, fake_job: str, wait_for: Any  # noqa: F811
) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(sched.address))
    procs = {name: helpers(name, sched.address) for name in ("s1", "s2")}
    _up(api, wait_for, "s1", "s2")
    steps_log = tmp_path / "steps.log"
    job_id, job = _submit(api, fake_job, tmp_path, FAKE_STEPS="0", FAKE_STEP_S="0.02", FAKE_STEP_LOG=str(steps_log))
    src, dest, source_pid = _migrating(api, job_id, wait_for)
    wait_for(lambda: _job_pids(job_id, warm=True), 10)  # pre-warmed, waiting
    os.kill(procs[dest].pid, signal.SIGKILL)
    procs[dest].wait(10)
    os.kill(source_pid, signal.SIGCONT)
    # The migration ends without moving the job; it trains at its source.
    wait_for(lambda: (j := job()).state == common_pb2.JOB_STATE_RUNNING and j.placement[0].server == src, 60)
    # The copy the killed helper left does not outlive it (it is never activated).
    wait_for(lambda: not _job_pids(job_id, warm=True), 30)
    ended = [e.message for e in api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
             if e.kind == "job.migration"]
    # Restarted at its source from the migration's checkpoint (the transfer refused).
    assert any(m.startswith("restarted_at_source") for m in ended), ended
    helpers(dest, sched.address)  # restarted
    _up(api, wait_for, dest)
    at = job().steps
    wait_for(lambda: (j := job()).state == common_pb2.JOB_STATE_RUNNING and j.steps >= at + 20, 30)
    assert not _job_pids(job_id, warm=True)
    assert len(_job_pids(job_id, warm=False)) == 1
    api.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=5)
    wait_for(lambda: job().state in DONE and not _job_pids(job_id, warm=False), 30)
    rows = [line.split() for line in steps_log.read_text().splitlines()]
    steps = [int(step) for _, step in rows]
    # Every step once, in order, or from its migration's checkpoint again: never two copies at once.
    assert steps == sorted(steps) and len(set(steps)) == len(steps), rows
    assert steps == list(range(1, len(steps) + 1)), rows
