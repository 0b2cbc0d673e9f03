"""The event loop every Gandiva process runs on: uvloop's where available (it is not
built for every platform), else asyncio's. Light to import: the helper's entry point
uses it too."""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """For the entry points (scheduler.cli.serve.run_loop) and for the database's own
    loops (scheduler.state.db.LoopThread)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
