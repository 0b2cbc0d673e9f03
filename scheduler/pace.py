"""A token bucket for reading what a process of a user's sends (a job's runtime stream, its
status pipe): past a burst, messages are taken at a fixed rate, and the sender waits in gRPC's
flow control or on its full pipe. One job sending without end must not hold the event loop
that serves everyone."""

from __future__ import annotations

import asyncio


class Pace:
    """``await pace.take()`` before handling each message: at once for the first ``burst``,
    then at ``rate`` a second (on the running event loop's clock)."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._allowance = burst
        self._at: float | None = None

    async def take(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._at is not None:
            self._allowance = min(self.burst, self._allowance + (now - self._at) * self.rate)
        self._at = now
        if self._allowance < 1:
            await asyncio.sleep((1 - self._allowance) / self.rate)
        self._allowance -= 1
