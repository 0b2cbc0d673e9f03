"""A job writing its status pipe (GANDIVA_STATUS_FD) without end: the job is the user's own
program, the helper reads that pipe on the event loop that also heartbeats and runs every
other job's commands."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from migration_helper.local_control import LocalControl
from migration_helper.process import STATUS_BURST, STATUS_KEPT, STATUS_RATE
from protos.gandiva.v1 import helper_pb2

from .conftest import MakeHelper
from .test_helper_daemon import launch

FLOOD = """
import os
fd = int(os.environ["GANDIVA_STATUS_FD"])
chunk = b'{"event":"first_step_done","step":1}\\n' * 500 + b'{"event":"x"}\\n' * 500 + b"not json\\n" * 100
while True:
    os.write(fd, chunk)
"""


async def test_a_job_flooding_its_status_pipe_is_read_at_a_bounded_pace(
    control: LocalControl, make_helper: MakeHelper, tmp_path: Path
) -> None:
    """Its lines were all read and kept as they came (every event in a list for the
    process's life): probed with a real helper, a job writing 37-byte lines grew the
    helper by hundreds of MB a minute and kept its event loop busy. Now the pipe is read at
    STATUS_RATE lines a second past a burst (the job's writes wait on the full pipe), at
    most STATUS_KEPT events are kept, and the helper heartbeats and obeys as before."""
    helper = await make_helper("s1")
    flood = tmp_path / "flood"
    flood.write_text(f"#!{sys.executable}\n{FLOOD}")
    flood.chmod(0o755)
    assert (await control.helper_command("s1", launch("j1", "i1", [str(flood)], [0], tmp_path), 10)).ok
    proc = helper.jobs.processes[("j1", "i1")]
    t0 = time.monotonic()
    await control.wait_for(lambda: proc.status_lines >= STATUS_BURST, 10, "the burst to be read")
    beat = control.heartbeats["s1"]
    await control.wait_for(lambda: control.heartbeats["s1"] is not beat, 10, "a heartbeat meanwhile")
    await asyncio.sleep(2)
    read, elapsed = proc.status_lines, time.monotonic() - t0
    assert read <= STATUS_BURST + STATUS_RATE * elapsed + 10, (read, elapsed)
    assert len(proc.events) <= STATUS_KEPT + 1
    # The helper still obeys: the job is stopped as any other.
    stop = helper_pb2.HelperCommand(stop=helper_pb2.StopJob(job_id="j1", reason="test"))
    assert (await control.helper_command("s1", stop, 10)).ok
    await control.wait_for(lambda: control.exit_of("j1", "i1"), 10, "the exit report")


ODD_LINES = """
import os
fd = int(os.environ["GANDIVA_STATUS_FD"])
for line in (b'{"event": []}', b'{"event": {}}', b"[" * 50000, b"x" * 200000,
             b'{"event": "last_step", "steps": 7}'):
    os.write(fd, line + b"\\n")
"""


async def test_status_lines_no_shim_writes_are_passed_over_and_the_ones_after_them_read(
    control: LocalControl, make_helper: MakeHelper, tmp_path: Path
) -> None:
    """A job's process may write anything to its status pipe. A line whose event was a list
    (TypeError: unhashable), one nested 50,000 deep (RecursionError) or one longer than
    64 KiB (the reader's limit: ValueError) ended the helper's reading of that pipe for
    good: its later events (a pre-warm's warm_ready, its launch_end) were never seen, and
    its exit was reported without the count of its last_step line (`steps` 0)."""
    await make_helper("s1")
    odd = tmp_path / "odd"
    odd.write_text(f"#!{sys.executable}\n{ODD_LINES}")
    odd.chmod(0o755)
    assert (await control.helper_command("s1", launch("j1", "i1", [str(odd)], [0], tmp_path), 10)).ok
    await control.wait_for(lambda: control.exit_of("j1", "i1"), 20, "the exit report")
    ended = control.exit_of("j1", "i1")
    assert ended is not None and (ended.exit_code, ended.steps) == (0, 7), ended
