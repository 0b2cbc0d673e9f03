"""describe's Waiting line on a cluster with tokens, where a user may not look at the other
users' jobs sharing their GPU."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler import transport

from ..security.conftest import make_token
from .conftest import ScriptedHelper


def test_a_suspended_jobs_waiting_line_does_not_say_nothing_runs_when_another_users_job_does(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, gandiva: Any) -> None:
    """Alice's job waiting its turn behind Bob's on one GPU said `nothing runs there at this
    moment`: Bob's job, which Alice may not look at, was skipped as if it had ended."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token")
    tokens = {name: make_token(sched.db_url, name) for name in ("alice", "bob")}
    helper = ScriptedHelper(sched.address, wait_for, name="n1", gpus=1,
                            token=make_token(sched.db_url, "n1", "helper"))
    channels = {n: transport.channel(sched.address, transport.ClientSecurity(t)) for n, t in tokens.items()}
    try:
        stubs = {n: scheduler_pb2_grpc.SchedulerStub(ch) for n, ch in channels.items()}
        ids = {n: stubs[n].SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["python", "t.py"], gpus=1, name=f"{n}-job"))).job.id for n in ("alice", "bob")}

        # Both placed on the one GPU (time-slicing); Alice's takes its turn to wait, as a round
        # would suspend it (the scripted helper's jobs have no shim to obey a suspend).
        wait_for(lambda: all(stubs[n].GetJob(scheduler_pb2.GetJobRequest(id=j)).placement for n, j in ids.items()), 30)
        with sqlite3.connect(sched.db_url.split("///", 1)[1]) as db:
            db.execute("UPDATE jobs SET state = 'SUSPENDED' WHERE id = ?", (ids["alice"],))
        user, job = "alice", ids["alice"]
        other = next(n for n in ids if n != user)
        text = gandiva("describe", "job", job, "--scheduler", sched.address, "--token", tokens[user]).out
        line = re.search(r"Waiting: +(.*)", text)
        assert line is not None, text
        assert line[1] == ("its turn on n1:0, time-slicing with 1 other job(s); 1 of them another user's "
                           "(not shown to you)"), line[1]
        assert f"{other}-job" not in text and ids[other] not in text
    finally:
        for ch in channels.values():
            ch.close()
        helper.close()
