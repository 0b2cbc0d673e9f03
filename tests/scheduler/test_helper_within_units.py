"""HelperServicer._within (a helper's heartbeat, GPU samples and process exits bounded while
the database is slow or cut off): what it keeps once the work is done."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from scheduler.api.helper_api import HelperServicer
from scheduler.errors import NotFound


def test_a_made_up_server_name_leaves_nothing_behind() -> None:
    """ReportGpuSamples and ReportProcessExit key their work by the server named, checked
    only inside it: 1,000 made-up names kept 1,000 ended tasks (and their errors) for good."""
    core = SimpleNamespace(db_health=SimpleNamespace(up=True, text=lambda: ""), settings=SimpleNamespace(lease=6.0))
    servicer = HelperServicer(core, None)  # type: ignore[arg-type]

    async def unknown() -> None:
        raise NotFound("server", "never registered")

    async def main() -> None:
        for i in range(1000):
            with pytest.raises(NotFound):
                await servicer._within(("exit", f"ghost-{i}"), unknown)
        await asyncio.sleep(0)  # (done callbacks run on the next turn of the loop)

    asyncio.run(main())
    assert servicer._pending == {}
