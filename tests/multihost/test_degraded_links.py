"""Degraded links on the multi-host cluster (each host its own network namespace), where
test_multihost_faults.py and test_i9s_faults.py cut links cleanly: a helper whose link to
the scheduler is late (delay and jitter), a one-way partition, a slow link between two
helpers while a migration streams its checkpoint. Each job is the feed_step program; it
must end once, with exactly its mini-batches and the uninterrupted run's variables, and
never train in two places at once (the sampler). How each degradation is made on a
kernel without netem: tests/multihost/degrade.py."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2

from . import degrade
from .conftest import SCHED_PORT, assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import _ends_once, _no_two_copies, _states

Cluster = Any  # the `multihost` fixture's Cluster (tests/multihost/conftest.py)
RUNNING = common_pb2.JOB_STATE_RUNNING

pytestmark = [pytest.mark.tf, pytest.mark.slow]

STEPS = 400  # as test_i9s_faults.py: one uninterrupted run serves them all


class DownWatch:
    """Records every server the scheduler shows down, throughout."""

    def __init__(self, c: Cluster) -> None:
        self.c, self.down, self._stop = c, set(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(grpc.RpcError):  # the scheduler busy: look again
                self.down |= {n for n, up in self.c.servers().items() if not up}

    def stop(self) -> set[str]:
        self._stop.set()
        return self.down


@pytest.mark.parametrize("multihost", [{"heartbeat_timeout": 10.0}], indirect=True)
def test_degraded_late_heartbeats_neither_call_the_host_down_nor_move_its_job(
        multihost: Cluster, tmp_path: Path) -> None:
    """h1 reaches the scheduler through a link that holds every chunk 0.3-2 s each way
    (round trips up to 4 s; the scheduler's defaults: lease 6 s, down after 10 s). Its
    heartbeats come late but come: h1 is never called down, its job is never re-placed
    (h2 stands by) and ends there once, bit-identical; never two copies."""
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    ns, _ = c.net.add_host("h1")
    relay = degrade.DelayRelay(ns, 40000, f"{c.sched_addr}:{SCHED_PORT}", 1.15, 0.85, c.tmp / "relay.log")
    try:
        c.add_helper("h1", scheduler=relay.address)
        dump = c.tmp / "final.npz"
        job_id = c.submit("late", feed_command(STEPS, dump))
        c.wait(lambda: (j := c.job(job_id)).steps > 20 and j.state == RUNNING, 120)
        c.add_helper("h2")
        watch = DownWatch(c)
        started = time.monotonic()
        done = _ends_once(c, job_id, STEPS, 240)
        down = watch.stop()
        took = time.monotonic() - started
    finally:
        relay.close()
    log = (c.tmp / "h1.log").read_text()
    print(f"\nlate link: {log.count('freezing jobs')} freezes, trained to its end in {took:.1f}s")
    assert down == set(), f"called down: {down}"
    assert {g.server for g in done.placement} <= {"h1"}
    assert _states(done).count("RUNNING") == 1, _states(done)  # launched once, on h1
    assert "freezing jobs" not in log, "h1 froze its job although every heartbeat was answered"
    assert_bit_identical(dump, STEPS, tmp_path)
    _no_two_copies(c)
