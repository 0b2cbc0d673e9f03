"""A helper stopped cleanly (SIGTERM, `systemctl stop`) says so: its server goes down at once
and its name is free for the restart. It used to stay up until the heartbeat timeout, so jobs
were placed on a server nobody ran (and came back 8 s later), and the restarted helper was
refused its own name ("held by another live helper") for as long."""

from __future__ import annotations

import time
from typing import Any

from protos.gandiva.v1 import scheduler_pb2

from .test_helper_with_scheduler import helpers, servers, stub

__all__ = ["helpers"]  # the fixture, shared


def test_a_helper_stopped_cleanly_takes_its_server_down_at_once_and_frees_its_name(
        scheduler_server: Any, helpers: Any, wait_for: Any) -> None:
    api = stub(scheduler_server.address)
    first = helpers("h1")
    wait_for(lambda: (s := servers(api).get("h1")) is not None and s.up, 30)
    first.terminate()
    assert first.wait(15) == 0
    wait_for(lambda: not servers(api)["h1"].up, 5)  # the heartbeat timeout here is 10 s
    events = api.ListEvents(scheduler_pb2.ListEventsRequest(limit=200), timeout=5).events
    assert any(e.kind == "server.down" and e.message == "its helper stopped" for e in events)
    helpers("h1")  # the restart, under the same name
    wait_for(lambda: servers(api)["h1"].up, 30)
    # Taken on its first try: a name still held refuses the restart (a server.refused event)
    # until the old instance has been silent the heartbeat timeout. Before, this was timed
    # (up within 9 s of the stop), which a new helper process's start alone outlasted on a
    # loaded machine (21 s beside 3 CPU burners, load 20).
    events = api.ListEvents(scheduler_pb2.ListEventsRequest(server="h1", limit=200), timeout=5).events
    assert [e.message for e in events if e.kind == "server.refused"] == []


def test_a_helper_without_its_scheduler_says_what_to_check_and_does_not_repeat_itself(tmp_path: Any) -> None:
    """Started before its scheduler (or given a wrong --scheduler), it logged "scheduler
    session ended (... Connection refused); reconnecting" every 2 s for as long as that
    lasted, and never said what to check."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = tmp_path / "helper.err"
    with open(err, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gandiva_cli.main", "helper", "--server-name", "alone", "--gpus", "1",
             "--virtual", "--scheduler", f"127.0.0.1:{port}", "--ramdisk", str(tmp_path / "ram"),
             "--log-dir", str(tmp_path / "logs")], stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while "scheduler session ended" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(4)  # tries at 0.2, 0.4, 0.8, 1.6, 2 s: several more in this time
    finally:
        proc.terminate()
        proc.wait(15)
    said = [line for line in err.read_text().splitlines() if "scheduler session ended" in line]
    assert len(said) == 1, said
    assert f"is the scheduler running at 127.0.0.1:{port}? (start it with `gandiva scheduler`, or give this " \
           "helper --scheduler ADDR or GANDIVA_SCHEDULER)" in said[0]
