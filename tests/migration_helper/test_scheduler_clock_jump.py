"""The scheduler's wall clock stepped (NTP correcting a drifted clock, an operator's
`date -s`, a VM resumed with a stale clock), or the scheduler stopped for longer than
the heartbeat timeout (SIGSTOP, a paused VM), while a job trains: its server is not
marked down, its job not killed and re-queued; stepped back, its periodic checkpoints
go on. The scheduler runs under libfaketime
(its CLOCK_REALTIME moved, its monotonic clock untouched, as on a real step); the
helper and the job run on the real clock."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from ..multihost.conftest import WallClock
from ..scheduler.faults.test_restart import free_port
from .test_helper_faults import GANDIVA, _job_pids, helpers  # noqa: F401 - helpers: a fixture


def still_running(api: Any, job_id: str, history: list[Any], pid: int) -> None:
    """The job as it was: running, in the same process, no server down, nothing fenced."""
    got = api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=30)
    assert (got.state, list(got.history)) == (common_pb2.JOB_STATE_RUNNING, history), \
        (got.state, got.history[-1].reason)
    assert _job_pids(job_id, warm=False) == [pid]
    kinds = [e.kind for e in api.ListEvents(scheduler_pb2.ListEventsRequest(), timeout=30).events]
    assert "server.down" not in kinds and "job.fenced" not in kinds, kinds
    assert [s.up for s in api.ListServers(scheduler_pb2.ListServersRequest(), timeout=30).servers] == [True]


def test_a_step_of_the_schedulers_wall_clock_or_a_stall_of_it_takes_no_server_down(
        helpers: Any, tmp_path: Path, submit_endless: Any, wait_for: Any, sqlite_schema: Path) -> None:  # noqa: F811
    clock = WallClock(tmp_path)  # skips, saying why, without libfaketime
    shutil.copyfile(sqlite_schema, tmp_path / "db")  # no migration to wait for
    port, port_file = free_port(), tmp_path / "port"
    with open(tmp_path / "scheduler.err", "w") as err:
        sched = subprocess.Popen(
            [*GANDIVA, "scheduler", "--listen", f"127.0.0.1:{port}", "--db", f"sqlite+aiosqlite:///{tmp_path / 'db'}",
             "--port-file", str(port_file), "--tick", "0.1", "--heartbeat-interval", "0.2",
             "--heartbeat-timeout", "6", "--checkpoint-interval", "2"],
            env={**os.environ, **clock.env()}, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(port_file.exists, 120)
        assert WallClock.loaded_in(sched.pid)
        address = f"127.0.0.1:{port}"
        api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        helper = helpers("s1", address)
        # Its server registered first (the submission's 5-s deadline on a loaded machine).
        wait_for(lambda: len(api.ListServers(scheduler_pb2.ListServersRequest(), timeout=30).servers) == 1, 60)
        job_id, _ = submit_endless(api)

        def job() -> Any:  # with a deadline a starved scheduler meets (the fixture's is 5 s)
            return api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=30)
        wait_for(lambda: job().steps >= 5, 90)
        (pid,) = _job_pids(job_id, warm=False)
        history = list(job().history)  # submitted, placed
        # An hour forward, while the helper is quiet for 2 s (under the 6 s heartbeat
        # timeout): the scheduler's first rounds after the step see its last heartbeat an
        # hour old on the wall clock (read every second: FAKETIME_CACHE_DURATION). (With a
        # 4 s timeout the test failed once at load ~12: a helper stopped 2 s, then starved,
        # had only 2 s to be heard again; now 4 s, and 4.5 s after the stall below.)
        os.kill(helper.pid, signal.SIGSTOP)
        try:
            clock.set(3600)
            time.sleep(2)
        finally:
            os.kill(helper.pid, signal.SIGCONT)
        time.sleep(1)
        still_running(api, job_id, history, pid)

        # The scheduler itself stopped (SIGSTOP: a paused VM) for longer than the timeout,
        # and its helpers heard again only moments after it runs again (their connections
        # re-made): as after a restart, they get a whole timeout to be heard.
        os.kill(helper.pid, signal.SIGSTOP)
        os.kill(sched.pid, signal.SIGSTOP)
        try:
            time.sleep(7)  # over the 6 s timeout
        finally:
            os.kill(sched.pid, signal.SIGCONT)
            time.sleep(1.5)
            os.kill(helper.pid, signal.SIGCONT)
        time.sleep(1)
        still_running(api, job_id, history, pid)

        # The wall clock stepped back an hour (NTP putting right the step above). Before, the
        # periodic checkpoints (every 2 s here) stopped for that hour: the round that asks
        # for them, and each job's interval, were measured on the stepped clock (a host lost
        # then lost an hour of training). Now the scheduler's clock never goes back
        # (scheduler.wallclock), and they go on.
        def checkpoints() -> int:
            events = api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id), timeout=30).events
            return sum(e.kind == "job.checkpoint" for e in events)

        wait_for(lambda: checkpoints() >= 1, 60)
        worked = job().gpu_seconds
        clock.set(0)
        time.sleep(1.5)  # the offset file is read every second
        then = checkpoints()
        # Nor does its GPU time fall back by the hour (it was read on the system's clock).
        assert job().gpu_seconds >= worked
        wait_for(lambda: checkpoints() >= then + 2, 60)
        assert [s.up for s in api.ListServers(scheduler_pb2.ListServersRequest(), timeout=30).servers] == [True]
    finally:
        sched.kill()
        sched.wait(10)
