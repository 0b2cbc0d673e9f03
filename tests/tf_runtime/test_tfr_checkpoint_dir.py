"""Checkpoint directories: atomic replacement, validation, a writer killed mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tf_runtime.checkpoint import (
    CheckpointError,
    remove_stale_temporaries,
    validate,
    write_atomically,
)


def fill_with(content: bytes):
    def fill(tmp: Path) -> None:
        (tmp / "model.index").write_bytes(content)
        (tmp / "model.data-00000-of-00001").write_bytes(content * 10)

    return fill


def test_written_checkpoint_validates_and_lists_its_files(tmp_path: Path) -> None:
    path, size = write_atomically(tmp_path / "ck", fill_with(b"abc"), {"global_step": 5, "job_id": "j"})
    manifest = validate(path)
    assert manifest["global_step"] == 5 and manifest["job_id"] == "j"
    assert {f["name"]: f["size"] for f in manifest["files"]} == {
        "model.index": 3, "model.data-00000-of-00001": 30}
    assert size == 33
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporaries left behind


def test_replacing_a_checkpoint_swaps_it_whole(tmp_path: Path) -> None:
    write_atomically(tmp_path / "ck", fill_with(b"old"), {"global_step": 1})
    write_atomically(tmp_path / "ck", fill_with(b"newer"), {"global_step": 2})
    assert validate(tmp_path / "ck")["global_step"] == 2
    assert (tmp_path / "ck" / "model.index").read_bytes() == b"newer"
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_failed_fill_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    write_atomically(tmp_path / "ck", fill_with(b"old"), {"global_step": 1})

    def broken(tmp: Path) -> None:
        (tmp / "model.index").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(tmp_path / "ck", broken, {"global_step": 2})
    assert validate(tmp_path / "ck")["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "gandiva.json").unlink(), "no gandiva.json"),
    (lambda d: (d / "model.index").unlink(), "model.index is missing"),
    (lambda d: (d / "model.data-00000-of-00001").write_bytes(b"x"), "truncated"),
    (lambda d: (d / "gandiva.json").write_text("{"), "unreadable"),
])
def test_damaged_checkpoints_are_refused(tmp_path: Path, damage, message: str) -> None:
    write_atomically(tmp_path / "ck", fill_with(b"abc"), {"global_step": 1})
    damage(tmp_path / "ck")
    with pytest.raises(CheckpointError, match=message):
        validate(tmp_path / "ck")


def test_writer_killed_mid_write_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """A real process SIGKILLed while its checkpoint is half written."""
    write_atomically(tmp_path / "ck", fill_with(b"good"), {"global_step": 7})
    writer = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tf_runtime.checkpoint import write_atomically
        def fill(tmp):
            with open(tmp / "model.data-00000-of-00001", "wb") as fh:
                fh.write(b"half" * 100000)
                fh.flush()
                print("writing", flush=True)
                time.sleep(60)
        write_atomically({str(tmp_path / 'ck')!r}, fill, {{"global_step": 8}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    leftovers = [p for p in tmp_path.iterdir() if p.name != "ck"]
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0].name
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert validate(tmp_path / "ck")["global_step"] == 7
    with pytest.raises(CheckpointError, match="no gandiva.json"):
        validate(leftovers[0])  # the half-written one can never be restored
    assert remove_stale_temporaries(tmp_path) == leftovers
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_manifest_is_plain_json_for_other_tools(tmp_path: Path) -> None:
    write_atomically(tmp_path / "ck", fill_with(b"a"), {"global_step": 3, "replicas": 4,
                                                        "job_id": "j"})
    data = json.loads((tmp_path / "ck" / "gandiva.json").read_text())
    assert {"job_id", "global_step", "replicas", "created_at", "files"} <= set(data)
    assert abs(data["created_at"] - time.time()) < 60
