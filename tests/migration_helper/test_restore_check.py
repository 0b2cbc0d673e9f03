"""A launch (or activation) from a checkpoint that is not whole on the helper's host: gone
(a reboot wiped the ramdisk) or cut short (a checkpoint root on a disk whose unsynced writes
a power cut lost). The helper refuses it, naming what is wrong, so that the scheduler starts
the job from step 0 saying so; before, a cut one was launched, its shim refused it (exit
status 2) and the job FAILED. Live: tests/multihost/test_host_reboot.py (`full`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# Any JSON value, small: what a job could leave in its manifest's fields.
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=6)
_FIELDS = ("global_step", "prefix", "files", "files.0", "files.0.name", "files.0.size", "split", "iterators",
           "iterators.it", "iterators.it.file", "iterators.it.sha256", "replicas")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_FIELDS), value=_JSON)
def test_a_manifest_of_any_shape_is_taken_whole_or_refused_naming_it(tmp_path: Path, field: str, value: Any) -> None:
    """The shim's manifest with one field (or part of one) replaced by any JSON value: the
    helper takes the launch only where the shim can restore from it (the step it goes on from
    a whole number), else refuses it naming the manifest. Before: an iterator entry whose
    file was a list was a TypeError out of the check (a bug's traceback, "launch: TypeError");
    a step of null, "x", a list or true was taken, and the launched shim failed at int() of it
    (or went on from step 1 for true)."""
    folder = tmp_path / "ck"
    if not folder.exists():
        _checkpoint(folder)
        (folder / "it.state").write_bytes(b"")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = [e for e in manifest["files"] if e["name"] != MANIFEST]
    if not any(e["name"] == "it.state" for e in manifest["files"]):
        manifest["files"].append({"name": "it.state", "size": 0})
    manifest.update(split=[], iterators={"it": {"file": "it.state", "sha256": "0" * 64}}, replicas=1)
    *path, last = field.split(".")
    holder: Any = manifest
    for key in path:
        holder = holder[int(key)] if isinstance(holder, list) else holder[key]
    holder[int(last) if isinstance(holder, list) else last] = value
    spoiled = tmp_path / "spoiled"
    spoiled.mkdir(exist_ok=True)
    for entry in folder.iterdir():
        (spoiled / entry.name).write_bytes(entry.read_bytes())
    (spoiled / MANIFEST).write_text(json.dumps(manifest))
    try:
        _check_restore("launch", str(spoiled), "h1")
    except CommandFailed as refused:
        assert str(spoiled) in str(refused) and "on h1: cut short or damaged" in str(refused), refused
        return
    assert type(manifest["global_step"]) is int, f"taken with global_step {manifest['global_step']!r}"
