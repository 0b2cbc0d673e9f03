"""The kernel's side of a helper agent's connections: a checkpoint stream over a slow link
must not be dropped by a TCP timeout shorter than the transfer's own limit (the slow-link
run itself, ~90 s, is tests/multihost/test_degraded_transfer.py)."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from migration_helper.agent import TRANSFER_LIMIT_S, agent_server
from migration_helper.ramdisk import Ramdisk
from migration_helper.tcplink import tcp_sockets
from scheduler.transport import aio_channel

TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)  # Linux's number


def _user_timeouts_ms(port: int) -> dict[str, int]:
    """TCP_USER_TIMEOUT of this process's TCP sockets on `port`: 'accepted' (the agent's
    end of a connection) and 'connecting' (the sender's end)."""
    found: dict[str, int] = {}
    for sock in tcp_sockets():
        local, peer = sock.getsockname()[1], sock.getpeername()[1]
        if port in (local, peer):
            found["accepted" if local == port else "connecting"] = sock.getsockopt(
                socket.IPPROTO_TCP, TCP_USER_TIMEOUT)
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_USER_TIMEOUT is read the Linux way (/proc/self/fd)")
def test_the_agents_connections_outlast_the_transfer_limit_in_the_kernel(tmp_path: Path) -> None:
    """gRPC gives every connection a server accepts TCP_USER_TIMEOUT = 20 s: the kernel drops
    it once a segment of the server's has waited 20 s for its ACK. Over a 96 kbit/s link the
    sender's ACKs queue behind its own checkpoint bytes (17 s measured, `ss -ti` in the
    agent's namespace), so the agent's kernel dropped 2 of 5 1-MB streams 58-60 s in
    (TcpExtTCPAbortOnTimeout 1; the sender: "Connection reset by peer"). Now the agent's end
    waits as long as the stream may."""
    async def run() -> dict[str, int]:
        disk = Ramdisk(tmp_path / "rd")
        disk.prepare()
        server = agent_server(disk)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio_channel(f"127.0.0.1:{port}") as channel:
                await asyncio.wait_for(channel.channel_ready(), 20)
                for _ in range(100):  # the accepted end is set up right after the handshake
                    got = _user_timeouts_ms(port)
                    if len(got) == 2:
                        return got
                    await asyncio.sleep(0.05)
                return got
        finally:
            await server.stop(0)

    got = asyncio.run(run())
    assert got.keys() == {"accepted", "connecting"}, got
    assert got["accepted"] >= TRANSFER_LIMIT_S * 1000, got
    assert got["connecting"] == 0, got  # the sender's end: the kernel's default (none), as before
