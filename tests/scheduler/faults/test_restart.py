"""The scheduler killed with -9 and restarted: every job, server, placement and
event is back, nothing lost or duplicated."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_scheduler(db_url: str, port: int, tmp: Path) -> subprocess.Popen:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", f"127.0.0.1:{port}",
         "--db", db_url, "--port-file", str(port_file), "--heartbeat-timeout", "120", "--tick", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"scheduler did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    return proc


def cluster_state(ch: grpc.Channel) -> tuple:
    stub = scheduler_pb2_grpc.SchedulerStub(ch)
    jobs = sorted(
        (j.id, j.state, tuple((g.server, g.index) for g in j.placement), j.spec.gpus)
        for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs
    )
    servers = sorted((s.name, s.gpus, s.allocated) for s in stub.ListServers(scheduler_pb2.ListServersRequest()).servers)
    events = [(e.id, e.kind, e.job_id) for e in stub.ListEvents(scheduler_pb2.ListEventsRequest()).events]
    return jobs, servers, events


def test_kill_9_and_restart_loses_nothing(sqlite_url: str, tmp_path: Path) -> None:
    port = free_port()
    proc = start_scheduler(sqlite_url, port, tmp_path)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            helper = helper_pb2_grpc.HelperStub(ch)
            helper.Register(helper_pb2.RegisterServerRequest(name="a", gpus=[common_pb2.Gpu(index=i) for i in range(4)]))
            commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="a"))
            ids = [
                stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=g))).job.id
                for g in (1, 1, 2, 4, 4)
            ]
            launched = {next(commands).launch.job_id for _ in range(3)}
            assert len(launched) == 3
            time.sleep(0.5)
            before = cluster_state(ch)
            commands.cancel()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc = start_scheduler(sqlite_url, port, tmp_path)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            after = cluster_state(ch)
        jobs_before, servers_before, events_before = before
        jobs_after, servers_after, events_after = after
        assert sorted(j[0] for j in jobs_after) == sorted(ids)  # none lost, none duplicated
        assert jobs_after == jobs_before  # same states and placements
        assert servers_after == servers_before
        assert events_after[: len(events_before)] == events_before
        assert len({e[0] for e in events_after}) == len(events_after)
        assert sum(1 for j in jobs_after if j[1] == common_pb2.JOB_STATE_RUNNING) == 3
    finally:
        proc.kill()
        proc.wait(10)
