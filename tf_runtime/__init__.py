"""tf_runtime: the Gandiva shim inside every TensorFlow-1-style training job.

Start a program under it with `python -m tf_runtime.run train.py ARGS...`; see
docs/tf_runtime.md. Importing this package does not import TensorFlow, nor the
runtime until one of the names below is used: every Python process of a job
imports it at start-up (the sitecustomize of tf_runtime.autoload).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: that import alone costs every process ~3 ms
if TYPE_CHECKING:
    from typing import Any

    from .controller import EXIT_KILLED, EXIT_MIGRATED, EXIT_TOWERS_CHANGED
    from .runtime import report

__all__ = ["EXIT_KILLED", "EXIT_MIGRATED", "EXIT_TOWERS_CHANGED", "report"]


def __getattr__(name: str) -> Any:
    if name in ("EXIT_KILLED", "EXIT_MIGRATED", "EXIT_TOWERS_CHANGED"):
        from . import controller

        return getattr(controller, name)
    if name == "report":
        from .runtime import report

        return report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
