"""Starting the shim in a job's Python processes that `python -m tf_runtime.run` did not start.

`DIRECTORY` holds a `sitecustomize.py` that the Migration Helper puts first on every
job's PYTHONPATH (`path_with_autoload`); it calls `arm()`. Arming installs an import
hook: when the process imports TensorFlow, the runtime starts from the job's
environment (tf_runtime.runtime.start: the stream to the scheduler, the status pipe,
warm mode), exactly as under `python -m tf_runtime.run`, and sends its last progress
at exit. A process already under tf_runtime.run, or that never imports TensorFlow,
is left alone.
"""

from __future__ import annotations

import os
import sys

# Imported by every Python process of a job at start-up: no importlib.abc (it pulls in
# tempfile, shutil, random...) and no typing; the finder below is duck-typed.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
# The PYTHON* variables of a `python -E` / `-I` launch, set aside by the helper
# (migration_helper.launch_rule.isolated_launch) and put back by sitecustomize.py.
PYTHON_ENV = "GANDIVA_PYTHON_ENV"


def path_with_autoload(pythonpath: str | None) -> str:
    """PYTHONPATH with this directory first, the job's own entries kept after it (less
    this directory, also when reached through a symlink)."""
    mine = os.path.realpath(DIRECTORY)
    rest = [p for p in (pythonpath or "").split(os.pathsep) if p and os.path.realpath(p) != mine]
    return os.pathsep.join([DIRECTORY, *rest])


class _StartOnTensorFlow:
    """Fires once, at the process's `import tensorflow`. It stays in sys.meta_path
    (inert) rather than removing itself while the import system iterates that list."""

    fired = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "tensorflow" or self.fired:
            return None
        self.fired = True
        from . import _start

        return _start.start_for(fullname, path)


_FINDER = _StartOnTensorFlow()


def arm() -> None:
    """Start the runtime when this process imports TensorFlow (see the module docstring)."""
    from .. import launch_devices

    launch_devices.record()  # the helper's GPUs, before the program's code may set others
    if "tensorflow" in sys.modules:
        from . import _start

        _start.start_now()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


__all__ = ["DIRECTORY", "PYTHON_ENV", "arm", "path_with_autoload"]
