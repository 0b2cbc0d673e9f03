"""Opening files in the folders a job can write to: its log, its checkpoint directory and the
helper's own files in the ramdisk. A job runs as its helper's Unix user, so it may put a named
pipe, a link or a directory in any of their places: open() of a pipe waits for the other end
for ever (on the helper's event loop, which heartbeats and runs every job's commands), and a
link is followed (to /proc/self/environ: the helper's own environment, its token included).
``open_regular`` opens only a regular file, never through a link and never waiting;
``read_regular`` reads one whole, bounded."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

# open()'s modes that open_regular takes, and os.open's flags for each.
_FLAGS = {"rb": os.O_RDONLY, "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
          "ab+": os.O_RDWR | os.O_APPEND | os.O_CREAT, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}
NOT_REGULAR = "not a regular file (a link, a directory or a named pipe was put in its place)"


def open_regular(path: Path | str, mode: str = "rb") -> Any:
    """``open(path, mode)`` (rb, ab, ab+, wb) of a regular file only: FileNotFoundError as
    open's; a link, a directory, a pipe or a device there is an OSError naming the file."""
    try:
        fd = os.open(path, _FLAGS[mode] | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
    os.set_blocking(fd, True)
    return open(fd, mode)


def read_regular(path: Path | str, limit: int, size: str = "") -> bytes:
    """The bytes of a regular file (``open_regular``) of at most ``limit`` bytes: a larger one
    is a ValueError, "over SIZE" (``size``, else the limit in bytes)."""
    with open_regular(path) as f:
        data: bytes = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"over {size or f'{limit:,} bytes'}")
    return data
