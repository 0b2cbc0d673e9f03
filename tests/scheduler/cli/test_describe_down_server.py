"""What an operator reads about a server whose helper stopped heartbeating (a real scheduler,
gRPC, SQLite and its HTTP port; the test speaks for the helper): `gandiva describe server`
said only "Up: no" beside "Status: ready" (and `get servers` STATUS "ready"), and it, `gandiva top` and the page showed its GPUs'
utilization as of the last sample before it went down, as if now."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from protos.gandiva.v1 import helper_pb2, scheduler_pb2
from scheduler.core import Settings

from ..api.test_fencing import Fake


def test_a_down_server_says_since_when_why_and_what_brings_it_back(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from gandiva_cli import main as gandiva_main

    sched = make_scheduler(sqlite_url, tick_s=0.2, http_listen="127.0.0.1:0",
                           settings=Settings(heartbeat_interval_s=0.2, down_after_s=2.0))
    f = Fake(sched.address, gpus={"a": 1, "b": 1})
    try:
        f.keep_alive("a", "b")
        f.helper.ReportGpuSamples(helper_pb2.GpuSamplesRequest(
            server="a", samples=[helper_pb2.GpuSample(gpu_index=0, at=time.time(), utilization=0.57)]))
        wait_for(lambda: any(g.utilization > 0.5 for s in f.api.ListServers(scheduler_pb2.ListServersRequest()).servers
                             for g in s.gpu_list if s.name == "a"), 20)
        f.alive.discard("a")  # its helper stops heartbeating
        wait_for(lambda: not next(s for s in f.api.ListServers(scheduler_pb2.ListServersRequest()).servers
                                  if s.name == "a").up, 20)
        capsys.readouterr()
        assert gandiva_main.main(["describe", "server", "a", "--scheduler", sched.address]) == 0
        text = capsys.readouterr().out
        up = next(line for line in text.splitlines() if line.startswith("Up:"))
        assert up.split(None, 1)[1].startswith("no: down since ") and "(no heartbeat for " in up, up
        assert "went back to the queue" in up and "restart `gandiva helper` there" in up, up
        assert "57%" not in text and "  0  -  -  jobs: -" in text, text
        assert re.search(r"^Status:\s+down$", text, re.MULTILINE), text  # it read "ready"
        assert gandiva_main.main(["get", "servers", "--scheduler", sched.address]) == 0
        status = {line.split()[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:]}
        assert status == {"a": "down", "b": "ready"}, status
        assert gandiva_main.main(["top", "--once", "--http", sched.server.http_address]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if "a (down)" in line)
        assert "57%" not in row and " - " in row, row
        # A server up says so plainly, with its utilization.
        assert gandiva_main.main(["describe", "server", "b", "--scheduler", sched.address]) == 0
        text = capsys.readouterr().out
        assert re.search(r"^Up:\s+yes$", text, re.MULTILINE) and "  0  -  0%  jobs: -" in text, text
    finally:
        f.close()
