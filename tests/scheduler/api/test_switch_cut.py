"""A host cut off in the middle of a time-slice switch, over the real Helper and Runtime
APIs (a real scheduler, gRPC and SQLite; the test answers for the helper and the shims):
the running job's suspend is answered, its group-mate's resume goes into the cut link and
is never answered, and the helper's heartbeats stop. The server must be called down at its
heartbeat timeout and both jobs go back to the queue, holding no GPU; the scheduler's
rounds must not wait out the resume's command timeout meanwhile."""

from __future__ import annotations

import threading
import time
from typing import Any

from protos.gandiva.v1 import common_pb2, runtime_pb2, scheduler_pb2
from scheduler.core import Settings

from .test_fencing import Fake, scripted_shim

QUEUED, RUNNING, SUSPENDED = common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED


def test_a_host_cut_off_mid_time_slice_switch_is_called_down_at_its_timeout(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    from scheduler.policy.types import PolicyConfig

    settings = Settings(heartbeat_interval_s=0.2, down_after_s=2.0, command_timeout_s=60.0, checkpoint_interval_s=0)
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=settings, policy_config=PolicyConfig(
        quantum_s=2.0, enable_packing=False, enable_migration=False))
    f = Fake(sched.address, gpus={"a": 1})
    cut = threading.Event()
    armed = threading.Event()
    cut_at: list[float] = []

    def answer(cmd: Any, seen: list[Any]) -> runtime_pb2.CommandAck | None:
        if cut.is_set():
            return None
        if armed.is_set() and cmd.kind == runtime_pb2.COMMAND_KIND_RESUME:
            cut_at.append(time.monotonic())
            f.alive.discard("a")  # the link goes as the resume is on its way
            cut.set()
            return None
        return runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=10 + len(seen))

    try:
        f.keep_alive("a")
        jobs = [f.submit()]
        _, launch = f.launched(jobs[0], wait_for)
        f.shims.append(scripted_shim(f.ch, jobs[0], launch.incarnation, answer))
        jobs.append(f.submit())  # time-sliced with the first on a's one GPU
        launch = next(c.launch for c in f.commands("a")
                      if c.WhichOneof("body") == "launch" and c.launch.job_id == jobs[1])
        f.shims.append(scripted_shim(f.ch, jobs[1], launch.incarnation, answer))
        wait_for(lambda: {f.job(j).state for j in jobs} == {RUNNING, SUSPENDED}, 20)
        armed.set()  # the next switch: a suspend answered, a resume lost with the link
        wait_for(lambda: cut_at, 20)
        wait_for(lambda: all(f.job(j).state == QUEUED for j in jobs), 20)
        requeued_after = time.monotonic() - cut_at[0]
        print(f"\nboth re-queued {requeued_after:.2f}s after the cut (heartbeat timeout {settings.down_after_s}s)")
        assert requeued_after < settings.down_after_s + 3.0, f"re-queued {requeued_after:.1f}s after the cut"
        servers = {s.name: s for s in f.api.ListServers(scheduler_pb2.ListServersRequest()).servers}
        assert not servers["a"].up and servers["a"].allocated == 0
        assert all(not f.job(j).placement for j in jobs)
    finally:
        f.close()
