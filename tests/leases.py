"""The lease folders in /dev/shm of the helpers a test started.

A helper publishes its lease for its jobs' shims in a folder of its own in /dev/shm, named
after its ramdisk (migration_helper.daemon.lease_path), and removes it when it stops. One
killed with -9 (a fault a test makes, or a test's clean-up after its grace) leaves it, for
its next start on that ramdisk; a test's ramdisk is never used again, so each such test
left one folder more in /dev/shm, run after run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path


def remove_lease_folders(ramdisks: Iterable[Path]) -> None:
    """Remove the lease folder of each helper ramdisk given (those that exist), once the
    helpers are gone."""
    from migration_helper.daemon import lease_path

    for ramdisk in ramdisks:
        if not ramdisk.is_dir():
            continue
        with contextlib.suppress(OSError):
            lease = lease_path(ramdisk)
            if lease.parent != ramdisk:  # (in the ramdisk itself where /dev/shm is not usable)
                lease.unlink(missing_ok=True)
                lease.parent.rmdir()
