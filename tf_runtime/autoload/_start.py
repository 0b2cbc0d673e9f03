"""Starting the runtime from an armed process (tf_runtime.autoload)."""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any

from .. import runtime, shim

log = logging.getLogger("tf_runtime")


def start_now() -> bool:
    """Start the runtime unless this process already has one; True when it started."""
    if runtime.current() is not None:
        return False  # under python -m tf_runtime.run
    try:
        rt = runtime.start()
    except Exception as exc:  # a bad restore checkpoint, a malformed variable
        print(f"gandiva: the tf_runtime shim did not start: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc  # as tf_runtime.run refuses: never train from step 0
    if rt is None:
        return False
    atexit.register(rt.finish)
    log.info("tf_runtime started through sitecustomize (a wrapped launch)")
    return True


def start_for(fullname: str, path: Any) -> Any:
    """Called as TensorFlow is being imported: start, then let the shim's post-import
    hook import it (so the sessions are patched right after)."""
    if not start_now():
        return None
    return shim.hook_spec(fullname, path)
