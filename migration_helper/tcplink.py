"""What the kernel knows of this process's TCP connections to a peer: whether a link that
carries a checkpoint's stream is cut (Linux's TCP_INFO, read off gRPC's own sockets).

gRPC hides its sockets, and its own liveness checks (HTTP/2 pings) wait behind the
checkpoint's bytes on a slow link, so they cannot tell slow from cut (agent.py). The
kernel can: on a live link, however slow, the peer's ACKs keep arriving as its data
drains; on a cut one none arrive while our bytes wait to be acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Iterator

# struct tcp_info (linux/tcp.h): u8 x8, then u32s; tcpi_unacked is the 5th u32 (offset 24),
# tcpi_last_ack_recv the 13th (offset 56), in ms.
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_UNACKED_AT, _LAST_ACK_AT = 24, 56


def tcp_sockets() -> Iterator[socket.socket]:
    """This process's connected TCP sockets, each as a duplicate closed after its step
    (gRPC's own stay open)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except (OSError, ValueError):
            continue
        with sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                sock.getpeername()
            except OSError:
                continue  # a listening socket, or one not connected
            yield sock


def _connections(peers: set[tuple[str, int]]) -> Iterator[tuple[socket.socket, int, float]]:
    """This process's TCP connections to ``peers`` ((address, port) pairs), with the
    segments not yet acknowledged and the seconds since the peer's last ACK."""
    for sock in tcp_sockets():
        try:
            peer = sock.getpeername()
            info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)
        except OSError:
            continue
        if (_plain(peer[0]), peer[1]) not in peers or len(info) < _LAST_ACK_AT + 4:
            continue
        (unacked,) = struct.unpack_from("I", info, _UNACKED_AT)
        (last_ack_ms,) = struct.unpack_from("I", info, _LAST_ACK_AT)
        yield sock, unacked, last_ack_ms / 1000.0


def unacked_silence_s(peers: set[tuple[str, int]]) -> float | None:
    """Seconds since the least silent of this process's TCP connections to ``peers`` last
    heard an ACK, counted only over connections that hold bytes not yet acknowledged.
    None when any such connection holds none (nothing waits on the link), or when there
    is none to look at (not Linux, or no connection)."""
    silences: list[float] = []
    for _, unacked, silent in _connections(peers):
        if not unacked:
            return None
        silences.append(silent)
    return min(silences) if silences else None


def abort_silent(peers: set[tuple[str, int]], limit_s: float) -> int:
    """Shuts down this process's connections to ``peers`` that have waited ``limit_s`` or
    more for an ACK; returns how many. gRPC's own close of such a connection waits on the
    kernel, which retries a cut link for up to ~15 minutes (tcp_retries2): meanwhile
    gRPC could not shut down (a helper stopping hung at exit). Once shut down, gRPC's
    writes fail at once; the kernel alone still tries to deliver the unsent bytes."""
    aborted = 0
    for sock, unacked, silent in _connections(peers):
        if unacked and silent >= limit_s:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
                aborted += 1
    return aborted


def _plain(address: str) -> str:
    """An IPv4 address as itself where an IPv6 socket shows it mapped (::ffff:10.0.0.1)."""
    return address.removeprefix("::ffff:")


async def peers_of(address: str) -> set[tuple[str, int]]:
    """The (address, port) pairs a gRPC target "host:port" may be connected at."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    return {(_plain(str(info[4][0])), int(info[4][1])) for info in infos}
