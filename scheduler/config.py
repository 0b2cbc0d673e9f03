"""Where things live by default: GANDIVA_HOME, the database URL and the scheduler address."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LISTEN = "127.0.0.1:50051"


def gandiva_home() -> Path:
    """The folder for the embedded database, logs and ramdisk fallbacks (default ~/.gandiva;
    set empty, too: it was the current directory, as GANDIVA_DB and GANDIVA_SCHEDULER are not)."""
    return Path(os.environ.get("GANDIVA_HOME") or Path.home() / ".gandiva").expanduser()


def default_db_url() -> str:
    """The embedded default: an SQLite file under GANDIVA_HOME."""
    return f"sqlite+aiosqlite:///{gandiva_home() / 'gandiva.db'}"


def scheduler_address(flag: str | None = None) -> str:
    """The scheduler every client talks to: --scheduler, else GANDIVA_SCHEDULER, else the default."""
    return flag or os.environ.get("GANDIVA_SCHEDULER") or DEFAULT_LISTEN
