"""Checkpoint directories: atomic writing and validation (no TensorFlow here).

A checkpoint is a directory holding the tf.compat.v1.train.Saver files of the
training state (prefix `model`, no meta-graph, no `checkpoint` state file) and
`gandiva.json`:

    {"format": 1, "job_id": ..., "global_step": N, "replicas": R,
     "created_at": unix seconds, "prefix": "model",
     "files": [{"name": "model.index", "size": 1234}, ...]}

It is written into a temporary sibling (`.NAME.tmp-PID-RAND`), every file and the
directory fsync'd, then renamed into place; an existing checkpoint of the same
name is swapped out atomically (renameat2 RENAME_EXCHANGE) and then deleted, so
at every instant the name holds either the old or the new, complete checkpoint.
`validate()` refuses a directory whose gandiva.json is missing or whose files do
not match the list, so a half-written directory is never restored.

The position of each tf.data iterator the training run reads is a file of its own
(`iterator-N.state`, TensorFlow's serialized iterator state), listed under
`"iterators": {"<iterator op name>": {"file": ..., "sha256": ..., "made_by": "<its
initializer op>", "feeds": "<digest of what that run was fed>"}}`; its digest is checked
before it is put back (tf_runtime.data_state).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST = "gandiva.json"
PREFIX = "model"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or is not a complete, valid checkpoint."""


class TowersChanged(CheckpointError):
    """The checkpoint holds another number of tower copies than the graph that would
    restore it: the program builds one tower per device and was grown or shrunk, so
    training on would average another number of gradients (a different result)."""

    def __init__(self, what: str, checkpoint_towers: int, towers: int) -> None:
        self.checkpoint_towers = checkpoint_towers
        self.towers = towers
        super().__init__(
            f"{what} holds {checkpoint_towers} tower cop"
            f"{'y' if checkpoint_towers == 1 else 'ies'} of the variables, this launch's graph "
            f"builds {towers}: the program builds one tower per device, so training on after "
            "this grow or shrink would change its result; use tf_runtime.towers for fixed "
            "logical towers")


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int
    replicas: int
    bytes: int
    seconds: float  # save or restore time


def write_atomically(target: str | os.PathLike[str], fill: Callable[[Path], object],
                     meta: dict[str, Any]) -> tuple[Path, int]:
    """Create checkpoint directory `target` with `fill(tmpdir)` plus the manifest.

    Returns (path, total bytes). On any error the temporary directory is removed
    and the previous checkpoint at `target` (if any) is untouched.
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        fill(tmp)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        listing: list[dict[str, Any]] = [{"name": p.name, "size": p.stat().st_size} for p in files]
        manifest = {"format": FORMAT, "prefix": PREFIX, "created_at": time.time(),
                    **meta, "files": listing}
        with open(tmp / MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        for p in files:
            fsync_path(p)
        fsync_path(tmp)
        _swap_into_place(tmp, target)
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, sum(int(f["size"]) for f in listing)


def validate(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a complete checkpoint; CheckpointError naming what is wrong."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint {d}: no such directory")
    try:
        manifest = parse_manifest((d / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {d}: no {MANIFEST} (incomplete or not a checkpoint)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {d}: unreadable {MANIFEST}: {exc}") from exc
    return check_manifest(d, manifest)


def parse_manifest(data: bytes) -> Any:
    """gandiva.json's bytes as JSON; ValueError for anything else (JSON nested too deeply for
    the parser's recursion included: a manifest is the job's to write)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def check_manifest(directory: str | os.PathLike[str], manifest: Any) -> dict[str, Any]:
    """``manifest`` if it describes the complete checkpoint in ``directory``; else
    CheckpointError naming what is wrong. Its shape is checked before it is used: the job
    writes it, and its helper checks it before a restore (a list of numbers for its files was
    a TypeError there)."""
    d = Path(directory)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} has format "
                              f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected {FORMAT}")
    for key in ("global_step", "files", "prefix"):
        if key not in manifest:
            raise CheckpointError(f"checkpoint {d}: {MANIFEST} lacks {key!r}")
    # The step the restored copy goes on from (the shim reads it with int(): a list was a
    # TypeError there, after its helper had launched it; true or 2.5 went on from 1 or 2).
    if type(manifest["global_step"]) is not int:
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} 'global_step' must be a whole number of "
                              f"steps, not {_short(manifest['global_step'])}")
    if not isinstance(manifest["prefix"], str):
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} 'prefix' must be the saved files' name, "
                              f"not {_short(manifest['prefix'])}")
    if not isinstance(manifest["files"], list) or not all(
            isinstance(e, dict) and _plain_name(e.get("name")) and type(e.get("size")) is int
            for e in manifest["files"]):
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} 'files' must list each file as "
                              f"{{\"name\": a file name, \"size\": bytes}}, not {_short(manifest['files'])}")
    for entry in manifest["files"]:
        p = d / entry["name"]
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {d}: listed file {entry['name']} is missing") from None
        if size != entry["size"]:
            raise CheckpointError(f"checkpoint {d}: {entry['name']} has {size} bytes, "
                                  f"{MANIFEST} says {entry['size']} (truncated or overwritten)")
    split = manifest.get("split", [])
    if not isinstance(split, list) or not all(isinstance(n, str) for n in split):
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} 'split' must be a list of variable "
                              f"names, not {_short(split)}")
    names = {e["name"] for e in manifest["files"]}
    iterators = manifest.get("iterators", {})
    if not isinstance(iterators, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("file"), str) and e["file"] in names
            and isinstance(e.get("sha256"), str)
            for e in iterators.values()):
        raise CheckpointError(f"checkpoint {d}: {MANIFEST} 'iterators' must map each iterator "
                              f"to a listed file and its sha256, not {_short(iterators)}")
    if f"{manifest['prefix']}.index" not in names:
        raise CheckpointError(f"checkpoint {d}: no {manifest['prefix']}.index in the file list")
    return manifest


def _plain_name(name: Any) -> bool:
    """A file's own name (the writer lists its directory's entries): no folder, not . or .."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def iterator_entries(states: dict[str, bytes], made_by: dict[str, str],
                     feeds: dict[str, str]) -> dict[str, dict[str, str]]:
    """The manifest's `iterators` for the iterator states `states` (name -> bytes), each
    with the initializer op its iterator was last initialised by (`made_by`; "" for a
    one-shot iterator) and a digest of the values that run was fed (`feeds`, "" unfed)."""
    return {name: {"file": f"iterator-{i}.state", "sha256": hashlib.sha256(state).hexdigest(),
                   "made_by": made_by.get(name, ""), "feeds": feeds.get(name, "")}
            for i, (name, state) in enumerate(sorted(states.items()))}


def write_iterator_states(tmp: Path, states: dict[str, bytes],
                          entries: dict[str, dict[str, str]]) -> None:
    """Write each state into the file its entry names (inside write_atomically's `fill`)."""
    for name, entry in entries.items():
        (tmp / entry["file"]).write_bytes(states[name])


def read_iterator_states(directory: str | os.PathLike[str],
                         manifest: dict[str, Any]) -> dict[str, tuple[bytes, str, str]]:
    """The iterator states a validated checkpoint holds (name -> (bytes, made_by, feeds));
    CheckpointError when a file's bytes changed after it was written."""
    out = {}
    for name, entry in (manifest.get("iterators") or {}).items():
        data = (Path(directory) / entry["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"checkpoint {directory} is damaged (a file changed after it "
                                  f"was written), nothing restored: {entry['file']}, the "
                                  f"position of tf.data iterator {name!r}, fails its sha256")
        out[name] = (data, str(entry.get("made_by") or ""), str(entry.get("feeds") or ""))
    return out


def check_towers(directory: str | os.PathLike[str], manifest: dict[str, Any], towers: int) -> None:
    """TowersChanged unless the checkpoint (its manifest) was saved by a graph with
    `towers` tower copies. A manifest without the count (an older writer) passes."""
    saved = manifest.get("replicas")
    if isinstance(saved, int) and saved >= 1 and saved != towers:
        raise TowersChanged(f"checkpoint {directory}", saved, towers)


def remove_stale_temporaries(parent: str | os.PathLike[str]) -> list[Path]:
    """Delete temporaries left by writers that died (their pid is gone)."""
    removed = []
    for p in Path(parent).glob(".*.tmp-*-*"):
        try:
            pid = int(p.name.rsplit("-", 2)[-2])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _swap_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():
        try:
            os.rename(tmp, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old checkpoint
        return
    # No renameat2 (old kernel, other OS): move the old one aside first. Between the
    # two renames the name is briefly absent, never half-written.
    old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")
