"""The local pipes shared with the Migration Helper (pre-warmed migration).

GANDIVA_STATUS_FD: the shim writes one JSON object per line (session_ready,
warm_ready, restored, first_step_done, checkpoint; launch_end, written by
tf_runtime.launch; last_step {steps} at the program's end, sent with its exit). GANDIVA_CONTROL_FD: a warm
process reads one JSON line, {"cmd": "activate", "restore_checkpoint": DIR} or
{"cmd": "exit"}.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, TextIO

log = logging.getLogger(__name__)


class StatusPipe:
    """Writes status events; a closed or broken pipe is logged once, never fatal."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    @classmethod
    def from_fd(cls, fd: int) -> StatusPipe:
        """The pipe on GANDIVA_STATUS_FD, already parsed by the caller."""
        try:
            return cls(os.fdopen(fd, "w", buffering=1, closefd=False))
        except (ValueError, OSError) as exc:
            raise ValueError(f"GANDIVA_STATUS_FD={fd!r} is not an open file descriptor: {exc}") from exc

    def event(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, separators=(",", ":"))
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._broken = True
                log.warning("status pipe closed, events no longer sent: %s", exc)


@dataclass(frozen=True)
class Activation:
    """What a warm process was told to do."""

    exit: bool
    restore_checkpoint: str | None = None


def read_activation(fd: int) -> Activation:
    """Block until the helper writes one JSON command line on `fd`."""
    with os.fdopen(fd, "r", closefd=False) as stream:
        line = stream.readline()
    if not line:
        raise RuntimeError(f"control pipe (fd {fd}) closed before an activate/exit command")
    try:
        msg = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"control pipe: not a JSON line: {line!r}") from exc
    cmd = msg.get("cmd") if isinstance(msg, dict) else None
    if cmd == "exit":
        return Activation(exit=True)
    if cmd == "activate":
        ckpt = msg.get("restore_checkpoint") or None
        if ckpt is not None and not isinstance(ckpt, str):
            raise RuntimeError(f"control pipe: restore_checkpoint must be a string, got {ckpt!r}")
        return Activation(exit=False, restore_checkpoint=ckpt)
    raise RuntimeError(f"control pipe: unknown cmd {cmd!r} in {line!r} (expected activate or exit)")
