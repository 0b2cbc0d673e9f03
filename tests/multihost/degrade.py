"""Degraded links for the multi-host harness (tests/multihost/conftest.py): late,
slow and one-way links, where the harness's own faults cut a link cleanly.

This machine's kernel has no `netem` qdisc (`tc qdisc add ... netem` answers "Specified
qdisc kind is unknown"), no tc actions and no iptables, so each degradation is made with
what it does have:

- delay and jitter: `DelayRelay`, a TCP relay run inside a host's namespace that
  holds every chunk it forwards for a random delay (order kept, as TCP keeps it). The
  host's helper (and its jobs) reach the scheduler through it;
- a bandwidth cap: `tc qdisc htb` with a `u32` filter on the host's veth, for the
  traffic to one peer address only (tbf and htb are built; `cap_to`);
- a one-way partition: a `blackhole` route to one address in one host's namespace: that
  host's packets to it are dropped as they leave, while the peer's still arrive
  (`one_way`).

Everything is undone when the namespaces are deleted (the harness's cleanup); `uncap`
and `two_way` undo it earlier.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _ns(ns: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True, text=True)


def cap_to(ns: str, dev: str, peer: str, rate: str) -> None:
    """Traffic leaving `dev` in `ns` for the address `peer` is capped at `rate` (tc's
    units, "1mbit"); everything else leaves at 10 gbit."""
    if shutil.which("tc") is None:
        import pytest

        pytest.skip("iproute2's `tc` is not installed: a link cannot be capped")
    _ns(ns, "tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
    _ns(ns, "tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate,
        "ceil", rate, "burst", "16k")
    _ns(ns, "tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit")
    _ns(ns, "tc", "filter", "replace", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
        "match", "ip", "dst", f"{peer}/32", "classid", "1:10")


def uncap(ns: str, dev: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False,
                   capture_output=True)


def one_way(ns: str, peer: str) -> None:
    """Packets from `ns` to `peer` are dropped (the peer's to `ns` still arrive)."""
    _ns(ns, "ip", "route", "add", "blackhole", f"{peer}/32")


def two_way(ns: str, peer: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "ip", "route", "del", "blackhole", f"{peer}/32"], check=False,
                   capture_output=True)


class DelayRelay:
    """`python degrade.py relay` in namespace `ns`: listens on 127.0.0.1:`port` and
    forwards to `target`, each chunk held `delay_s` +- `jitter_s` (uniform) in each
    direction."""

    def __init__(self, ns: str, port: int, target: str, delay_s: float, jitter_s: float, log: Path) -> None:
        self.address = f"127.0.0.1:{port}"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, __file__, "relay", "--port", str(port),
                 "--target", target, "--delay", str(delay_s), "--jitter", str(jitter_s)],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while b"listening" not in log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the delay relay did not start: {log.read_text()[-500:]}")
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, jitter: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def deliver() -> None:
        while True:
            at, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, at - loop.time()))
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            # Never before the chunk ahead of it: a TCP stream arrives in order.
            last = max(last, loop.time() + delay + random.uniform(-jitter, jitter))
            queue.put_nowait((last, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
        writer.close()


async def _relay(port: int, target: str, delay: float, jitter: float) -> None:
    host, _, tport = target.rpartition(":")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, int(tport))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_w, delay, jitter), _pipe(up_r, writer, delay, jitter),
                             return_exceptions=True)

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


async def _agent(listen: str, ramdisk: str) -> None:
    """A helper's HelperAgent alone (no token), as the daemon serves it."""
    from migration_helper.agent import agent_server
    from migration_helper.ramdisk import Ramdisk

    disk = Ramdisk(Path(ramdisk))
    disk.prepare()
    server = agent_server(disk)
    server.add_insecure_port(listen)
    await server.start()
    print("listening", flush=True)
    await server.wait_for_termination()


async def _send(target: str, directory: str, job_id: str, silence_s: float | None = None) -> None:
    """send_checkpoint, as a helper's transfer runs it; prints how it ended."""
    import grpc

    from migration_helper.agent import LINK_SILENCE_S, TransferTooSlow, send_checkpoint

    t0 = time.monotonic()
    try:
        sent = await send_checkpoint(target, Path(directory), job_id, silence_s=silence_s or LINK_SILENCE_S)
        print(f"sent {sent.bytes} bytes in {time.monotonic() - t0:.1f}s", flush=True)
    except grpc.aio.AioRpcError as exc:
        print(f"failed after {time.monotonic() - t0:.1f}s: {exc.code().name}: {exc.details()}", flush=True)
    except TransferTooSlow as exc:
        print(f"given up after {time.monotonic() - t0:.1f}s: {exc}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["relay", "agent", "send"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--target", default="")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--dir", default="")
    parser.add_argument("--silence", type=float, default=None, help="send: the link's silence limit (s)")
    args = parser.parse_args()
    if args.mode == "relay":
        asyncio.run(_relay(args.port, args.target, args.delay, args.jitter))
    elif args.mode == "agent":
        asyncio.run(_agent(args.target, args.dir))
    else:
        asyncio.run(_send(args.target, args.dir, "j-slow", args.silence))
