"""`gandiva demo` end to end, as the README's first command runs it (bounded, and with
300 mini-batches a job instead of its default 400: every check below held so, 13 s sooner
of 136 s): real scheduler and helper processes, real TensorFlow jobs, the scheduler's own
decisions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_demo_shows_the_scheduler_time_slice_pack_migrate_grow_and_shrink(tmp_path: Path) -> None:
    env = {**os.environ, "GANDIVA_HOME": str(tmp_path / "home"), "COLUMNS": "160"}
    env.pop("GANDIVA_SCHEDULER", None)
    done = subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", "demo", "--steps", "300", "--timeout", "420"],
        check=False, capture_output=True, text=True, env=env, timeout=540)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/", out)

    def decisions(kind: str) -> list[str]:
        return re.findall(rf"^\s*[\d.]+s {re.escape(kind)}\s+(\S+)\s+(.+)$", out, re.MULTILINE)

    # Oversubscribed: newcomers time-slice with incumbents, and turns come round.
    assert any("time-slice with new job" in why for _, why in decisions("suspend")), out
    assert any("its turn in the time-slice group" in why for _, why in decisions("resume")), out
    # Packing is tried, and judged by the measured rates: kept, or undone (unpack; reject-pack
    # when a job of the pair had finished in the trial's second half), with the gain.
    assert decisions("pack"), out
    verdicts = decisions("keep-pack") + decisions("unpack") + decisions("reject-pack")
    assert verdicts and all(re.search(r"packed rate \d+\.\d\dx of time-slicing", why) for _, why in verdicts), out
    # The grow-shrink job grows onto idle GPUs; newcomers make it shrink. On a slow machine it
    # may also grow in the idle seconds between the story's steps and shrink for the next one:
    # every grow is followed by a shrink, and only the opt-in job is ever grown or shrunk.
    grows, shrinks = [job for job, _ in decisions("grow")], [job for job, _ in decisions("shrink")]
    assert grows and set(grows) == {"solo-gs"}, out
    assert shrinks and set(shrinks) == {"solo-gs"} and len(grows) - 1 <= len(shrinks) <= len(grows), out
    # Locality: one server is emptied so that the 2-GPU job runs on one server.
    assert any("make room for job big-2gpu" in why for _, why in decisions("migrate")), out
    assert re.search(r"place\s+big-2gpu\s+Algorithm 1: unallocated on (node-\d)/0,\1/1", out), out
    assert re.search(r"best configuration of the sweep: lr[\d.]+-h\d+ .*final loss \d", out), out
    done = re.search(r"(\d+)/(\d+) jobs succeeded \(solo-gs stopped by the demo", out)
    assert done and done.group(1) == done.group(2) and int(done.group(1)) >= 12, out
    png = Path(re.search(r"timeline of the GPUs: (\S+\.png)", out).group(1))  # type: ignore[union-attr]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
