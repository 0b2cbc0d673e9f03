"""The committed generated code must be exactly what the .proto sources produce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_protos_changes_nothing() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        "the generated code is stale; run `python scripts/gen_protos.py` and commit: "
        + result.stdout
        + result.stderr
    )
