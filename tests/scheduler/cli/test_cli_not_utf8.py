"""A byte that is not UTF-8 in what a command sends to the scheduler (an argument, the
working directory, an environment value): Python hands it over as a lone surrogate
(surrogateescape), which protobuf cannot encode. One line naming it, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BAD = b"ab\xffcd".decode("utf-8", "surrogateescape")  # as Python reads $'ab\xffcd' from argv


@pytest.mark.parametrize("args", [("get", "job", BAD), ("kill", BAD), ("get", "jobs", "--user", BAD),
                                  ("cordon", BAD)])
def test_gandiva_names_an_argument_that_is_not_utf8(gandiva, args: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    """Each ended in a UnicodeEncodeError traceback."""
    r = gandiva(*args, "--scheduler", "127.0.0.1:1")
    assert (r.code, r.out) == (2, ""), r
    assert r.err == ("gandiva: error: not UTF-8 text: ab\\xffcd (the byte 0xff at character 3); names, ids, "
                     "commands, working directories and environment values go to the scheduler as UTF-8 only\n")


def test_submit_names_a_command_env_or_working_directory_that_is_not_utf8(  # type: ignore[no-untyped-def]
        submit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for args in (("--name", BAD, "--", "python", "t.py"), ("--", "python", BAD), ("--env", f"X={BAD}", "--", "t")):
        r = submit("--scheduler", "127.0.0.1:1", "--no-wait", "--gpus", "1", *args)
        assert (r.code, r.out) == (2, ""), (args, r)
        assert r.err.startswith("gandiva-submit: error: not UTF-8 text: ab\\xffcd (the byte 0xff at character 3)"), r.err
    odd = tmp_path / os.fsdecode(b"run-\xfe")
    odd.mkdir()
    monkeypatch.chdir(odd)  # the job's working directory by default
    r = submit("--scheduler", "127.0.0.1:1", "--no-wait", "--gpus", "1", "--", "python", "t.py")
    assert (r.code, r.out) == (2, "") and "run-\\xfe (the byte 0xfe at character" in r.err, r
