"""Opening a file a user names on a command line (a trace, a job spec or sweep, a TLS
certificate or key) so that what is not a file of text cannot hold the command for ever.

A named pipe (`mkfifo`) that nothing writes to held every such command, with no word, for as
long as it was left: `open()` waits for a writer. A pipe that has one (`--trace <(zcat t.gz)`,
`-f <(envsubst < spec.yaml)`, or `mkfifo p; gunzip -c t.gz > p &`) is read as it comes, however
slowly; one with no writer is given FIFO_WAIT_S for one to come, then refused by an OSError
whose strerror says so (callers print it as they print any other reason a file cannot be read).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import time
from pathlib import Path

FIFO_WAIT_S = 30.0  # for a writer to open a named pipe given with nothing writing to it
_POLL_S = 0.05


class _Prefixed(io.RawIOBase):
    """A pipe's file descriptor, with the bytes already read from it (to see whether it had a
    writer) given back first."""

    def __init__(self, head: bytes, fd: int) -> None:
        super().__init__()
        self._head, self._fd = head, fd

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._head:
            n = min(len(view), len(self._head))
            view[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = os.read(self._fd, len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _first_bytes(fd: int, path: str | Path) -> bytes:
    """What a named pipe holds once it has a writer (b"" if the writer has written nothing
    yet); OSError ETIMEDOUT if none came within FIFO_WAIT_S."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            head = os.read(fd, 1 << 16)
        except BlockingIOError:
            return b""  # a writer is there: it writes, or closes, in its own time
        if head:
            return head
        # b"": no writer (none yet, or one that left having written nothing).
        if time.monotonic() >= deadline:
            raise OSError(errno.ETIMEDOUT, f"a named pipe that nothing wrote to in {FIFO_WAIT_S:g} s",
                          str(path))
        time.sleep(_POLL_S)


def open_input(path: str | Path) -> io.BufferedReader:
    """``open(path, "rb")``, but a named pipe without a writer is an OSError after
    FIFO_WAIT_S instead of a wait without end (a directory is IsADirectoryError, as open's)."""
    fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        head = _first_bytes(fd, path) if stat.S_ISFIFO(mode) else b""
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if stat.S_ISFIFO(mode):
        return io.BufferedReader(_Prefixed(head, fd))
    return open(fd, "rb")  # the caller closes it


def writers_besides_owner(mode: int, sticky_ok: bool = False) -> str:
    """Who besides its owner may write a file or directory of ``mode``: "every user", "its
    group", or "" for nobody (with ``sticky_ok``, a directory with the sticky bit, such as
    /tmp, counts as nobody: others cannot rename away what is not theirs there)."""
    if not mode & 0o022 or (sticky_ok and mode & 0o1000):
        return ""
    return "every user" if mode & 0o002 else "its group"
