"""A helper whose link flaps gets its new session within a couple of seconds.

On a link cut and restored every 1-3 s, what a cut drops waits for TCP's next
retransmission, whose timeout doubles at each loss: a connection that lived through a few
cuts answered seconds after the link was back (`ss -ti` showed 1.7-3.5 s), while a new
connection answered at once. The helper used to register again over such a connection (gRPC
shares one per address across a process's channels), one try every 5 s, and took 9-18 s
to get a new session (tests/multihost/test_flapping_link.py).

Here a relay between the helper and its scheduler (LocalControl, real gRPC) plays such a
link: from the moment it is told, every connection it carries, and the next one opened
through it, hold what the scheduler sends back (the helper's bytes still arrive);
connections opened after that pass.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from migration_helper.config import HelperConfig
from migration_helper.daemon import RPC_TIMEOUT_S, HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl

from ..relay import Relay as StallingRelay  # (test_helper_heartbeat_hedge imports it from here)


async def test_a_helper_whose_answers_are_held_registers_again_over_a_new_connection_at_once(tmp_path: Path) -> None:
    control = LocalControl(heartbeat_interval_s=0.2)
    await control.start()
    relay = StallingRelay(control.address)
    await relay.start()
    daemon = HelperDaemon(HelperConfig(server_name="s1", scheduler=relay.address, ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs"), CpuBackend(1, "s1"))
    await daemon.start()
    try:
        await asyncio.wait_for(daemon.registered.wait(), 10)
        assert control.registrations["s1"] == 1
        relay.stall(new=1)
        stalled_at = time.monotonic()
        # The session ends once a heartbeat has gone unanswered for RPC_TIMEOUT_S.
        while daemon.registered.is_set():
            assert time.monotonic() - stalled_at < RPC_TIMEOUT_S + 10, "the session never ended"
            await asyncio.sleep(0.02)
        ended_at = time.monotonic()
        await asyncio.wait_for(daemon.registered.wait(), RPC_TIMEOUT_S + 10)
        gap = time.monotonic() - ended_at
        # Its first try, over the stalled new connection, got no answer (whether or not gRPC sent
        # it before the scheduler's HTTP/2 settings came back); another new one did.
        # Before: every try went over the held connection (gRPC shares one per address), one
        # every 5 s, and none was answered within 15 s.
        assert control.registrations["s1"] >= 2 and len(relay.connections) >= 3, relay.connections
        assert gap < RPC_TIMEOUT_S - 1.5, f"a new session took {gap:.1f}s after the old one ended"
        print(f"\nnew session {gap:.2f}s after the old one ended, over connection {len(relay.connections)}")
        # The new session works: its heartbeats are answered (the lease is renewed).
        beats = control.heartbeats.get("s1")
        await asyncio.sleep(1.0)
        assert control.heartbeats.get("s1") is not beats and daemon.registered.is_set() and not daemon.frozen
    finally:
        await daemon.stop()
        await relay.stop()
        await control.stop()
