"""A drain's round moves each job off with the engine's migration (operator_migrate),
which waits for a runtime reconnecting when a person asked (`gandiva migrate`:
tests/migration_helper/test_migrate_reconnecting.py). The drain, run inside every
scheduling round, must not wait so: a job whose runtime has not connected (launched
moments ago) held `gandiva drain`'s answer (and the round) 10 s per such job: two of
them, and the CLI's 15-s deadline ran out."""

from __future__ import annotations

import time
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.core import Settings

from .test_fencing import Fake


def test_a_drain_of_a_job_whose_runtime_has_not_connected_holds_no_scheduling_round(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    sched = make_scheduler(sqlite_url, tick_s=0.2, settings=Settings(down_after_s=600.0))
    f = Fake(sched.address, gpus={"a": 1, "b": 2})
    try:
        first = f.submit()
        server, _ = f.launched(first, wait_for)
        asked = time.monotonic()
        drain = f.api.DrainServer(scheduler_pb2.CordonServerRequest(server=server), timeout=30)
        answered = time.monotonic() - asked
        assert answered < 5.0, f"the drain answered after {answered:.1f}s"
        # Parked, saying why: the other server has the GPUs free (it said "no other server has
        # 1 free GPU(s)", as if the cluster were full, of a job it could not move for another reason).
        (move,) = [(m.action, m.note) for m in drain.jobs if m.job_id == first]
        assert move[0] == "park" and "free GPU" not in move[1] and "no runtime connected" in move[1], move
        second = f.submit()
        wait_for(lambda: f.job(second).state == common_pb2.JOB_STATE_RUNNING, 30)
        took = time.monotonic() - asked
        assert took < 5.0, f"a job submitted during the drain was placed {took:.1f}s later"
    finally:
        f.close()
