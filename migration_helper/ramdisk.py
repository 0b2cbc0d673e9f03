"""Checkpoints in the helper's ramdisk: receiving a streamed one atomically, and
streaming one to a peer.

Layout: ``<ramdisk>/<job_id>/<checkpoint_name>/`` holds the shim's Saver files and
its ``gandiva.json`` manifest. An incoming checkpoint is written under
``<ramdisk>/<job_id>/.incoming-<random>/`` and renamed into place only after the
last chunk arrived and the sha256 of all bytes matched, so a transfer cut halfway
is never visible as a checkpoint (and is removed).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import AsyncIterable, Iterator
from pathlib import Path
from typing import BinaryIO

from migration_helper.files import open_regular
from protos.gandiva.v1 import helper_pb2

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # well under gRPC's 4 MiB default message limit
INCOMING_PREFIX = ".incoming-"
_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=-]{0,199}$")


class CheckpointError(ValueError):
    """A malformed or incomplete checkpoint stream; the message says what is wrong."""


class CheckpointMissing(CheckpointError):
    """The checkpoint directory to send does not exist or is empty."""


class CheckpointExists(CheckpointError):
    """A checkpoint with that name is already there."""


class TransferTooLarge(CheckpointError):
    """More bytes or files than this helper accepts in one checkpoint."""


class NoSpace(TransferTooLarge):
    """The ramdisk filled up (ENOSPC, a quota) while a checkpoint was being received."""


class DiskFailed(CheckpointError):
    """The ramdisk's file system failed while a checkpoint was being received (turned
    read-only, an I/O error): this server cannot take checkpoints now."""


class DigestMismatch(CheckpointError):
    """The bytes received do not match the sender's sha256."""


def safe_name(value: str, what: str) -> str:
    """A single path component we are willing to create (no '/', no '..', no hidden names)."""
    if not _SAFE.match(value):
        raise CheckpointError(f"{what} {value!r}: must be a plain file name (letters, digits, '._=-')")
    return value


class Ramdisk:
    """The checkpoint area of one helper."""

    def __init__(self, root: Path, max_bytes: int = 64 << 30, max_files: int = 10_000) -> None:
        self.root = root
        # A peer cannot fill this server's RAM: a checkpoint over these is refused.
        self.max_bytes = max_bytes
        self.max_files = max_files

    def prepare(self) -> None:
        """Create the ramdisk (its owner's only) and drop transfers a previous run left half-done.

        Checkpoints are the users' models: the default ramdisk, /dev/shm/gandiva-SERVER, was
        created 755 (every local user read them), and one another user had made there first
        (/dev/shm is everyone's) was used as it was: that user read and could replace every
        checkpoint written to it. Now it must be this helper's user's, and is made 700."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = self.root.stat()
        if st.st_uid != os.geteuid():
            raise OSError(f"ramdisk {self.root} belongs to another user (uid {st.st_uid}, this helper runs as "
                          f"{os.geteuid()}): it would hold the jobs' checkpoints; remove it, or give --ramdisk "
                          "a directory of this user's")
        if st.st_mode & stat.S_ISVTX:  # everyone's (/dev/shm itself, /tmp): never narrowed
            log.warning("ramdisk %s is a directory every user may write in; give --ramdisk a directory of "
                        "its own (by default /dev/shm/gandiva-SERVER)", self.root)
        elif st.st_mode & 0o077:
            self.root.chmod(0o700)
            log.warning("ramdisk %s was readable by other users (the jobs' checkpoints): it is now its owner's "
                        "only (mode 700)", self.root)
        for stale in self.root.glob(f"*/{INCOMING_PREFIX}*"):
            if stale.parent.is_symlink():  # not a job's folder: a link a job put here (prune)
                continue
            log.info("removing an incomplete incoming checkpoint %s", stale)
            shutil.rmtree(stale, ignore_errors=True)

    def prune(
        self, live_jobs: set[str], retain_s: float, now: float | None = None, kept: set[str] | None = None,
    ) -> list[Path]:
        """Delete checkpoints nobody here needs, so the ramdisk does not fill up with
        every migration's copy: anything older than ``retain_s`` (long enough for a
        migration to fall back on it), except the newest checkpoint of each job with a
        live process here and every checkpoint the scheduler still needs.

        ``kept``: the paths the scheduler named as still needed (a parked or re-queued
        job's restore point, which it may resume from hours later); a checkpoint is kept
        when one of them is it or lies inside it. None when the scheduler has not said:
        then the newest checkpoint of every job is kept, in doubt. Returns what was removed."""
        now = time.time() if now is None else now
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        needed = None if kept is None else {Path(p).resolve() for p in kept if p}
        for job in self.root.iterdir():
            # A link is passed over: the jobs may write here, and one to a folder elsewhere
            # had its subfolders taken for old checkpoints and deleted, wherever it pointed.
            if job.is_symlink() or not job.is_dir():
                continue
            ckpts = sorted((c for c in job.iterdir() if not c.is_symlink() and c.is_dir()
                            and not c.name.startswith(INCOMING_PREFIX)), key=lambda c: c.stat().st_mtime)
            keep = {ckpts[-1]} if ckpts and (needed is None or job.name in live_jobs) else set()
            if needed:
                keep |= {c for c in ckpts if any(p == c.resolve() or c.resolve() in p.parents for p in needed)}
            for ckpt in ckpts:
                if ckpt not in keep and now - ckpt.stat().st_mtime > retain_s:
                    shutil.rmtree(ckpt, ignore_errors=True)
                    removed.append(ckpt)
            if not any(job.iterdir()):
                job.rmdir()
        for path in removed:
            log.info("removed old checkpoint %s", path)
        return removed

    def job_dir(self, job_id: str) -> Path:
        return self.root / safe_name(job_id, "job_id")

    async def receive(self, chunks: AsyncIterable[helper_pb2.CheckpointChunk]) -> tuple[Path, int]:
        """Store a streamed checkpoint; returns its directory and size in bytes."""
        tmp: Path | None = None
        made_job_dir = False
        out: BinaryIO | None = None
        total = 0
        try:
            digest = hashlib.sha256()
            done: set[str] = set()
            current = ""
            final: Path | None = None
            async for chunk in chunks:
                if tmp is None:
                    job = self.job_dir(chunk.job_id)
                    name = safe_name(chunk.checkpoint_name or "checkpoint", "checkpoint_name")
                    final = job / name
                    if final.exists():
                        raise CheckpointExists(f"checkpoint {final} already exists")
                    tmp = job / f"{INCOMING_PREFIX}{uuid.uuid4().hex}"
                    made_job_dir = not job.exists()
                    tmp.mkdir(parents=True)
                if chunk.name and chunk.name != current:
                    if chunk.name in done:
                        raise CheckpointError(f"file {chunk.name!r} sent twice (chunks out of order)")
                    if out is not None:
                        out.close()
                        done.add(current)
                    current = chunk.name
                    if len(done) >= self.max_files:
                        raise TransferTooLarge(f"more than {self.max_files} files in one checkpoint")
                    # A ramdisk write is a memory copy; a thread hop per chunk would cost more.
                    # The file stays open across chunks, closed below or in `finally`.
                    out = open(tmp / safe_name(current, "file name"), "wb")  # noqa: ASYNC230, SIM115
                if chunk.data:
                    if out is None:
                        raise CheckpointError("data before any file name")
                    total += len(chunk.data)
                    if total > self.max_bytes:
                        raise TransferTooLarge(
                            f"checkpoint larger than this helper's cap of {self.max_bytes} bytes")
                    out.write(chunk.data)
                    digest.update(chunk.data)
                if chunk.last:
                    if out is not None:
                        out.close()
                        out = None
                    if chunk.sha256 != digest.hexdigest():
                        raise DigestMismatch(
                            f"sha256 mismatch: sender {chunk.sha256 or '(none)'}, received {digest.hexdigest()}"
                        )
                    assert final is not None
                    tmp.rename(final)
                    tmp = None
                    log.info("received checkpoint %s (%d bytes)", final, total)
                    return final, total
            raise CheckpointError("the stream ended before its last chunk (transfer cut)")
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpace(f"no space left in {self.root} for the checkpoint ({total} bytes received): "
                              f"{exc.strerror}; the partial copy was removed") from exc
            # Any other error of the file system (ext4 turned read-only on an I/O error,
            # EIO): before, it left the servicer as an unexpected exception, the sender read
            # "UNKNOWN: Unexpected <class 'OSError'>: [Errno 30] Read-only file system".
            if out is not None:
                with contextlib.suppress(OSError):
                    out.close()
                out = None
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                left = tmp.exists()
                tmp = None if not left else tmp
            else:
                left = False
            raise DiskFailed(
                f"cannot write the checkpoint in {self.root} ({total} bytes received): "
                f"{exc.strerror or exc}: its disk failed or was made read-only; "
                + ("the partial copy could not be removed (it is when the helper next starts)" if left
                   else "nothing of it is left")) from exc
        finally:
            if out is not None:
                # Closing flushes what is buffered, which fails again on a full disk: the
                # partial copy must go anyway, or it keeps the ramdisk full (housekeeping
                # skips incoming transfers) until the helper restarts.
                with contextlib.suppress(OSError):
                    out.close()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                if made_job_dir:  # nor an empty directory per job id a refused stream named
                    with contextlib.suppress(OSError):
                        tmp.parent.rmdir()


def checkpoint_chunks(
    directory: Path, job_id: str, name: str | None = None, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[helper_pb2.CheckpointChunk]:
    """The chunks that send ``directory`` (flat: the shim writes no subdirectories).

    Its regular files only, never through a link: the job writes this directory, as the
    helper's user, and a link there to /proc/self/environ was read by the helper as its own
    environment (its token) and sent to the destination for the job to read; a link to any
    file the job could not name otherwise, likewise. A link is refused; a file is opened
    without following or waiting (a named pipe swapped in is refused, not waited on)."""
    if not directory.is_dir():
        raise CheckpointMissing(f"checkpoint directory {directory} does not exist")
    files = []
    for p in sorted(directory.iterdir()):
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode):
            raise CheckpointError(f"checkpoint directory {directory} holds a link, {p.name}: a checkpoint is "
                                  "regular files; it is not sent")
        if stat.S_ISREG(mode):
            files.append(p)
    if not files:
        raise CheckpointMissing(f"checkpoint directory {directory} is empty")
    digest = hashlib.sha256()
    first = True
    for path in files:
        try:
            f = open_regular(path)
        except OSError as exc:  # swapped since it was listed
            raise CheckpointError(f"{path}: {exc.strerror}: the checkpoint is not sent") from None
        with f:
            sent_any = False
            while True:
                data = f.read(chunk_bytes)
                if not data and sent_any:
                    break
                digest.update(data)
                chunk = helper_pb2.CheckpointChunk(name=path.name, data=data)
                if first:
                    chunk.job_id = job_id
                    chunk.checkpoint_name = name or directory.name
                    first = False
                yield chunk
                sent_any = True
                if not data:
                    break
    yield helper_pb2.CheckpointChunk(last=True, sha256=digest.hexdigest())
