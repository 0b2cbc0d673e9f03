"""Hostile and bad requests to a real scheduler: a clear status naming the field, the
scheduler keeps serving, and the database stays consistent."""

from __future__ import annotations

import logging
from typing import Any

import pytest


def test_the_loopback_warning_names_the_port_that_was_bound(make_scheduler: Any, sqlite_url: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """It named `127.0.0.1:0` (the port asked for), not the one picked."""
    with caplog.at_level(logging.WARNING, logger="scheduler.server"):
        sched = make_scheduler(sqlite_url, also_listen=("127.0.0.1:0",))
    warnings = [r.getMessage() for r in caplog.records if "listens on loopback" in r.getMessage()]
    assert len(warnings) == 2 and f"listens on loopback {sched.address} without" in warnings[0], warnings
    assert all(":0 " not in w for w in warnings), warnings
