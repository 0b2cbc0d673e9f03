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
to a temporary name, flushed and renamed, so a file is either whole or absent.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from pathlib import Path

from google.protobuf.message import DecodeError

from protos.gandiva.v1 import helper_pb2
from scheduler.errors import InvalidArgument
from scheduler.validation import MAX_REGISTER_EXITS, check_exit

log = logging.getLogger(__name__)


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
                f.write(exit_.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
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
                path.unlink(missing_ok=True)
                continue
            exit_ = helper_pb2.ProcessExitRequest()
            try:
                exit_.ParseFromString(path.read_bytes())
            except (OSError, DecodeError) as exc:
                log.warning("%s is not a process exit (%s); removed", path, exc)
                path.unlink(missing_ok=True)
                continue
            if exit_.server != server or not exit_.job_id:
                log.warning("%s is not a process exit of server %s; removed", path, server)
                path.unlink(missing_ok=True)
                continue
            try:
                check_exit(exit_)
            except InvalidArgument as err:
                log.warning("%s is not an exit a registration may carry (%s); removed", path, err)
                path.unlink(missing_ok=True)
                continue
            found.append((exit_, path))
        if len(found) > MAX_REGISTER_EXITS:
            gone, found = found[:-MAX_REGISTER_EXITS], found[-MAX_REGISTER_EXITS:]
            log.warning("%s holds %d process exits, more than the %s a registration carries: the oldest %d "
                        "removed (their jobs, if the scheduler still has them running here, are re-queued "
                        "and run again from their restore point)", self.root, len(gone) + len(found),
                        f"{MAX_REGISTER_EXITS:,}", len(gone))
            for _, path in gone:
                path.unlink(missing_ok=True)
        return found

    @staticmethod
    def forget(path: Path) -> None:
        """The exit in `path` was delivered (or refused for good)."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s (%s): it is sent again at the next start (a no-op)", path, exc)
