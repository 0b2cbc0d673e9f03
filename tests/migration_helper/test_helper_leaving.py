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
    stopped = time.monotonic()
    wait_for(lambda: not servers(api)["h1"].up, 5)  # the heartbeat timeout here is 10 s
    events = api.ListEvents(scheduler_pb2.ListEventsRequest(limit=200), timeout=5).events
    assert any(e.kind == "server.down" and e.message == "its helper stopped" for e in events)
    helpers("h1")  # the restart, under the same name
    wait_for(lambda: servers(api)["h1"].up, 5)
    assert time.monotonic() - stopped < 9
