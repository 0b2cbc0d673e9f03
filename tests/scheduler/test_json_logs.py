"""--log-format json: one JSON object per line, job and command ids on the lines about them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.observe.logs import JsonFormatter, setup_logging


def line(msg: str, *args: object, exc: bool = False, **extra: str) -> dict:
    record = logging.LogRecord("gandiva.test", logging.WARNING, __file__, 1, msg, args, None)
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            record.exc_info = sys.exc_info()
    record.__dict__.update(extra)
    return json.loads(JsonFormatter().format(record))


def test_job_and_command_ids_come_from_the_message_or_from_extra() -> None:
    got = line("job %s/%s: command %s failed", "j-0123456789", "abcdef012345", "0011223344556677")
    assert (got["job_id"], got["incarnation"], got["command_id"]) == ("j-0123456789", "abcdef012345", "0011223344556677")
    assert got["level"] == "WARNING" and got["logger"] == "gandiva.test" and got["time"].endswith("Z")
    assert line("resumed", job_id="j-aaaaaaaaaa")["job_id"] == "j-aaaaaaaaaa"
    plain = line("scheduler listening on 127.0.0.1:50051")
    assert "job_id" not in plain and "command_id" not in plain
    assert "RuntimeError: boom" in line("failed", exc=True)["exc"]


@settings(max_examples=40, deadline=None)
@given(st.text())
def test_any_message_is_one_valid_json_line(msg: str) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, msg, None, None)
    text = JsonFormatter().format(record)
    assert "\n" not in text and json.loads(text)["msg"] == msg


def test_bad_format_or_level_is_named() -> None:
    with pytest.raises(ValueError, match="--log-format 'xml'"):
        setup_logging("INFO", "xml")
    with pytest.raises(ValueError, match="--log-level 'LOUD'"):
        setup_logging("LOUD", "json")


def test_scheduler_writes_json_lines(tmp_path: Path) -> None:
    port_file = tmp_path / "addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gandiva_cli.main", "scheduler", "--listen", "127.0.0.1:0",
         "--db", f"sqlite+aiosqlite:///{tmp_path}/g.db", "--port-file", str(port_file), "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert port_file.exists(), "the scheduler did not start"
        submitted = subprocess.run(
            [sys.executable, "-m", "scheduler.cli.submit", "--scheduler", port_file.read_text().strip(),
             "--no-wait", "--parsable", "--", "python", "train.py"],
            capture_output=True, text=True, timeout=60, check=True)
        job_id = submitted.stdout.strip()
        time.sleep(0.5)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)
    assert any("scheduler listening on" in x["msg"] for x in lines)
    assert all(x.get("job_id") == job_id for x in lines if job_id in x["msg"])
