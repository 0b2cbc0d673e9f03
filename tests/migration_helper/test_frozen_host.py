"""A host that freezes and comes back (a paused VM, a kernel stall): its helper and its
job's process stopped (SIGSTOP) past the heartbeat timeout, then continued. The scheduler
re-places the job elsewhere meanwhile; the woken copy must not train on, nor write what a
user sees: the job's step count, its restore point. Real scheduler, real helper processes
(a shared root, as over NFS), the fake job."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.core import Settings

from ..multihost.test_partition_faults import GpuWatch
from .test_helper_faults import (
    _job_pids,
    _submit,
    helpers,  # noqa: F401 - a fixture
)

SETTINGS = Settings(heartbeat_interval_s=0.2, down_after_s=3.0, checkpoint_interval_s=0.5)  # lease 1.8 s


def _steps_of(log: Path, incarnation: str) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.split()[0] == incarnation]


def test_a_frozen_host_that_wakes_after_its_job_moved_trains_nothing_and_writes_nothing(
    make_scheduler: Any, sqlite_url: str, helpers: Any, tmp_path: Path, fake_job: str, wait_for: Any  # noqa: F811
) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(sched.address))
    procs = {n: helpers(n, sched.address, "--shared-root", str(tmp_path / "rd")) for n in ("s1", "s2")}
    steps_log = tmp_path / "steps.log"
    job_id, job = _submit(api, fake_job, tmp_path, FAKE_STEPS="0", FAKE_STEP_S="0.02", FAKE_STEP_LOG=str(steps_log))
    wait_for(lambda: (j := job()).steps >= 20 and j.state == common_pb2.JOB_STATE_RUNNING, 30)
    src = job().placement[0].server
    old_inc = steps_log.read_text().split()[0]  # the launch's incarnation
    periodic = tmp_path / "rd" / src / job_id / f"periodic-{old_inc}" / "gandiva.json"
    wait_for(periodic.exists, 10)
    (pid,) = _job_pids(job_id, warm=False)
    watch = GpuWatch(tmp_path / "state.db")  # no GPU held twice, or by a queued job

    # The job first, then its helper: a periodic checkpoint asked of the job meanwhile
    # waits in its stream, unanswered, as on a host that stalls between two reads.
    os.kill(pid, signal.SIGSTOP)
    time.sleep(SETTINGS.checkpoint_interval_s * 3)
    os.kill(procs[src].pid, signal.SIGSTOP)
    try:
        moved = wait_for(lambda: (j := job()).state == common_pb2.JOB_STATE_RUNNING
                         and j.placement[0].server != src and j.steps > 0 and j, 30)
        new_inc = wait_for(lambda: next((line.split()[0] for line in steps_log.read_text().splitlines()
                                         if line.split()[0] != old_inc), ""), 20)
        # From now on the job's step count, as a user polling it sees it, may only grow
        # (its replacement trains; before, it went back to the restore point: by design).
        seen: list[int] = []
        done = threading.Event()

        def poll() -> None:
            while not done.wait(0.05):
                try:
                    seen.append(api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=5).steps)
                except grpc.RpcError:
                    pass
        threading.Thread(target=poll, daemon=True).start()
        wait_for(lambda: len(_steps_of(steps_log, new_inc)) >= 10, 20)
        restore_step = json.loads(periodic.read_text())["global_step"]
        old_last = max(_steps_of(steps_log, old_inc))
    finally:
        woke = time.monotonic()
        # The job's process first: the adversarial order (a VM's vCPUs, a stalled kernel
        # wake every process at once; the helper may get the CPU last).
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
        os.kill(procs[src].pid, signal.SIGCONT)
    wait_for(lambda: pid not in _job_pids(job_id, warm=False), 20)
    gone_s = time.monotonic() - woke
    after = [s for s in _steps_of(steps_log, old_inc) if s > old_last]
    restore_after = json.loads(periodic.read_text())["global_step"]
    wait_for(lambda: job().steps >= moved.steps + 20, 20)
    done.set()
    api.KillJob(scheduler_pb2.JobActionRequest(id=job_id), timeout=5)
    print(f"\nold copy gone {gone_s:.2f}s after it woke; steps it trained after waking: {after}; "
          f"restore point step {restore_step} -> {restore_after}")
    assert after == [], f"the woken copy trained steps {after} beside its replacement"
    assert restore_after == restore_step, "the woken copy rewrote the job's restore point"
    drops = [(a, b) for a, b in itertools.pairwise(seen) if b < a]
    assert drops == [], f"the job's step count went back: {drops}"
    assert watch.stop() == []
