"""scheduler/unmoved.py: the one list of a move that did not move its job, read by the live
engine (it writes the events), problems, sharing and the demo's client."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scheduler.unmoved import ENDED_UNMOVED, NOT_STARTED, unmoved_end


@pytest.mark.parametrize(("message", "end"), [
    ("aborted 0.012s (pre-warm at node-1 failed)", "aborted"),
    ("restarted_at_source 2.100s (transfer failed)", "restarted_at_source"),
    ("failed (the job ended (SUCCEEDED) before it moved: nothing to move)", "failed"),
    ("not started (lower the height; to s1/0): job j-1 has no runtime connected", NOT_STARTED),
    ("failed-over-2's helper moved mid-stream", None),  # a server's name, not a phase
    ("total 1.234s", None),
    ("failed", None),
])
def test_a_move_that_did_not_move_is_read_from_its_first_word(message: str, end: str | None) -> None:
    assert unmoved_end(message) == end
    assert end is None or end == NOT_STARTED or end in ENDED_UNMOVED


def test_the_demos_client_reads_the_list_without_the_schedulers_modules() -> None:
    """The demo's client (a process of its own beside the scheduler) took the list from
    live_migration, and so imported the scheduler's core, its database layer and the
    migration protocol: 2-3 s of its start on a loaded 2-core machine, 0.6 s without."""
    code = ("import sys, scheduler.cli.demo_run; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy' "
            "or m.startswith(('scheduler.engine', 'scheduler.core', 'scheduler.state', 'migration_protocol'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
