"""tf_runtime.own_exports: a copy restarted from an earlier checkpoint exports again the
SavedModels of the steps it trains again; the directories the lost process filled for them
are removed first (TensorFlow's builder refuses a directory that exists, and the job used
to fail there). Live: `test_tfr_feed_from_step.py -k "more_kinds and export"`
(GANDIVA_FULL_TESTS=1), programs/export_every.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tf_runtime import own_exports
from tf_runtime.own_exports import redone_export


def _export(path: Path, when: float, marker: str = "saved_model.pb") -> Path:
    (path / "variables").mkdir(parents=True)
    for f in (path / marker, path / "variables" / "variables.index", path / "variables"):
        if not f.exists():
            f.write_bytes(b"x")
        os.utime(f, (when, when))
    return path


def test_only_an_export_written_after_the_restored_checkpoint_by_an_earlier_process_is_redone(
        tmp_path: Path) -> None:
    since, before = 1000.0, 2000.0  # the checkpoint's time, this process's start
    assert redone_export(_export(tmp_path / "8", 1500.0), since, before)
    assert redone_export(str(_export(tmp_path / "txt", 1500.0, "saved_model.pbtxt")).encode(),
                         since, before)
    # Torn: the lost process was killed in its builder, before `save()` wrote the marker
    # (probed through the real CLI: `variables/` alone, and the restarted job failed).
    torn = tmp_path / "776" / "variables"
    torn.mkdir(parents=True)
    os.utime(torn, (1500.0, 1500.0))
    assert redone_export(tmp_path / "776", since, before)
    # A step's export the restored steps already had, a run's from before the job.
    assert not redone_export(_export(tmp_path / "4", 900.0), since, before)
    # Written by this process itself (the program exporting twice: TensorFlow's refusal).
    assert not redone_export(_export(tmp_path / "12", 2500.0), since, before)
    # Partly older: not all of it the lost process's.
    mixed = _export(tmp_path / "mixed", 1500.0)
    os.utime(mixed / "variables" / "variables.index", (900.0, 900.0))
    assert not redone_export(mixed, since, before)
    # Not a SavedModel (or a SavedModel beside files of the program's own), missing, or no
    # checkpoint time known.
    beside = _export(tmp_path / "beside", 1500.0)
    (beside / "notes.txt").write_text("x")
    os.utime(beside / "notes.txt", (1500.0, 1500.0))
    assert not redone_export(beside, since, before)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "a.txt").write_text("x")
    os.utime(other / "a.txt", (1500.0, 1500.0))
    assert not redone_export(other, since, before)
    assert not redone_export(tmp_path / "none", since, before)
    assert not redone_export(tmp_path / "8", None, before)


def test_a_checkpoint_fetched_to_another_server_is_dated_by_its_manifest(tmp_path: Path) -> None:
    """A job placed on another server restores a copy of its checkpoint fetched there (its
    files as new as the fetch, after the lost process's exports): the checkpoint's time is
    the manifest's `created_at`, so the export of a step the copy trains again is redone."""
    ck = tmp_path / "resume-2"
    ck.mkdir()
    (ck / "gandiva.json").write_text(json.dumps({"format": 1, "created_at": 1000.0}))
    os.utime(ck / "gandiva.json", (1800.0, 1800.0))  # fetched after export 8 was written
    assert own_exports.restored_at(str(ck)) == 1000.0
    assert redone_export(_export(tmp_path / "8", 1500.0), own_exports.restored_at(str(ck)), 2000.0)
    (ck / "gandiva.json").write_text("{}")  # no time in it: the file's
    os.utime(ck / "gandiva.json", (1800.0, 1800.0))
    assert own_exports.restored_at(str(ck)) == 1800.0
    assert own_exports.restored_at(str(tmp_path / "none")) is None


@pytest.mark.tf
def test_the_builder_of_a_restored_process_exports_a_redone_step_anew(tmp_path: Path) -> None:
    """The patched builder: in a restored process it removes such a directory before
    TensorFlow's check; in a process that restored nothing, TensorFlow refuses it."""
    tf = pytest.importorskip("tensorflow")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "gandiva.json").write_text("{}")
    since = own_exports._STARTED - 100
    os.utime(ck / "gandiva.json", (since, since))
    export = _export(tmp_path / "export" / "8", since + 50)
    state = SimpleNamespace(restored=False, settings=SimpleNamespace(restore_dir=str(ck)))
    own_exports.patch(lambda: state)
    try:
        with pytest.raises(AssertionError, match="already exists"):
            tf.compat.v1.saved_model.Builder(str(export))
        state.restored = True
        tf.compat.v1.saved_model.Builder(str(export))
        assert not (export / "saved_model.pb").exists()  # removed (the builder makes it anew)
    finally:
        own_exports.unpatch()
