"""The dashboard page itself (scheduler/observe/static/index.html) in a real headless
Chromium, against a server that stops answering its JSON (a scheduler restarting)."""

from __future__ import annotations

import http.server
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..integration.test_observe import chromium, chromium_dom

assert chromium  # a fixture: skips (or fails under GANDIVA_REQUIRE_BROWSER=1) without one

PAGE = Path(__file__).resolve().parents[2] / "scheduler" / "observe" / "static" / "index.html"


class _PageOnly(http.server.BaseHTTPRequestHandler):
    """Serves the page; every JSON request's connection is dropped unanswered, as a
    scheduler that went away between two polls does."""

    def do_GET(self) -> None:
        if self.path in ("/", "/index.html"):
            body = PAGE.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def page_only() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PageOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_scheduler_that_went_away_is_said_once(page_only: str, chromium: str) -> None:
    # Both polls (state, timeline) fail the same way: the line read "cannot reach the
    # scheduler (Failed to fetch); retrying; cannot reach the scheduler (Failed to fetch); retrying".
    dom = chromium_dom(f"http://{page_only}/", budget_ms=4000)
    error = re.search(r'<div id="error" class="bad">([^<]*)</div>', dom)
    assert error is not None, dom[:2000]
    assert error.group(1).count("cannot reach the scheduler") == 1, error.group(1)
    assert "retrying" in error.group(1)
