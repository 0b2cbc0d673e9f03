"""What a user is told about a job placed onto a GPU whose job has not left it yet, over the
real Scheduler, Helper and Runtime APIs (a real scheduler, gRPC and SQLite; the test answers
for the helper and the shims). A newcomer is time-sliced onto the GPU of a job that has not
reached a mini-batch boundary (in `gandiva demo`, one still importing TensorFlow: 20 s): the
scheduler puts its start off until that job's suspension is acknowledged. Before, the job
showed QUEUED with the message it had at submission ("waiting for a placement") the whole
time, while the dashboard's last decision said it had been placed; the reason was only in
the scheduler's log."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from protos.gandiva.v1 import common_pb2, runtime_pb2
from scheduler.core import Settings

from .test_fencing import Fake, scripted_shim

QUEUED, RUNNING, SUSPENDED = common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED


def test_a_job_whose_start_waits_for_the_gpu_to_be_left_says_so_and_whom_it_waits_for(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    from scheduler.policy.types import PolicyConfig

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=Settings(checkpoint_interval_s=0), http_listen="127.0.0.1:0",
                           policy_config=PolicyConfig(quantum_s=2.0, enable_packing=False, enable_migration=False))
    sched.server.engine.vacate_timeout_s = 1.0  # the round waits this long for the suspension, then defers
    f = Fake(sched.address, gpus={"a": 1})
    boundary = threading.Event()  # the first job reaches its first mini-batch boundary

    def answer(cmd: Any, seen: list[Any]) -> runtime_pb2.CommandAck | None:
        if cmd.kind == runtime_pb2.COMMAND_KIND_SUSPEND:
            boundary.wait(60)  # acknowledged at the boundary, as a real shim does
        return runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=1 + len(seen))

    try:
        f.keep_alive("a")
        first = f.submit()
        _, launch = f.launched(first, wait_for)
        f.shims.append(scripted_shim(f.ch, first, launch.incarnation, answer))
        wait_for(lambda: f.job(first).state == RUNNING, 20)
        second = f.submit()  # time-sliced onto a/0 with the first
        said = wait_for(lambda: (j := f.job(second)).state == QUEUED and "not started yet" in j.message
                        and j.message, 30)
        # `describe` / `get jobs -o wide` (Message): placed where, why, and whom it waits for.
        assert said.startswith("placed on a/0 (Algorithm 1: oversubscribe), not started yet: ")
        assert first in said and ("has not left it" in said or "is leaving it" in said), said
        # The dashboard and `gandiva top` show the same for it, not "place: ..." as if it ran.
        with urllib.request.urlopen(f"http://{sched.server.http_address}/api/state", timeout=30) as r:
            view = {j["id"]: j for j in json.load(r)["jobs"]}
        row = view[second]
        assert row["state"] == "QUEUED" and row["last_decision"] is None and "not started yet" in row["message"], row
        # Once the first job is suspended at its boundary the second starts, and says so.
        events_before = len(f.job(second).history)
        boundary.set()
        wait_for(lambda: f.job(second).state == RUNNING and f.job(first).state == SUSPENDED, 30)
        now = f.job(second)
        assert len(now.history) == events_before + 1 and "not started yet" not in now.message, now.message
        assert now.message.startswith("Algorithm 1: oversubscribe on a/0"), now.message
    finally:
        boundary.set()
        f.close()
