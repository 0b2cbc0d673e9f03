"""Process exits the helper has not delivered yet, kept on its disk.

An exit waits in the helper's outbox until the scheduler takes it. A helper stopped (or
killed) while the scheduler or its database was unreachable lost it: the scheduler never
heard that the job had ended, re-queued it with its server and trained it again from its
checkpoint (past its end, or a second time). Each exit is therefore also written here when
it is posted, and removed once delivered; the helper's next start sends what is left with
its registration (RegisterServerRequest.exits), which the scheduler applies before it
re-queues the jobs of the helper it replaces.

One file per exit under the log directory (on disk, unlike the ramdisk: it outlives a
reboot), named so that the files sort in the order the exits were posted. Each is written
to a temporary name, flushed and renamed (the folder flushed after), so a file is either
whole or absent; and it starts with a checksum of the exit (`_encode`), so that a file cut
short or damaged since (a disk error, fsck after a crash, a copy cut short) is removed rather
than read as another exit: one cut after the launch's id read as exit status 0, and a failed
job was recorded SUCCEEDED. Files of a helper from before the checksum are still read.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
import zlib
from pathlib import Path

from google.protobuf.message import DecodeError

from migration_helper.files import read_regular
from protos.gandiva.v1 import helper_pb2
from scheduler.errors import InvalidArgument
from scheduler.validation import MAX_REGISTER_EXITS, check_exit
from tf_runtime.checkpoint import fsync_path

log = logging.getLogger(__name__)

# A file's first line: this, then the CRC-32 of the exit that follows it (8 hex digits).
MAGIC = b"gandiva-exit 1 "
# The most read of one file: an exit the scheduler takes is a few hundred bytes (its ids are
# at most 64 bytes, its reason 1,024).
MAX_EXIT_BYTES = 64 << 10


def _encode(exit_: helper_pb2.ProcessExitRequest) -> bytes:
    payload = exit_.SerializeToString()
    return MAGIC + f"{zlib.crc32(payload):08x}\n".encode() + payload


def _decode(data: bytes) -> helper_pb2.ProcessExitRequest:
    """The exit `data` holds; ValueError saying why it is not one, whole."""
    if data.startswith(MAGIC):
        head, payload = data[len(MAGIC):len(MAGIC) + 9], data[len(MAGIC) + 9:]
        try:
            whole = head.endswith(b"\n") and int(head[:8], 16) == zlib.crc32(payload)
        except ValueError:
            whole = False
        if not whole:
            raise ValueError("cut short or damaged: its checksum does not match")
    else:
        payload = data  # written by a helper from before the checksum
    exit_ = helper_pb2.ProcessExitRequest()
    try:
        exit_.ParseFromString(payload)
    except DecodeError as exc:
        raise ValueError(str(exc)) from None
    # Every exit the helper writes has both: one without was cut short (an older helper's
    # file, which has no checksum; fields are written in order, its status before its reason).
    if not exit_.incarnation or not exit_.reason:
        raise ValueError("cut short: it has no launch id or no reason")
    return exit_


def _remove(path: Path) -> None:
    """Remove a file that is not to be sent; said, never raised (the helper starts all the
    same): a directory of that name, a folder that cannot be written."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s (%s); passed over", path, exc)


class UndeliveredExits:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._seq = itertools.count()

    def keep(self, exit_: helper_pb2.ProcessExitRequest) -> Path | None:
        """Write `exit_` to disk; its file, or None when it could not be written (said in
        the log: the exit is then only in memory, as before)."""
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}.exit"
        path = self.root / name
        tmp = self.root / f".{name}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_encode(exit_))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _sync_dir(self.root)
        except OSError as exc:
            log.warning("job %s: could not keep its process exit on disk at %s (%s); it is delivered "
                        "from memory only (lost if this helper stops before the scheduler takes it)",
                        exit_.job_id, self.root, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return None
        return path

    def load(self, server: str) -> list[tuple[helper_pb2.ProcessExitRequest, Path]]:
        """The exits an earlier run of this server's helper left, oldest first: at most
        MAX_REGISTER_EXITS, the newest. A file that does not read as an exit of `server`
        that the scheduler takes is said and removed, and so are the oldest past that
        limit: the folder is the jobs' to write too (they run as this helper's user), and
        one such exit sent with the registration had it refused, INVALID_ARGUMENT, and
        sent again as it was, for good (the server never registered again)."""
        try:
            names = sorted(p.name for p in self.root.iterdir())
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read the undelivered process exits in %s (%s); ignored", self.root, exc)
            return []
        found: list[tuple[helper_pb2.ProcessExitRequest, Path]] = []
        for name in names:
            path = self.root / name
            if name.startswith("."):  # a write cut short: never renamed, so never posted whole
                _remove(path)
                continue
            try:
                # A regular file only, never waiting, and bounded: a job may put a named pipe
                # here (open() waited for a writer for ever: the helper never started) or a
                # link (to /dev/zero: read until memory ran out).
                exit_ = _decode(read_regular(path, MAX_EXIT_BYTES))
            except (OSError, ValueError) as exc:
                log.warning("%s is not a process exit (%s); removed", path, exc)
                _remove(path)
                continue
            if exit_.server != server or not exit_.job_id:
                log.warning("%s is not a process exit of server %s; removed", path, server)
                _remove(path)
                continue
            try:
                check_exit(exit_)
            except InvalidArgument as err:
                log.warning("%s is not an exit a registration may carry (%s); removed", path, err)
                _remove(path)
                continue
            found.append((exit_, path))
        if len(found) > MAX_REGISTER_EXITS:
            gone, found = found[:-MAX_REGISTER_EXITS], found[-MAX_REGISTER_EXITS:]
            log.warning("%s holds %d process exits, more than the %s a registration carries: the oldest %d "
                        "removed (their jobs, if the scheduler still has them running here, are re-queued "
                        "and run again from their restore point)", self.root, len(gone) + len(found),
                        f"{MAX_REGISTER_EXITS:,}", len(gone))
            for _, path in gone:
                _remove(path)
        return found

    @staticmethod
    def forget(path: Path) -> None:
        """The exit in `path` was delivered (or refused for good)."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s (%s): it is sent again at the next start (a no-op)", path, exc)


def _sync_dir(folder: Path) -> None:
    """Flush `folder`'s entries: its renamed file outlives a power cut."""
    with contextlib.suppress(OSError):
        fsync_path(folder)
