"""`gandiva ARGS...` run through its entry function in the test's own process, output
captured (pytest's capsys): the CLI's own code without a Python start per command
(about 5 s each on the loaded CI machine), for tests about what a command prints and
exits with, not about its process."""

from __future__ import annotations

import subprocess

import pytest

from gandiva_cli import main as gandiva_main


def run_gandiva(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """As subprocess.run(..., capture_output=True, text=True) would return it; an
    argparse refusal (SystemExit) gives its exit code."""
    capsys.readouterr()
    try:
        code = gandiva_main.main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(argv), code, out.out, out.err)
