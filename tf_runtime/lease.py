"""The Migration Helper's lease, as a job's own process sees it.

The helper freezes its jobs (SIGSTOP) once no heartbeat has been answered for its lease,
and the scheduler re-places them only after that (docs/migration_helper.md, "Lease"). A
host that froze whole (a paused VM, a stalled kernel) wakes every process at once: the
job's process trained on, and carried out commands sent before the freeze (a periodic
checkpoint written over the restore point its replacement elsewhere resumed from), until
its helper's watchdog got the CPU and froze it again. So the helper also writes the
lease's end into a file (`GANDIVA_LEASE_FILE`, in its ramdisk): CLOCK_MONOTONIC seconds,
one clock for every process of the host, which a freeze of the host does not stop. The
shim reads it before each run of the training session and at each step's end (the file
only once the end it read last has passed, about once a heartbeat interval) and holds
there while the lease has run out: until the helper renews it (its jobs thawed), stops
the process, or the scheduler's KILL arrives.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

LEASE_ENV = "GANDIVA_LEASE_FILE"
# How long an absent or unreadable file is taken as "no lease" before it is read again
# (a helper older than the file writes none; a process started by hand has no helper).
UNKNOWN_RECHECK_S = 1.0


def write_lease(path: Path, until: float) -> None:
    """Write the lease's end (monotonic seconds; inf: none) atomically: a reader never
    sees a half-written number. On an OSError (the ramdisk full) nothing of it is left
    beside the file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        # Made anew (O_EXCL: never a link followed, never a named pipe opened): the jobs may
        # write the ramdisk, and a pipe a job put at tmp held the helper's event loop in
        # open() for ever, while a link there was written through.
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(repr(until))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


class Lease:
    """Whether the helper's lease holds now, from its file (no file named: always)."""

    def __init__(self, path: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._until = -math.inf  # the end last read

    def holds(self) -> bool:
        if not self.path:
            return True
        now = self._clock()
        if now < self._until:
            return True
        try:
            self._until = float(Path(self.path).read_text())
        except (OSError, ValueError):
            self._until = now + UNKNOWN_RECHECK_S
        return now < self._until
