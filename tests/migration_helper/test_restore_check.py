"""A launch (or activation) from a checkpoint that is not whole on the helper's host: gone
(a reboot wiped the ramdisk) or cut short (a checkpoint root on a disk whose unsynced writes
a power cut lost). The helper refuses it, naming what is wrong, so that the scheduler starts
the job from step 0 saying so; before, a cut one was launched, its shim refused it (exit
status 2) and the job FAILED. Live: tests/multihost/test_host_reboot.py (`full`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from migration_helper.jobs import CommandFailed, _check_restore
from tf_runtime.checkpoint import FORMAT, MANIFEST


def _checkpoint(folder: Path) -> Path:
    folder.mkdir()
    (folder / "model.index").write_bytes(b"i" * 40)
    (folder / "model.data-00000-of-00001").write_bytes(b"d" * 400)
    files = [{"name": p.name, "size": p.stat().st_size} for p in sorted(folder.iterdir())]
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "global_step": 85, "files": files,
                                               "prefix": "model"}, indent=1))
    return folder


def test_a_checkpoint_cut_short_is_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    whole = _checkpoint(tmp_path / "whole")
    _check_restore("launch", str(whole), "h1")  # taken
    with pytest.raises(CommandFailed, match="not found on h1"):
        _check_restore("launch", str(tmp_path / "gone"), "h1")
    data = _checkpoint(tmp_path / "data")
    (data / "model.data-00000-of-00001").write_bytes(b"d" * 200)
    with pytest.raises(CommandFailed, match=r"has 200 bytes, .* says 400 .*on h1: cut short or damaged"):
        _check_restore("launch", str(data), "h1")
    manifest = _checkpoint(tmp_path / "manifest")
    text = (manifest / MANIFEST).read_bytes()
    (manifest / MANIFEST).write_bytes(text[:len(text) // 2])
    with pytest.raises(CommandFailed, match=f"activate: checkpoint .*: unreadable {MANIFEST} .*cut short or damaged"):
        _check_restore("activate", str(manifest), "h1")
    own = tmp_path / "own"  # a program's own runtime, not the shim: its program judges it
    own.mkdir()
    (own / MANIFEST).write_text('{"global_step": 3, "files": {"state": 1}}')
    _check_restore("launch", str(own), "h1")
