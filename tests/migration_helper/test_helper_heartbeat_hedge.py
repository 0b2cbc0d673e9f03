"""A helper whose session's connection stops carrying answers (a flapping link: what a cut
dropped waits for TCP's next retransmission, its timeout grown through the cuts) while a
job trains there, the scheduler's heartbeat timeout 3 s (lease 1.8 s).

The session ends only once a heartbeat has gone unanswered for 5 s (a late link must not
end it). Before, nothing reached the scheduler meanwhile: it called the server down at its
timeout and re-queued the job, whose process the lease had frozen. Now a heartbeat that
has waited 1 s is followed by others over new connections, answered at once: the server
stays up, the job trains on in its process, never frozen.

A real scheduler (in process, real gRPC and SQLite), a real helper and its job's process;
between them a relay (tests/migration_helper/test_helper_reregister.py) that holds the
scheduler's answers on the connection open when told, and passes those opened after.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc

from migration_helper.config import HelperConfig
from migration_helper.daemon import RPC_TIMEOUT_S, HelperDaemon
from migration_helper.gpus import CpuBackend
from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.core import Settings

from .test_helper_faults import _job_pids
from .test_helper_reregister import StallingRelay


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def test_a_helper_whose_connection_holds_every_answer_is_heard_over_a_new_one_before_its_timeout(
        make_scheduler: Any, sqlite_url: str, tmp_path: Path, submit_endless: Any) -> None:
    settings = Settings(heartbeat_interval_s=0.2, down_after_s=3.0)  # lease 1.8 s
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=settings)
    relay = StallingRelay(sched.address)
    await relay.start()
    daemon = HelperDaemon(HelperConfig(server_name="s1", scheduler=relay.address, ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs"), CpuBackend(1, "s1"))
    await daemon.start()
    channel = grpc.aio.insecure_channel(sched.address)
    api = scheduler_pb2_grpc.SchedulerStub(channel)

    async def until(what: str, predicate: Any, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while not (got := await predicate()):
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)
        return got

    async def job() -> common_pb2.Job:
        return await api.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=5)

    try:
        await asyncio.wait_for(daemon.registered.wait(), 10)
        job_id, _ = await asyncio.to_thread(submit_endless, scheduler_pb2_grpc.SchedulerStub(
            grpc.insecure_channel(sched.address)))

        async def trains() -> bool:
            return (await job()).steps >= 5

        await until("the job never trained", trains)
        (pid,) = _job_pids(job_id, warm=False)
        history = list((await job()).history)
        relay.stall(new=0)
        stalled_at, states = time.monotonic(), set()
        # Past the session's end (a heartbeat unanswered for RPC_TIMEOUT_S) and its new one.
        while time.monotonic() - stalled_at < RPC_TIMEOUT_S or daemon.sessions < 2:
            assert time.monotonic() - stalled_at < RPC_TIMEOUT_S + 15, "no new session"
            states.add(_state(pid))
            await asyncio.sleep(0.05)
        print(f"\n{daemon.hedged_heartbeats} heartbeat(s) answered over a new connection; "
              f"sessions {daemon.sessions}; process states seen {sorted(states)}")
        events = (await api.ListEvents(scheduler_pb2.ListEventsRequest(kinds=["server.down"]))).events
        assert [e.message for e in events] == []
        got = await job()
        assert (got.state, list(got.history)) == (common_pb2.JOB_STATE_RUNNING, history), got.history[-1].reason
        assert _job_pids(job_id, warm=False) == [pid]
        assert "T" not in states, "the lease froze the job"
        assert daemon.hedged_heartbeats >= 2
    finally:
        await daemon.stop()
        await relay.stop()
        await channel.close()
