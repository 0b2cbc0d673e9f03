"""Logging set-up shared by `gandiva scheduler` and `gandiva helper`: text or JSON lines.

``--log-format json`` writes one JSON object per line: ``ts`` (unix seconds), ``time``
(ISO 8601, UTC), ``level``, ``logger``, ``msg``, ``exc`` (a traceback, when there is one)
and, on every line about a job, ``job_id`` (and ``incarnation`` when known) and, on every
line about a command, ``command_id``. They come from ``extra={"job_id": ...}`` where a
call gives them, else from the ids the message names (job ids look like ``j-0123456789``,
commands are logged as ``command <hex id>``), so a log shipper can index every line by job.
"""

from __future__ import annotations

import json
import logging
import re
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_JOB = re.compile(r"\b(j-[0-9a-f]{10})(?:/([0-9a-f]{12}))?\b")
_COMMAND = re.compile(r"\bcommands? ([0-9a-f]{16,32})\b")
_FIELDS = ("job_id", "incarnation", "command_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        out: dict[str, object] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": msg,
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value:
                out[name] = value
        job = _JOB.search(msg)
        if job and "job_id" not in out:
            out["job_id"] = job.group(1)
            if job.group(2) and "incarnation" not in out:
                out["incarnation"] = job.group(2)
        command = _COMMAND.search(msg)
        if command and "command_id" not in out:
            out["command_id"] = command.group(1)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger for an entry point; ValueError names a bad level or format."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format {fmt!r}: use one of {', '.join(FORMATS)}")
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"--log-level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
