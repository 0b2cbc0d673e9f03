"""Gandiva's own modules that the shim needs in a job's process (the runtime protocol and the
transport), whatever the program names its own.

They live in the top-level packages `protos` and `scheduler`, names a training project may
use for its own code: a `scheduler.py` of learning-rate schedules or a `protos/` package of
configuration messages beside the script, first on sys.path. The shim's `from scheduler
import transport` then found the program's module, and the shim did not start ("cannot
import name 'transport' from 'scheduler'"): the job ran uncontrollable, never suspended or
migrated. When such a name is the program's (already imported, or first on sys.path), the
shim's modules are imported from Gandiva's own directory and then taken out of
`sys.modules` again, the program's put back: the program imports its own by those names,
the shim keeps references to Gandiva's. Otherwise they are imported as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOPS = ("protos", "scheduler")
_NEEDED = ("protos.gandiva.v1.runtime_pb2", "protos.gandiva.v1.runtime_pb2_grpc", "scheduler.transport")


def _in_ours(places: list[str | None]) -> bool:
    """Whether one of these files or directories is in Gandiva's own `protos` or `scheduler`
    (not merely under its root: a program may live in a checkout's tests)."""
    dirs = [os.path.join(os.path.realpath(ROOT), top) for top in _TOPS]
    return any(p and any(os.path.realpath(p) == d or os.path.realpath(p).startswith(d + os.sep)
                         for d in dirs) for p in places)


def _ours(module: ModuleType | None) -> bool:
    return _in_ours([getattr(module, "__file__", None), *(getattr(module, "__path__", None) or [])])


def _found_elsewhere(top: str) -> bool:
    """Whether `import top` would give something other than Gandiva's package."""
    if top in sys.modules:
        return not _ours(sys.modules[top])
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return True
    if spec is None:
        return True
    return not _in_ours([spec.origin, *(spec.submodule_search_locations or [])])


def load() -> tuple[ModuleType, ...]:
    """The modules of `_NEEDED`, Gandiva's own (see the module docstring)."""
    if not any(_found_elsewhere(top) for top in _TOPS):
        return tuple(importlib.import_module(name) for name in _NEEDED)
    before = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.split(".")[0] in _TOPS]}
    sys.path.insert(0, ROOT)
    try:
        return tuple(importlib.import_module(name) for name in _NEEDED)
    finally:
        sys.path.remove(ROOT)
        for k in [k for k in sys.modules if k.split(".")[0] in _TOPS]:
            del sys.modules[k]
        sys.modules.update(before)  # the program's modules by those names, as they were


__all__ = ["ROOT", "load"]
