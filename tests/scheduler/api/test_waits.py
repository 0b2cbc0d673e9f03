"""The two questions users ask most about a job that does not run, over a real scheduler
(gRPC, SQLite, its policy and rounds; the test answers for the helper and the shims): where
a queued job stands in the queue and who is ahead of it, and when a suspended job's next turn
comes in its time-slice group. Each answer is checked against what the scheduler then does:
the jobs start in the order their places said, and resume in the order their turns said."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, helper_pb2, scheduler_pb2
from scheduler.core import Settings
from scheduler.policy.types import PolicyConfig

from ...integration.test_observe import CHROMIUM, chromium_dom
from .test_fencing import Fake

QUEUED, RUNNING, SUSPENDED = common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED


class Server:
    """Server "a" (one GPU): every launch gets a runtime that acknowledges each command; the
    launches are kept in the order they came."""

    def __init__(self, f: Fake) -> None:
        self.f, self.launched, self.incarnation = f, [], {}
        f.keep_alive("a")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            for cmd in self.f.commands("a"):
                if cmd.WhichOneof("body") == "launch":
                    job_id = cmd.launch.job_id
                    self.incarnation[job_id] = cmd.launch.incarnation
                    self.f.shim(job_id, cmd.launch.incarnation)
                    self.launched.append(job_id)
        except grpc.RpcError:  # the test is over: the stream was cancelled
            return

    def finish(self, job_id: str) -> None:
        self.f.helper.ReportProcessExit(helper_pb2.ProcessExitRequest(
            server="a", job_id=job_id, incarnation=self.incarnation[job_id], exit_code=0))


def _submit(f: Fake, name: str, priority: int = 0) -> str:
    spec = common_pb2.JobSpec(name=name, command=["python", "t.py"], gpus=1, priority=priority, steps=1000)
    return f.api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id


def test_a_queued_job_says_its_place_and_who_is_ahead_and_jobs_start_in_that_order(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, capsys: Any, monkeypatch: Any) -> None:
    from gandiva_cli.main import main

    # One job a GPU: the others queue. A later job of higher priority goes ahead of the earlier.
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=Settings(checkpoint_interval_s=0), http_listen="127.0.0.1:0",
                           policy_config=PolicyConfig(max_jobs_per_gpu=1, probe_slices=False, enable_packing=False,
                                                      enable_migration=False, enable_grow_shrink=False))
    f = Fake(sched.address, gpus={"a": 1})
    try:
        a = Server(f)
        first = _submit(f, "first")
        wait_for(lambda: f.job(first).state == RUNNING, 30)
        early, late, urgent = _submit(f, "early"), _submit(f, "late"), _submit(f, "urgent", priority=5)
        waits = wait_for(lambda: (w := {j: f.job(j).wait for j in (early, late, urgent)}) and all(w.values()) and
                         w[late].startswith("3rd") and w, 30)
        assert waits[urgent] == "1st of 3 in the queue", waits
        assert waits[early] == (f"2nd of 3 in the queue (priority, then submission); ahead of it: "
                                f"{urgent} (1 GPU, priority 5)"), waits
        assert waits[late].endswith(f"ahead of it: {urgent} (1 GPU, priority 5), {early} (1 GPU)"), waits
        # What it waits for is still its message (the policy's reason).
        assert "needs 1 GPUs, 0 free" in f.job(early).message
        # `describe job`, `get jobs -o wide` and the page say the same.
        at = ["--scheduler", sched.address]
        capsys.readouterr()
        assert main(["describe", "job", late, *at]) == 0
        assert re.search(rf"^Queue: +3rd of 3 in the queue .*{early} \(1 GPU\)$", capsys.readouterr().out, re.MULTILINE)
        assert main(["get", "jobs", early, "-o", "wide", *at]) == 0
        listed = capsys.readouterr().out
        assert "WAIT" in listed.splitlines()[0] and "2nd of 3 in the queue" in listed, listed
        with urllib.request.urlopen(f"http://{sched.server.http_address}/api/state", timeout=30) as r:
            page = {j["id"]: j for j in json.load(r)["jobs"]}
        assert page[late]["wait"] == waits[late] and page[first]["wait"] == "", page[late]
        # `gandiva top` too, first in the job's reason (its last decision, or its message).
        monkeypatch.setenv("COLUMNS", "400")
        assert main(["top", "--http", sched.server.http_address, "--once"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if late in line)
        assert f"{waits[late]}. needs 1 GPUs, 0 free" in row, row
        if CHROMIUM is not None or os.environ.get("GANDIVA_REQUIRE_BROWSER") == "1":  # the page, rendered
            dom = chromium_dom(f"http://{sched.server.http_address}/", budget_ms=4000)
            row = re.search(rf'<tr data-job="{late}">(.*?)</tr>', dom)
            assert row and f"3rd of 3 in the queue (priority, then submission); ahead of it: {urgent}" in row[1], dom
        # Then the scheduler starts them in that order, and the places move up.
        for running, nxt in ((first, urgent), (urgent, early)):
            a.finish(running)
            wait_for(lambda: a.launched[-1] != running, 30)  # noqa: B023 (called at once)
            assert a.launched[-1] == nxt, a.launched
        assert wait_for(lambda: f.job(late).wait, 30) == "the only job in the queue"
        assert f.job(early).wait == ""  # running: no place
        a.finish(early)
        wait_for(lambda: a.launched[-1] == late, 30)
        assert a.launched == [first, urgent, early, late]
    finally:
        f.close()


def _turn(f: Fake, ids: tuple[str, ...]) -> dict[str, common_pb2.Job]:
    return {j: f.job(j) for j in ids}


def test_a_suspended_job_says_when_its_turn_comes_and_the_group_resumes_in_that_order(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, capsys: Any) -> None:
    from gandiva_cli.main import main

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=Settings(checkpoint_interval_s=0),
                           policy_config=PolicyConfig(quantum_s=2.0, slice_slack_s=0.2, enable_packing=False,
                                                      enable_migration=False, enable_grow_shrink=False))
    f = Fake(sched.address, gpus={"a": 1})
    try:
        Server(f)
        ids = tuple(_submit(f, f"j{i}") for i in range(3))  # three jobs take turns on a/0
        wait_for(lambda: sum(f.job(j).state == RUNNING for j in ids) == 1 and
                 sum(f.job(j).state == SUSPENDED for j in ids) == 2, 30)
        checked = 0
        deadline = time.monotonic() + 60
        while checked < 2 and time.monotonic() < deadline:
            # Both waiting jobs' turns, read at one moment, naming the same running job.
            jobs = _turn(f, ids)
            waiting = {j: v for j, v in jobs.items() if v.state == SUSPENDED and v.wait}
            running = [j for j, v in jobs.items() if v.state == RUNNING]
            if len(waiting) != 2 or len(running) != 1 or not all(f"{running[0]} runs now" in v.wait
                                                                  for v in waiting.values()):
                time.sleep(0.05)
                continue
            read_at = time.time()
            by_place = sorted(waiting, key=lambda j: waiting[j].wait)  # "1st of 2 ..." before "2nd of 2 ..."
            nxt, after = by_place
            assert waiting[nxt].wait.startswith("1st of 2 to run next in its time-slice group on a/0 (3 jobs, slices of 2s"), waiting
            assert waiting[after].wait.startswith("2nd of 2 to run next") and f"runs now, then {nxt}" in waiting[after].wait
            due = re.search(r"\(in ~(\d+)s\)$|\(due now\)$", waiting[nxt].wait)
            assert due, waiting[nxt].wait
            if checked == 0:  # `describe job` shows it
                capsys.readouterr()
                assert main(["describe", "job", after, "--scheduler", sched.address]) == 0
                assert re.search(r"^Next turn: +2nd of 2 to run next", capsys.readouterr().out, re.MULTILINE)
            # The one said to be next is the next to run, not before its time.
            went = wait_for(lambda: [j for j in (nxt, after) if f.job(j).state == RUNNING], 30)  # noqa: B023
            assert went == [nxt], (went, waiting)
            resumed = f.job(nxt).history[-1]
            assert resumed.to_state == RUNNING
            expected = read_at + (int(due[1]) if due[1] else 0)
            # Measured: within 0.3 s of the time said; bounds for a loaded machine (its rounds late),
            # and a slice (2 s) early: where the running job's attained service is within a
            # round's delay of the next one's, the switch may come at the beat before.
            assert expected - 2.0 - 1.5 <= resumed.at <= expected + 15, (resumed.at, expected, waiting[nxt].wait)
            checked += 1
        assert checked == 2, "the group did not take two turns within 60 s"
    finally:
        f.close()
