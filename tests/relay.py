"""A loopback TCP relay that fault tests put between a client and its server (a helper and
its scheduler, a scheduler and its PostgreSQL) to play a bad link: cut every connection
and refuse new ones, accept and never answer (`hole`), or hold what the server sends back
on chosen connections (`stall`). Real sockets and bytes; nothing of the protocol is known.
`Relay` runs in the caller's event loop; `TcpProxy` in a thread of its own, for
synchronous tests."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class Relay:
    """Relays 127.0.0.1:`port` (0: a free one) to `target` ("host:port")."""

    def __init__(self, target: str, port: int = 0) -> None:
        host, target_port = target.rsplit(":", 1)
        self.target = (host, int(target_port))
        self.port = port
        # Accept connections and never answer (a network partition, a hung server).
        self.hole = False
        self.connections: list[asyncio.Event] = []  # one per connection: set = answers held
        self.writers: set[asyncio.StreamWriter] = set()
        self._stall_next = 0
        self._server: asyncio.base_events.Server | None = None
        # Each connection's relaying, ended by `stop`: left pending past its loop's close,
        # its pipes raised "Event loop is closed" once collected, in whichever test ran then.
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen (again, after a cut: on the same port)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def stall(self, new: int) -> None:
        """The answers on every connection open now and on the next `new` opened are held
        from then on (never delivered, as in a retransmission queue nobody drains)."""
        for held in self.connections:
            held.set()
        self._stall_next = new

    async def cut(self) -> None:
        """Every connection aborted, and no new one accepted until `start`."""
        if self._server is not None:
            self._server.close()
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        """Cut, and end every connection's relaying (one accepted meanwhile too)."""
        await self.cut()
        await asyncio.sleep(0.1)  # the pipes see their ends closed and return
        while self._handlers:
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, held: asyncio.Event | None) -> None:
        try:
            while data := await r.read(65536):
                if held is not None and held.is_set():
                    continue
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        if self.hole:
            self.writers.add(cw)
            return
        held = asyncio.Event()
        if self._stall_next > 0:
            self._stall_next -= 1
            held.set()
        self.connections.append(held)
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}
        await asyncio.gather(self._pipe(cr, sw, None), self._pipe(sr, cw, held))


class TcpProxy:
    """A Relay to `target_host`:`target_port` in an event loop of its own (a thread)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.relay = Relay(f"{target_host}:{target_port}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.relay.port

    @property
    def hole(self) -> bool:
        return self.relay.hole

    @hole.setter
    def hole(self, value: bool) -> None:
        self.relay.hole = value

    async def _end(self) -> None:
        await self.relay.stop()
        # And whatever else is left in this loop of its own (a connection's accept that was
        # under way as the relay stopped listening).
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def start(self) -> TcpProxy:
        self.thread.start()
        self._run(self.relay.start())
        return self

    def cut(self) -> None:
        self._run(self.relay.cut())

    def restore(self) -> None:
        self._run(self.relay.start())

    def stop(self) -> None:
        """End every connection, then the loop and its thread."""
        self._run(self._end())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
