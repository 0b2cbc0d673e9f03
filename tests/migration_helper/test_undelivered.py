"""Process exits kept on the helper's disk until delivered (migration_helper.undelivered):
what an earlier run left is read back whole and in order, and nothing else is taken for one."""

from __future__ import annotations

from pathlib import Path

from migration_helper.undelivered import UndeliveredExits
from protos.gandiva.v1 import helper_pb2


def _exit(job: str, server: str = "s1") -> helper_pb2.ProcessExitRequest:
    return helper_pb2.ProcessExitRequest(server=server, job_id=job, incarnation="i-" + job, exit_code=0,
                                         reason="finished")


def test_exits_left_by_an_earlier_run_are_read_back_in_order_and_anything_else_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "exits"
    first = UndeliveredExits(root)
    kept = [first.keep(_exit(f"j{i}")) for i in range(3)]
    assert all(kept)
    first.forget(kept[1])  # delivered
    (root / ".cut-short.exit.tmp").write_bytes(_exit("torn").SerializeToString()[:5])
    (root / "9-not-an-exit.exit").write_bytes(b"\xff\xff\xff")
    foreign = first.keep(_exit("other", server="s2"))
    assert foreign is not None

    left = UndeliveredExits(root).load("s1")
    assert [(x.job_id, x.incarnation, x.exit_code, x.reason) for x, _ in left] == \
        [("j0", "i-j0", 0, "finished"), ("j2", "i-j2", 0, "finished")]
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for _, p in left)


def test_an_exit_that_cannot_be_written_is_said_and_not_kept(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert UndeliveredExits(blocker / "exits").keep(_exit("j")) is None
    assert "could not keep its process exit on disk" in caplog.text
    assert UndeliveredExits(tmp_path / "none").load("s1") == []


def test_what_is_read_back_is_what_a_registration_may_carry(tmp_path: Path, caplog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A job runs as its helper's Unix user, so it may write this folder (it is under the
    log directory). An exit the scheduler refuses (a job id of 65 bytes, a NUL in its
    launch), or more than a registration may carry (MAX_REGISTER_EXITS), was sent with
    every registration and the whole registration refused, INVALID_ARGUMENT, for good: the
    helper never registered again, its jobs frozen. Such an exit is now said and removed,
    and the oldest past the limit with it."""
    from migration_helper import undelivered
    from scheduler import validation
    from scheduler.validation import check_register_exits

    MAX_REGISTER_EXITS = 20  # (10,000: the same, 6 s slower) the limit of both sides
    monkeypatch.setattr(validation, "MAX_REGISTER_EXITS", MAX_REGISTER_EXITS)
    monkeypatch.setattr(undelivered, "MAX_REGISTER_EXITS", MAX_REGISTER_EXITS)
    root = tmp_path / "exits"
    exits = UndeliveredExits(root)
    bad = [exits.keep(_exit("j" * 65)), exits.keep(helper_pb2.ProcessExitRequest(
        server="s1", job_id="j-2", incarnation="a\x00b"))]
    oldest = exits.keep(_exit("oldest"))
    for i in range(MAX_REGISTER_EXITS):
        (root / f"{2 * 10**19 + i:020d}-1-{i:06d}.exit").write_bytes(_exit(f"j{i}").SerializeToString())

    left = UndeliveredExits(root).load("s1")
    check_register_exits("s1", [x for x, _ in left])  # what the scheduler's Register asks
    assert len(left) == MAX_REGISTER_EXITS and left[0][0].job_id == "j0", len(left)
    assert not any(p is not None and p.exists() for p in [*bad, oldest])
    assert "is not an exit a registration may carry (job_id: longer than 64 bytes" in caplog.text
    assert f"more than the {MAX_REGISTER_EXITS:,} a registration carries: the oldest 1 removed" in caplog.text


def test_a_torn_or_corrupt_exit_file_is_never_read_as_another_exit(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A file cut short (a disk error, fsck truncating it after a crash, a copy cut short) or
    with a byte flipped. Cut after the launch's id, a job's failure (exit status 1) read back
    as exit status 0, reason "": sent with the registration, the job was recorded SUCCEEDED,
    "finished". Such files are now said and removed (the job is then re-queued, as it was
    before exits were kept): an exit is read back as it was written, or not at all."""
    root = tmp_path / "exits"
    exits = UndeliveredExits(root)
    failed = helper_pb2.ProcessExitRequest(server="s1", job_id="j-failed", incarnation="i-1", exit_code=1,
                                           reason="exited with status 1", steps=7)
    whole = exits.keep(failed)
    assert whole is not None
    data = whole.read_bytes()
    cut = data[:data.index(b"i-1") + 3]  # up to the end of the launch's id
    torn = root / f"{whole.name[:-5]}-torn.exit"
    torn.write_bytes(cut)
    flipped = bytearray(data)
    flipped[flipped.index(b"status 1") + 7] ^= 0x01  # "status 0"
    (root / f"{whole.name[:-5]}-flipped.exit").write_bytes(bytes(flipped))

    left = UndeliveredExits(root).load("s1")
    assert [(x.job_id, x.exit_code, x.reason, x.steps) for x, _ in left] == \
        [("j-failed", 1, "exited with status 1", 7)]
    assert sorted(p.name for p in root.iterdir()) == [whole.name]
    assert caplog.text.count("checksum does not match") == 2, caplog.text


def test_an_exit_written_by_an_older_helper_is_still_read_back(tmp_path: Path) -> None:
    """The files a helper of before the check wrote (the protobuf alone) are what its
    upgrade's restart finds: still read, unless they lack what every exit has."""
    root = tmp_path / "exits"
    root.mkdir()
    (root / "00000000000000000001-1-000000.exit").write_bytes(_exit("j-old").SerializeToString())
    cut = helper_pb2.ProcessExitRequest(server="s1", job_id="j-cut", incarnation="i-2").SerializeToString()
    (root / "00000000000000000002-1-000000.exit").write_bytes(cut)
    left = UndeliveredExits(root).load("s1")
    assert [(x.job_id, x.reason) for x, _ in left] == [("j-old", "finished")]


def test_an_entry_that_cannot_be_removed_does_not_stop_the_helper(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A directory where an exit file would be (the folder is the jobs' to write too), or a
    file on a folder that cannot be written: its removal failed, and the helper's start
    with it (IsADirectoryError out of `gandiva helper`). Now said, and passed over."""
    root = tmp_path / "exits"
    (root / "00000000000000000001-1-000000.exit").mkdir(parents=True)
    (root / ".00000000000000000002-1-000000.exit.tmp").mkdir()
    kept = UndeliveredExits(root).keep(_exit("j"))
    assert kept is not None
    left = UndeliveredExits(root).load("s1")
    assert [x.job_id for x, _ in left] == ["j"]
    assert "could not remove" in caplog.text


def test_a_pipe_or_a_link_among_the_exits_is_removed_without_waiting_on_it(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The folder is under the log directory, which the jobs may write (they run as the
    helper's user). A named pipe there was opened at the helper's start and waited for a
    writer for ever: the helper never started, so never registered; a link was followed (to
    /dev/zero: read until memory ran out; to a file of the job's: sent as an exit). Each is
    now removed at once, and the exits beside it sent."""
    import concurrent.futures
    import contextlib
    import os

    root = tmp_path / "exits"
    exits = UndeliveredExits(root)
    kept = exits.keep(_exit("j-kept"))
    os.mkfifo(root / "00000000000000000001-1-000000.exit")
    linked = exits.keep(_exit("j-link"))
    assert linked is not None and kept is not None
    linked.rename(tmp_path / "elsewhere")
    (root / "00000000000000000002-1-000000.exit").symlink_to(tmp_path / "elsewhere")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = pool.submit(UndeliveredExits(root).load, "s1")
        try:
            left = loading.result(timeout=10)
        except concurrent.futures.TimeoutError:
            for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):  # frees a stuck open()
                with contextlib.suppress(OSError):
                    os.close(os.open(root / "00000000000000000001-1-000000.exit", flags))
            raise AssertionError("load() did not return within 10 s") from None
    assert [(x.job_id, p) for x, p in left] == [("j-kept", kept)]
    assert sorted(p.name for p in root.iterdir()) == [kept.name]
    assert caplog.text.count("not a regular file") == 2, caplog.text
