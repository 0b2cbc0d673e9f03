"""Waiting clients outlive the scheduler: killed with -9 and restarted, a waiting
`gandiva-submit` and `gandiva get events --watch` reconnect by themselves, and the
event stream resumes after the last event seen (nothing lost, nothing twice)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_scheduler(bin_dir: Path, address: str, db_url: str, tmp: Path) -> subprocess.Popen:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [str(bin_dir / "gandiva"), "scheduler", "--listen", address, "--db", db_url,
         "--port-file", str(port_file), "--tick", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "scheduler did not start"
        time.sleep(0.05)
    return proc


def test_waiting_clients_reconnect_after_kill_9(sqlite_url: str, gandiva_home: Path,
                                                tmp_path: Path, bin_dir: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, GANDIVA_SCHEDULER=address)
    first = start_scheduler(bin_dir, address, sqlite_url, tmp_path)
    clients: list[subprocess.Popen] = []
    second = None
    guard: threading.Timer | None = None
    try:
        waiter = subprocess.Popen([str(bin_dir / "gandiva-submit"), "--name", "survivor", "--",
                                   "python", "t.py"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        watcher = subprocess.Popen([str(bin_dir / "gandiva"), "get", "events", "-w", "-o", "json"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        clients += [waiter, watcher]
        # Should the KILLED event never come, end the watcher so readline() returns.
        guard = threading.Timer(90, watcher.kill)
        guard.start()
        first_event = json.loads(watcher.stdout.readline())  # type: ignore[union-attr]
        assert first_event["kind"] == "job.submitted"
        job_id = first_event["job_id"]

        first.send_signal(signal.SIGKILL)
        first.wait()
        second = start_scheduler(bin_dir, address, sqlite_url, tmp_path)
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            stub.KillJob(scheduler_pb2.JobActionRequest(id=job_id, reason="after restart"))

        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 3, out + err
        assert "KILLED" in out.splitlines()[-1] and "after restart" in out

        events = [first_event]
        while not (events[-1]["kind"] == "job.state" and "KILLED" in events[-1]["message"]):
            events.append(json.loads(watcher.stdout.readline()))  # type: ignore[union-attr]
        ids = [e["id"] for e in events]
        assert ids == sorted(set(ids))  # resumed after the last id: no repeats, in order
        assert all(e["job_id"] == job_id for e in events)
    finally:
        if guard is not None:
            guard.cancel()
        for proc in clients:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        for sched in (first, second):
            if sched is not None and sched.poll() is None:
                sched.terminate()
                sched.wait(10)
    watcher_err = watcher.stderr.read() if watcher.stderr else ""  # type: ignore[union-attr]
    assert "reconnected to the scheduler" in watcher_err
