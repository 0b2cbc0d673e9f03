"""tf_runtime: the Gandiva shim inside every TensorFlow-1-style training job.

Start a program under it with `python -m tf_runtime.run train.py ARGS...`; see
docs/tf_runtime.md. Importing this package does not import TensorFlow.
"""

from .controller import EXIT_KILLED, EXIT_MIGRATED
from .runtime import report

__all__ = ["EXIT_KILLED", "EXIT_MIGRATED", "report"]
