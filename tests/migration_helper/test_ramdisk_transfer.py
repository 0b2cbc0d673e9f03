"""PutCheckpoint over real gRPC: a streamed checkpoint lands whole or not at all."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from migration_helper.agent import HelperAgentServicer, send_checkpoint
from migration_helper.ramdisk import INCOMING_PREFIX, Ramdisk, checkpoint_chunks
from protos.gandiva.v1 import helper_pb2, helper_pb2_grpc


@contextlib.asynccontextmanager
async def agent_on(root: Path) -> AsyncIterator[tuple[str, Ramdisk]]:
    """A helper's agent alone, receiving into a ramdisk at ``root``: (its address, the ramdisk)."""
    ramdisk = Ramdisk(root)
    ramdisk.prepare()
    server = grpc.aio.server()
    helper_pb2_grpc.add_HelperAgentServicer_to_server(HelperAgentServicer(ramdisk), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", ramdisk
    finally:
        await server.stop(0)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[str, Ramdisk]]:
    async with agent_on(tmp_path / "dest-ramdisk") as running:
        yield running


def make_checkpoint(root: Path, sizes: dict[str, int]) -> Path:
    root.mkdir(parents=True)
    for name, size in sizes.items():
        (root / name).write_bytes(os.urandom(size))
    return root


def digest_of(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def leftovers(ramdisk: Ramdisk) -> list[Path]:
    return list(ramdisk.root.glob(f"*/{INCOMING_PREFIX}*"))


async def test_a_checkpoint_arrives_byte_for_byte(agent: tuple[str, Ramdisk], tmp_path: Path) -> None:
    address, ramdisk = agent
    # Several chunks for the big file, an empty file, and the manifest.
    src = make_checkpoint(tmp_path / "src" / "ckpt-7", {
        "model.data-00000-of-00001": 3 * (1 << 20) + 123, "model.index": 0, "gandiva.json": 200})
    reply = await send_checkpoint(address, src, "job-1")
    landed = Path(reply.path)
    assert landed == ramdisk.root / "job-1" / "ckpt-7"
    assert reply.bytes == 3 * (1 << 20) + 323 and digest_of(landed) == digest_of(src)
    assert leftovers(ramdisk) == []


async def test_a_link_in_a_checkpoint_is_refused_not_followed(agent: tuple[str, Ramdisk], tmp_path: Path) -> None:
    """The job writes its checkpoint directory as the helper's user: a link there to
    /proc/self/environ was read by the (source) helper as its own environment, its token
    included, and landed at the destination, where the job reads its checkpoint."""
    from migration_helper.ramdisk import CheckpointError

    address, ramdisk = agent
    src = make_checkpoint(tmp_path / "src" / "ckpt-3", {"model.index": 10})
    (src / "model.data-00000-of-00001").symlink_to("/proc/self/environ")
    with pytest.raises(CheckpointError, match="holds a link, model.data-00000-of-00001: a checkpoint is regular"):
        await send_checkpoint(address, src, "job-1")
    assert not (ramdisk.root / "job-1").exists() and leftovers(ramdisk) == []
    os.mkfifo(src / "pipe")  # not a file: left out, not waited on
    (src / "model.data-00000-of-00001").unlink()
    reply = await send_checkpoint(address, src, "job-1")
    assert sorted(p.name for p in Path(reply.path).iterdir()) == ["model.index"]


async def _stream(address: str, chunks: list[helper_pb2.CheckpointChunk]) -> helper_pb2.PutCheckpointResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await helper_pb2_grpc.HelperAgentStub(channel).PutCheckpoint(iter(chunks), timeout=10)


async def test_a_cut_transfer_is_never_visible(agent: tuple[str, Ramdisk], tmp_path: Path) -> None:
    address, ramdisk = agent
    src = make_checkpoint(tmp_path / "src" / "c", {"data": 2 * (1 << 20), "gandiva.json": 10})
    chunks = list(checkpoint_chunks(src, "job-1", chunk_bytes=1 << 19))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _stream(address, chunks[:3])  # the sender went away before the last chunk
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "transfer cut" in (err.value.details() or "")
    assert not (ramdisk.root / "job-1" / "c").exists() and leftovers(ramdisk) == []


async def test_a_corrupted_transfer_is_refused(agent: tuple[str, Ramdisk], tmp_path: Path) -> None:
    address, ramdisk = agent
    src = make_checkpoint(tmp_path / "src" / "c", {"data": 1000})
    chunks = list(checkpoint_chunks(src, "job-1"))
    # A flipped byte on the way (flipped: a byte set to b"x" was no change 1 time in 256,
    # the data being random, and the test failed then).
    chunks[0].data = bytes([chunks[0].data[0] ^ 0xFF]) + chunks[0].data[1:]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _stream(address, chunks)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert not (ramdisk.root / "job-1" / "c").exists() and leftovers(ramdisk) == []


@pytest.mark.parametrize(("field", "value"), [("name", "../escape"), ("job_id", "a/b"), ("checkpoint_name", "..")])
async def test_unsafe_names_are_refused_naming_the_field(
    agent: tuple[str, Ramdisk], tmp_path: Path, field: str, value: str
) -> None:
    address, ramdisk = agent
    chunks = list(checkpoint_chunks(make_checkpoint(tmp_path / "src" / "c", {"data": 10}), "job-1"))
    setattr(chunks[0], field, value)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _stream(address, chunks)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and value in (err.value.details() or "")
    assert not (tmp_path / "escape").exists() and leftovers(ramdisk) == []


async def test_an_existing_checkpoint_is_not_overwritten(agent: tuple[str, Ramdisk], tmp_path: Path) -> None:
    address, _ = agent
    src = make_checkpoint(tmp_path / "src" / "c", {"data": 10})
    await send_checkpoint(address, src, "job-1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send_checkpoint(address, src, "job-1")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_prepare_drops_transfers_a_crash_left_behind(tmp_path: Path) -> None:
    ramdisk = Ramdisk(tmp_path / "rd")
    stale = ramdisk.root / "job-1" / f"{INCOMING_PREFIX}abc"
    stale.mkdir(parents=True)
    done = ramdisk.root / "job-1" / "ckpt"
    done.mkdir()
    ramdisk.prepare()
    assert not stale.exists() and done.exists()


def _aged(ramdisk: Ramdisk, now: float):  # type: ignore[no-untyped-def]
    def ckpt(job: str, name: str, age_s: float) -> Path:
        path = ramdisk.root / job / name
        path.mkdir(parents=True)
        os.utime(path, (now - age_s, now - age_s))
        return path
    return ckpt


def test_old_checkpoints_are_pruned_but_a_live_jobs_newest_stays(tmp_path: Path) -> None:
    ramdisk = Ramdisk(tmp_path / "rd")
    now = 10_000.0
    ckpt = _aged(ramdisk, now)
    old_live, newest_live = ckpt("live", "a", 5000), ckpt("live", "b", 4000)
    recent = ckpt("gone", "c", 60)  # a migration may still fall back on it
    old_gone = ckpt("gone", "d", 5000)
    removed = ramdisk.prune({"live"}, retain_s=600, now=now, kept=set())
    assert set(removed) == {old_live, old_gone}
    assert newest_live.exists() and recent.exists()
    ramdisk.prune(set(), retain_s=600, now=now + 1000, kept=set())
    assert not (ramdisk.root / "gone").exists() and not (ramdisk.root / "live").exists()


def test_a_parked_jobs_checkpoint_stays_while_the_scheduler_needs_it(tmp_path: Path) -> None:
    """A parked job has no process here, and may wait in the queue for hours: its restore
    point, named by the scheduler, outlives the retention; the job's older ones do not."""
    ramdisk = Ramdisk(tmp_path / "rd")
    now = 10_000.0
    ckpt = _aged(ramdisk, now)
    older, parked = ckpt("parked", "periodic-1", 9000), ckpt("parked", "park-1", 8000)
    other = ckpt("done", "park-2", 8000)
    # The shim may save into a subdirectory of the directory it was given.
    removed = ramdisk.prune(set(), retain_s=600, now=now, kept={str(parked / "model")})
    assert set(removed) == {older, other}
    assert parked.exists()
    # Once the job resumed (or ended) the scheduler stops naming it: it goes too.
    assert ramdisk.prune(set(), retain_s=600, now=now, kept=set()) == [parked]


def test_the_housekeeping_removes_nothing_through_a_link_a_job_put_in_the_ramdisk(tmp_path: Path) -> None:
    """A job runs as its helper's user and may write the ramdisk. A link there to a folder
    (`<ramdisk>/x -> /home/alice`) was taken for a job's folder and its subfolders for old
    checkpoints: the helper's housekeeping deleted all but the newest of them, wherever the
    link pointed (another user's files, when the helper runs as root). So was a link in a
    job's folder to a folder elsewhere (its contents). Links are passed over now."""
    ramdisk = Ramdisk(tmp_path / "rd")
    now = 10_000.0
    outside = tmp_path / "someone-elses"
    for name in ("old", "older", "newest"):
        (outside / name).mkdir(parents=True)
        (outside / name / "data").write_text("keep me")
    os.utime(outside / "older", (now - 9000, now - 9000))
    os.utime(outside / "old", (now - 8000, now - 8000))
    ckpt = _aged(ramdisk, now)
    ckpt("job", "a", 9000)
    (ramdisk.root / "x").symlink_to(outside)
    (ramdisk.root / "job" / "ln").symlink_to(outside / "old")
    os.utime(ramdisk.root / "job" / "ln", (now - 9000, now - 9000), follow_symlinks=False)
    (outside / ".incoming-1").mkdir()  # what the helper's start removes, in a job's folder
    (outside / ".incoming-1" / "data").write_text("keep me")
    removed = ramdisk.prune(set(), retain_s=600, now=now, kept=set())
    ramdisk.prepare()
    assert removed == [ramdisk.root / "job" / "a"]
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("data")) == \
        [".incoming-1/data", "newest/data", "old/data", "older/data"]


def test_when_the_scheduler_has_not_said_every_jobs_newest_checkpoint_stays(tmp_path: Path) -> None:
    ramdisk = Ramdisk(tmp_path / "rd")
    now = 10_000.0
    ckpt = _aged(ramdisk, now)
    older, newest = ckpt("parked", "a", 9000), ckpt("parked", "b", 8000)
    assert ramdisk.prune(set(), retain_s=600, now=now, kept=None) == [older]
    assert newest.exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (a ramdisk that fills up); needs root, as CI has."""
    where = tmp_path / "small"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          check=False, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root only): {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_full_ramdisk_refuses_the_checkpoint_clearly_and_keeps_no_partial_copy(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """A checkpoint larger than the space left: RESOURCE_EXHAUSTED saying so, and the
    partial copy is removed (it used to stay when closing the file failed as well, and
    kept the ramdisk full until the helper restarted: every later transfer failed too)."""
    async with agent_on(small_tmpfs / "rd") as (address, ramdisk):
        big = make_checkpoint(tmp_path / "src" / "big", {"data": 2 * (1 << 20), "gandiva.json": 10})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            # Small chunks (a peer may send any size): the failed write leaves bytes buffered.
            await _stream(address, list(checkpoint_chunks(big, "job-1", chunk_bytes=3000)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        assert "no space left in" in (err.value.details() or "")
        assert leftovers(ramdisk) == [] and not (ramdisk.root / "job-1" / "big").exists()
        # The space is free again: the next checkpoint that fits lands.
        small = make_checkpoint(tmp_path / "src" / "small", {"data": 300_000, "gandiva.json": 10})
        reply = await send_checkpoint(address, small, "job-1")
        assert digest_of(Path(reply.path)) == digest_of(small)


async def test_a_disk_turned_read_only_mid_stream_is_refused_saying_so(tmp_path: Path) -> None:
    """The ramdisk on a disk (ext4, errors=remount-ro) that fails mid-stream: the kernel
    turns it read-only and the next write fails (EROFS). The sender is told what happened,
    UNAVAILABLE "cannot write the checkpoint in RAMDISK ...: Read-only file system: its disk
    failed or was made read-only", and nothing is taken for a checkpoint. Before, the
    OSError left the servicer unexpected: "UNKNOWN: Unexpected <class 'OSError'>: [Errno 30]
    Read-only file system", with no path and a traceback in the helper's log."""
    from .conftest import failing_ext4

    with failing_ext4(tmp_path / "disk") as fail:
        async with agent_on(tmp_path / "disk" / "rd") as (address, ramdisk):
            src = make_checkpoint(tmp_path / "src" / "c", {"data": 4 * (1 << 20), "gandiva.json": 10})

            async def failing_midway() -> AsyncIterator[helper_pb2.CheckpointChunk]:
                for i, chunk in enumerate(checkpoint_chunks(src, "job-1", chunk_bytes=1 << 18)):
                    if i == 4:  # a megabyte written: the disk fails
                        while not list(ramdisk.root.glob(f"job-1/{INCOMING_PREFIX}*/data")):
                            await asyncio.sleep(0.01)
                        fail.write_text("gandiva test: the disk fails\n")
                    yield chunk

            async with grpc.aio.insecure_channel(address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await helper_pb2_grpc.HelperAgentStub(channel).PutCheckpoint(failing_midway(), timeout=30)
            details = err.value.details() or ""
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (err.value.code(), details)
            assert f"cannot write the checkpoint in {ramdisk.root}" in details, details
            assert "Read-only file system: its disk failed or was made read-only" in details, details
            assert not (ramdisk.root / "job-1" / "c").exists()
