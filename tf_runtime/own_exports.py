"""The program's own SavedModel exports in a copy restarted from an earlier checkpoint.

A program that exports its model as it trains (`tf.compat.v1.saved_model.Builder(
"export/<step>")` every N steps, `simple_save`) makes each export directory once. A copy
restarted from Gandiva's last checkpoint after its server was lost trains again the steps
the lost process made after that checkpoint, and so exports again into directories the
lost process already filled: TensorFlow's builder refuses a directory that exists and is
not empty ("Export directory ... already exists"), and the job, which the uninterrupted
run ends, failed there. In a restored process such a directory is removed before the
program's builder makes it again, when it holds a SavedModel (or the `variables/` a builder
killed mid-export left) all of whose files were written after the restored checkpoint and
before this process started: the export of a step this copy redoes, as the uninterrupted
run makes it once. An older directory (a run's
from before the job, one the restored steps already had) is left alone, and the program's
builder refuses it as it would without Gandiva.
Nothing here imports TensorFlow at module level."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from .checkpoint import MANIFEST

log = logging.getLogger("tf_runtime")

_STARTED = time.time()  # this process (its shim) started: files from before are another's
_ORIG: dict[str, Any] = {}
_MARKERS = ("saved_model.pb", "saved_model.pbtxt")
# What a SavedModel directory holds: a builder killed before its `save()` (the lost process
# died mid-export) leaves `variables/` (and maybe assets) without the marker.
_LAYOUT = frozenset({*_MARKERS, "variables", "assets", "assets.extra", "fingerprint.pb"})


def redone_export(export_dir: Any, since: float | None, before: float = _STARTED) -> bool:
    """Whether `export_dir` is a SavedModel (or one torn by a builder killed mid-export)
    that an earlier process of the job wrote for a step this one trains again: nothing in
    it but a SavedModel's layout, every file written at `since` (the restored checkpoint's
    time) or later and before `before`; None `since`: not known, no."""
    if since is None:
        return False
    try:
        path = os.fsdecode(export_dir)
    except TypeError:
        return False
    try:
        top = set(os.listdir(path)) if os.path.isdir(path) else set()
    except OSError:
        return False
    # A SavedModel, or one a killed builder left torn (its variables written, no marker).
    if not top or not top <= _LAYOUT or not (top & {*_MARKERS, "variables"}):
        return False
    times = []
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            try:
                times.append(os.lstat(os.path.join(root, name)).st_mtime)
            except OSError:
                return False
    return bool(times) and min(times) >= since and max(times) < before


def restored_at(restore_dir: str | None) -> float | None:
    """When the checkpoint in `restore_dir` was written, or None: its manifest's
    `created_at` (the clock of the process that wrote it, as the export files' times are),
    not the manifest file's time, which in a copy fetched to the server the job was placed
    on is the fetch's, after the lost process's exports; that file's time only for a
    manifest without one."""
    if not restore_dir:
        return None
    path = os.path.join(restore_dir, MANIFEST)
    try:
        with open(path) as fh:
            created = json.load(fh).get("created_at")
    except (OSError, ValueError, AttributeError):
        created = None
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        return float(created)
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def patch(controller: Callable[[], Any]) -> None:
    """Route the SavedModel builder's construction through `redone_export` while
    `controller()` is a controller that restored a checkpoint."""
    from tensorflow.python.saved_model import builder_impl

    cls = builder_impl._SavedModelBuilder
    if _ORIG:
        return
    orig = _ORIG["init"] = cls.__init__

    def __init__(self: Any, export_dir: Any, *args: Any, **kwargs: Any) -> None:
        ctl = controller()
        if ctl is not None and ctl.restored:
            try:
                if redone_export(export_dir, restored_at(ctl.settings.restore_dir)):
                    log.warning("removing the SavedModel %s an earlier process of this job "
                                "exported after the checkpoint it restarts from: this copy "
                                "trains that step again and exports it anew", export_dir)
                    shutil.rmtree(os.fsdecode(export_dir))
            except Exception:  # never break the program's export
                log.exception("could not look at the program's export directory %s", export_dir)
        orig(self, export_dir, *args, **kwargs)

    __init__.__doc__ = orig.__doc__
    cls.__init__ = __init__


def unpatch() -> None:
    """Undo `patch` (tests)."""
    if not _ORIG:
        return
    from tensorflow.python.saved_model import builder_impl

    builder_impl._SavedModelBuilder.__init__ = _ORIG.pop("init")
