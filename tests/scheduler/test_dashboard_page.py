"""The dashboard page itself (scheduler/observe/static/index.html) in a real headless
Chromium, against a server that stops answering its JSON (a scheduler restarting)."""

from __future__ import annotations

import http.server
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

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


LONG_NAME = "W" * 250
STATE: dict[str, Any] = {"now": 0, "height": 1, "overloaded": False, "servers": [], "decisions": [], "jobs": [{
    "id": "j-0123456789", "name": LONG_NAME, "state": "RUNNING", "gpus": 1, "placement": ["n1/0"],
    "progress": "", "steps": 5, "rate": 1.0, "eta": "", "metrics": {}, "gpu_seconds": 1, "user": "u" * 120,
    "last_decision": None, "message": "placed"}]}
# Loads the page in a same-origin frame of the window's width and writes what it measured
# into its own DOM, which --dump-dom prints.
PROBE = b"""<!doctype html><body style="margin:0"><iframe id="f" src="/" style="width:1200px;height:700px;border:0">
</iframe><div id="out">pending</div><script>
function look() {
  const doc = document.getElementById("f").contentDocument;
  const row = doc && doc.querySelector("#jobs tbody tr");
  if (!row) { setTimeout(look, 100); return; }
  const state = row.children[2].getBoundingClientRect(), table = doc.getElementById("jobs").getBoundingClientRect();
  document.getElementById("out").textContent = `state-right=${Math.round(state.right)} table-right=${Math.round(table.right)}`;
}
look();
</script></body>"""


class _Serving(_PageOnly):
    """Serves the page, STATE as /api/state and PROBE as /probe.html."""

    state: ClassVar[dict] = STATE
    probe: ClassVar[bytes] = PROBE

    def do_GET(self) -> None:
        import json

        bodies = {"/api/state": json.dumps(self.state).encode(), "/probe.html": self.probe,
                  "/api/timeline": json.dumps({"now": 0, "since": 0, "gpus": {}, "jobs": {}}).encode(),
                  "/api/usage": json.dumps({"since": 0, "until": 0, "total": {}, "users": []}).encode()}
        if self.path not in bodies:
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.path.endswith(".html") else "application/json")
        self.send_header("Content-Length", str(len(bodies[self.path])))
        self.end_headers()
        self.wfile.write(bodies[self.path])


def _probe_dom(handler: type[_Serving]) -> str:
    """The DOM of /probe.html served by ``handler``, after a real Chromium ran its scripts."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return chromium_dom(f"http://127.0.0.1:{server.server_address[1]}/probe.html", budget_ms=4000)
    finally:
        server.shutdown()
        server.server_close()


def test_a_long_job_name_does_not_push_the_other_columns_off_the_page(chromium: str) -> None:
    # A 250-character name without a space made the jobs table as wide as the name: state,
    # GPUs, where, progress ... were off the right edge of the window.
    dom = _probe_dom(_Serving)
    found = re.search(r'<div id="out">state-right=(\d+) table-right=(\d+)</div>', dom)
    assert found is not None, dom[-2000:]
    state_right, table_right = int(found.group(1)), int(found.group(2))
    assert state_right < 1200 and table_right <= 1200, found.group(0)


def _job(i: int, state: str, user: str) -> dict:
    return {**STATE["jobs"][0], "id": f"j-{i:010d}", "name": f"train-{i}", "state": state, "user": user,
            "placement": ["n1/0"] if state == "RUNNING" else []}


class _ThousandsOfJobs(_Serving):
    # 2,990 of alice's queued, then 10 of bob's running (submitted last, listed last); and
    # 17,000 more queued that the scheduler counts without sending (QUEUED_LISTED).
    state: ClassVar[dict] = {**STATE, "jobs": [_job(i, "QUEUED", "alice") for i in range(2990)]
             + [_job(2990 + i, "RUNNING", "bob") for i in range(10)], "queued_not_listed": 17000}
    # Reads the table as it is shown, types "bob" into the filter, clears it, presses next.
    probe = b"""<!doctype html><body><iframe id="f" src="/" style="width:1200px;height:700px"></iframe>
<div id="out">pending</div><script>
const seen = [];
function table(doc) {
  const rows = doc.querySelectorAll("#jobs tbody tr");
  return `rows=${rows.length} first=${rows[0] ? rows[0].children[2].textContent : "-"} ` +
         `shown=${doc.getElementById("shown").textContent}`;
}
function type(doc, text) {
  doc.getElementById("filter").value = text;
  doc.getElementById("filter").dispatchEvent(new Event("input"));
}
function look() {
  const doc = document.getElementById("f").contentDocument;
  if (!doc || !doc.querySelector("#jobs tbody tr")) { setTimeout(look, 100); return; }
  seen.push(table(doc));
  type(doc, "BOB running"); seen.push(table(doc));
  type(doc, ""); doc.getElementById("next").click(); seen.push(table(doc));
  document.getElementById("out").textContent = seen.join(" | ");
}
look();
</script></body>"""


def test_thousands_of_jobs_are_shown_a_page_at_a_time_running_first_and_can_be_filtered(chromium: str) -> None:
    """With 3,000 queued jobs the dashboard built all 3,000 rows on every 2-s poll (busy
    0.4-0.75 s of each in a real Chromium), with no paging or filter, and the few running
    jobs at the very end of the table."""
    dom = _probe_dom(_ThousandsOfJobs)
    found = re.search(r'<div id="out">([^<]*)</div>', dom)
    assert found is not None and found.group(1) != "pending", dom[-2000:]
    first, filtered, second = found.group(1).split(" | ")
    rest = " (and 17000 more queued, not listed here: gandiva get jobs --state queued)"
    assert first == "rows=100 first=RUNNING shown=jobs 1-100 of 3000" + rest
    assert filtered == "rows=10 first=RUNNING shown=jobs 1-10 of 10 matching of 3000" + rest
    assert second == "rows=100 first=QUEUED shown=jobs 101-200 of 3000" + rest
