"""`gandiva db upgrade|current|downgrade` through the real entry point: its function in
this process, and once (an unsupported URL) as `python -m gandiva_cli.main`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from subprocess import CompletedProcess

from scheduler.state import migrate


def gandiva_process(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gandiva_cli.main", *argv], capture_output=True, text=True, check=False, timeout=120
    )


def test_db_upgrade_current_downgrade(sqlite_url: str, gandiva: Callable[..., CompletedProcess[str]]) -> None:
    head = migrate.heads()[0]
    up = gandiva("db", "--db", sqlite_url, "upgrade")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == head
    assert gandiva("db", "--db", sqlite_url, "current").stdout.strip() == head
    down = gandiva("db", "--db", sqlite_url, "downgrade", "base")
    assert down.returncode == 0, down.stderr
    assert "base" in down.stdout


def test_db_rejects_an_unsupported_url() -> None:
    bad = gandiva_process("db", "--db", "mysql://x/y", "current")
    assert bad.returncode == 2
    assert "unsupported database URL" in bad.stderr


def test_db_an_unknown_revision_is_invalid_input(sqlite_url: str, gandiva: Callable[..., CompletedProcess[str]]) -> None:
    """`gandiva db downgrade bad-rev` exited 1, as for a failure, not 2 as other invalid input."""
    assert gandiva("db", "--db", sqlite_url, "upgrade").returncode == 0
    for action in ("downgrade", "upgrade"):
        bad = gandiva("db", "--db", sqlite_url, action, "bad-rev")
        assert bad.returncode == 2, bad.stderr
        assert "Can't locate revision identified by 'bad-rev'; revisions: base, 0001" in bad.stderr
        assert f"{migrate.heads()[0]} (head)" in bad.stderr
