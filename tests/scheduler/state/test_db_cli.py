"""`gandiva db upgrade|current|downgrade` through the real entry point."""

from __future__ import annotations

import subprocess
import sys

from scheduler.state import migrate


def gandiva(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", *argv], capture_output=True, text=True, check=False, timeout=120
    )


def test_db_upgrade_current_downgrade(sqlite_url: str) -> None:
    head = migrate.heads()[0]
    up = gandiva("db", "--db", sqlite_url, "upgrade")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == head
    assert gandiva("db", "--db", sqlite_url, "current").stdout.strip() == head
    down = gandiva("db", "--db", sqlite_url, "downgrade", "base")
    assert down.returncode == 0, down.stderr
    assert "base" in down.stdout


def test_db_rejects_an_unsupported_url() -> None:
    bad = gandiva("db", "--db", "mysql://x/y", "current")
    assert bad.returncode == 2
    assert "unsupported database URL" in bad.stdout
