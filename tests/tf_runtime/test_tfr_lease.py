"""The helper's lease, as the shim obeys it (tf_runtime.lease): a copy whose host froze
and woke holds before its next run and at its step's end until the helper renews the
lease; a periodic checkpoint sent before the freeze is not written meanwhile, and a KILL
ends the copy. The real chain and controller, a fake session."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tf_runtime import EXIT_KILLED
from tf_runtime.commands import Command, Kind
from tf_runtime.controller import Settings
from tf_runtime.lease import Lease, write_lease
from tf_runtime.testing import Exited, FakeWorld


def _trains_in_thread(world: FakeWorld) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def train() -> None:
        try:
            world.run("train")
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    return thread, errors


def _trained(lease: Path, steps: int) -> FakeWorld:
    """A copy that trained `steps` steps under a helper's lease."""
    write_lease(lease, time.monotonic() + 60)
    world = FakeWorld(Settings(job_id="fake", lease_file=str(lease)))
    world.run("init")
    world.run("read_gs")
    for _ in range(steps):
        world.run("train")
    assert world.sess.step == steps
    return world


def _lease_ran_out(world: FakeWorld, lease: Path) -> None:
    """Its host froze past the lease and woke: the end the copy read long ago has passed."""
    write_lease(lease, time.monotonic() - 1)
    world.controller.lease = Lease(str(lease))


def test_a_copy_whose_lease_ran_out_holds_until_it_is_renewed_and_writes_no_checkpoint(tmp_path: Path) -> None:
    lease = tmp_path / ".lease"
    world = _trained(lease, 3)
    # The host freezes; a periodic checkpoint arrives; the host wakes past the lease.
    world.controller.enqueue(Command("ck", Kind.CHECKPOINT, str(tmp_path / "periodic")))
    _lease_ran_out(world, lease)
    thread, errors = _trains_in_thread(world)
    thread.join(0.5)
    assert thread.is_alive(), "the copy ran on with its helper's lease run out"
    assert world.sess.step == 3 and world.channel.acks == []
    assert not (tmp_path / "periodic").exists(), "the checkpoint was written over the restore point"
    # Its helper renews the lease (a heartbeat answered in time): it goes on, checkpoint first.
    write_lease(lease, time.monotonic() + 60)
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert world.sess.step == 4
    assert [(a.command_id, a.ok, a.step) for a in world.channel.acks] == [("ck", True, 3)]


def test_a_held_copy_told_to_exit_leaves_without_training_or_saving(tmp_path: Path) -> None:
    lease = tmp_path / ".lease"
    world = _trained(lease, 1)
    _lease_ran_out(world, lease)
    world.controller.enqueue(Command("ck", Kind.CHECKPOINT, str(tmp_path / "periodic")))
    thread, errors = _trains_in_thread(world)
    thread.join(0.3)
    assert thread.is_alive()
    # The scheduler placed the job elsewhere: its KILL reaches this copy's stream.
    world.controller.enqueue(Command("kill", Kind.KILL, reason="its server went down"))
    thread.join(10)
    assert len(errors) == 1 and isinstance(errors[0], Exited) and errors[0].code == EXIT_KILLED
    assert world.sess.step == 1 and not (tmp_path / "periodic").exists()
    assert [(a.command_id, a.ok) for a in world.channel.acks] == [("ck", False), ("kill", True)]


@pytest.mark.parametrize("content", [None, "", "not a number"])
def test_no_lease_file_or_an_unreadable_one_holds_nothing(tmp_path: Path, content: str | None) -> None:
    """A helper older than the file writes none (and one that cannot write it removes it):
    the shim does not hold for it."""
    lease = tmp_path / ".lease"
    world = _trained(lease, 1)
    lease.unlink()
    if content is not None:
        lease.write_text(content)
    world.controller.lease = Lease(str(lease))
    for _ in range(3):
        world.run("train")
    assert world.sess.step == 4


def test_a_pipe_or_a_link_at_the_lease_files_temporary_name_neither_holds_the_helper_nor_is_written_through(
        tmp_path: Path) -> None:
    """The helper writes the lease at every answered heartbeat, on its event loop, through
    `<ramdisk>/.lease.tmp`, which its jobs may write (they run as its user). A named pipe
    there held open() for ever: no heartbeat, no command, the server called down and every
    job on it queued again. A link there was written through (its target truncated)."""
    import concurrent.futures
    import contextlib
    import os

    lease = tmp_path / ".lease"
    target = tmp_path / "someone-elses"
    target.write_text("keep me")
    for plant in ("fifo", "link"):
        tmp = tmp_path / ".lease.tmp"
        if plant == "fifo":
            os.mkfifo(tmp)
        else:
            tmp.symlink_to(target)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            writing = pool.submit(write_lease, lease, 1234.5)
            try:
                writing.result(timeout=10)
            except concurrent.futures.TimeoutError:
                with contextlib.suppress(OSError):  # frees a stuck open()
                    os.close(os.open(tmp, os.O_RDONLY | os.O_NONBLOCK))
                raise AssertionError(f"{plant}: write_lease did not return within 10 s") from None
        assert lease.read_text() == "1234.5" and not tmp.exists() and not tmp.is_symlink(), plant
        assert target.read_text() == "keep me", plant
