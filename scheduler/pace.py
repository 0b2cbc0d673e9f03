"""A token bucket for reading what a process of a user's sends (a job's runtime stream, its
status pipe): past a burst, messages are taken at a fixed rate, and the sender waits in gRPC's
flow control or on its full pipe. One job sending without end must not hold the event loop
that serves everyone."""

from __future__ import annotations

import asyncio


class Pace:
    """``await pace.take()`` before handling each message: at once for the first ``burst``,
    then at ``rate`` a second (on the running event loop's clock). Several tasks may share
    one (a launch's streams): each takes its turn before it waits, so together they get
    ``rate``; when each waited for the allowance it saw, 20 of them got 20 turns at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._allowance = burst
        self._at: float | None = None

    async def take(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._at is not None:
            self._allowance = min(self.burst, self._allowance + (now - self._at) * self.rate)
        self._at = now
        self._allowance -= 1
        if self._allowance < 0:
            await asyncio.sleep(-self._allowance / self.rate)
