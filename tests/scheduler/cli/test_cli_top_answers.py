"""`gandiva top --http` pointed at something that is not the scheduler's --http-listen:
whatever it answers, one line on stderr and exit 1, in bounded time and memory."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from scheduler.cli import top


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers /api/state with the body the server's ``kind`` names."""

    def do_GET(self) -> None:
        kind = self.server.kind  # type: ignore[attr-defined]
        if kind == "misdirected":  # scheduler.observe.http's answer to a name it does not take
            body = b"this request came in on a loopback address, which only this machine reaches, and names host 'x'\n"
            self.send_response(421)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            if kind == "deep":
                self.wfile.write(b"[" * 200_000 + b"]" * 200_000)
            elif kind == "list":
                self.wfile.write(b"[1, 2, 3]")
            elif kind == "shape":
                self.wfile.write(b'{"servers": 5, "jobs": "x"}')
            elif kind == "far":
                self.wfile.write(b'{"now": 1e300, "decisions": [], "jobs": []}')
            elif kind == "endless":
                self.wfile.write(b'{"a": "')
                while not self.server.done.is_set():  # type: ignore[attr-defined]
                    self.wfile.write(b"x" * (1 << 16))
            elif kind == "trickle":
                while not self.server.done.is_set():  # type: ignore[attr-defined]
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
        except OSError:
            pass  # the client hung up: what it should do

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.daemon_threads = True
    server.done = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.done.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("kind", "said"), [
    ("deep", "did not answer the scheduler's JSON (RecursionError)"),
    ("list", "answered JSON that is not the scheduler's state"),
    ("shape", "answered JSON that is not the scheduler's state (TypeError"),
    ("endless", "answered more than 2 MiB"),
    ("trickle", "bytes in 1 s and had not finished"),
])
def test_top_pointed_at_another_server_says_so_in_one_line(  # type: ignore[no-untyped-def]
        gandiva, answering, monkeypatch: pytest.MonkeyPatch, kind: str, said: str) -> None:
    """JSON nested 200,000 deep or of another shape ended `top` with a traceback; an endless
    answer took it to 1.4 GB in 40 s, one that trickled a byte a second kept it for ever."""
    monkeypatch.setattr(top, "MAX_ANSWER_BYTES", 2 << 20, raising=False)
    monkeypatch.setattr(top, "ANSWER_DEADLINE_S", 1.0, raising=False)
    answering.kind = kind
    address = f"127.0.0.1:{answering.server_address[1]}"
    r = gandiva("top", "--once", "--http", address)
    assert (r.code, r.out) == (1, ""), r
    assert r.err.startswith(f"gandiva top: http://{address}/api/state ") and said in r.err, r.err
    assert r.err.endswith("is it the scheduler's --http-listen address?\n") and r.err.count("\n") == 1, r.err


def test_top_told_its_address_names_another_host_says_what_the_server_said(  # type: ignore[no-untyped-def]
        gandiva, answering) -> None:
    """A loopback dashboard asked by a name that is not localhost answers 421 saying why (DNS
    rebinding); `top` said "cannot read ... (Misdirected Request); is the scheduler running with
    --http-listen on that address?", though it was."""
    answering.kind = "misdirected"
    address = f"127.0.0.1:{answering.server_address[1]}"
    r = gandiva("top", "--once", "--http", address)
    assert (r.code, r.out) == (1, ""), r
    assert r.err == (f"gandiva top: http://{address}/api/state: this request came in on a loopback address, which "
                     "only this machine reaches, and names host 'x'\n"), r.err


def _decisions_refused(gandiva, answering, kind: str):  # type: ignore[no-untyped-def]
    """`top --decisions 10m` against a server answering ``kind``: its address and the
    result, which ended with status 1 and printed nothing."""
    answering.kind = kind
    address = f"127.0.0.1:{answering.server_address[1]}"
    r = gandiva("top", "--decisions", "10m", "--http", address)
    assert (r.code, r.out) == (1, ""), r
    return address, r


def test_top_decisions_pointed_at_another_server_says_so_in_one_line(  # type: ignore[no-untyped-def]
        gandiva, answering) -> None:
    """`top --decisions` reads the jobs' names from /api/state: JSON of another shape there
    ended it with a traceback (TypeError: string indices must be integers)."""
    address, r = _decisions_refused(gandiva, answering, "shape")
    assert r.err == (f"gandiva top: http://{address}/api/state answered JSON that is not the scheduler's state "
                     "(TypeError); is it the scheduler's --http-listen address?\n"), r.err


def test_top_decisions_names_the_address_it_asked(gandiva, answering) -> None:  # type: ignore[no-untyped-def]
    """What `top --decisions` asks is /api/decisions; an answer there not the scheduler's
    was said to be /api/state's."""
    address, r = _decisions_refused(gandiva, answering, "list")
    assert r.err.startswith(f"gandiva top: http://{address}/api/decisions answered JSON that is not "), r.err


def test_top_decisions_of_a_period_longer_than_any_asks_for_the_whole_log(  # type: ignore[no-untyped-def]
        gandiva, monkeypatch: pytest.MonkeyPatch) -> None:
    """`top --decisions 1e300` asked ?since= in 301 digits, past what the dashboard takes
    (2**53): refused there, and `top` said "cannot read ... (Bad Request)"."""
    from urllib.parse import parse_qsl, urlsplit

    from scheduler.observe.dashboard import _int

    asked: list[str] = []

    def answer(address: str, token: str = "", path: str = "/api/state") -> dict[str, object]:
        asked.append(path)
        return {"now": time.time(), "decisions": [], "kept": 0} if path.startswith("/api/decisions") else {"jobs": []}

    monkeypatch.setattr(top, "fetch", answer)
    r = gandiva("top", "--decisions", "1e300", "--http", "127.0.0.1:1")
    assert r.code == 0 and r.out.splitlines()[-1] == "tried changes: none", r
    assert _int(dict(parse_qsl(urlsplit(asked[0]).query)), "since", 0) == 2**53, asked


def test_top_decisions_at_a_time_no_clock_reads_says_so_in_one_line(  # type: ignore[no-untyped-def]
        gandiva, answering) -> None:
    """`"now": 1e300` in the answer: a traceback (OverflowError: timestamp out of range)."""
    address, r = _decisions_refused(gandiva, answering, "far")
    assert r.err == (f"gandiva top: http://{address}/api/decisions answered JSON that is not the scheduler's "
                     "decision log (OverflowError); is it the scheduler's --http-listen address?\n"), r.err


def test_top_decisions_unanswered_names_what_it_asked(gandiva) -> None:  # type: ignore[no-untyped-def]
    """It said "cannot read http://ADDR/api/state (...)" (and, for an answer of another shape,
    named no address at all, as the test above shows)."""
    r = gandiva("top", "--decisions", "10m", "--http", "127.0.0.1:1")
    assert r.code == 1 and r.err.startswith("gandiva top: cannot read http://127.0.0.1:1/api/decisions ("), r.err



def test_top_help_says_what_http_and_interval_take(  # type: ignore[no-untyped-def]
        gandiva, answering, capsys: pytest.CaptureFixture[str]) -> None:
    """`--http` takes the dashboard's URL as a browser shows it (b3e541ff) and `--interval`
    has a ceiling (7a95cc48); `gandiva top --help` said only "the scheduler's --http-listen
    address" and "at least 0.5". What it says now is what top does."""
    capsys.readouterr()
    with pytest.raises(SystemExit):
        gandiva("top", "--help")
    shown = " ".join(capsys.readouterr().out.split())
    assert "or the dashboard's URL as a browser shows it (http://HOST:PORT/)" in shown, shown
    assert "at least 0.5" in shown and f"at most {top.MAX_INTERVAL:,.0f}, a day" in shown, shown
    # The URL form reaches the dashboard (what answers there is the server's own word) ...
    answering.kind = "misdirected"
    r = gandiva("top", "--once", "--http", f"http://127.0.0.1:{answering.server_address[1]}/")
    assert "names host 'x'" in r.err, r
    # ... and the ceiling is the one refused past.
    with pytest.raises(SystemExit) as refused:
        gandiva("top", "--interval", f"{top.MAX_INTERVAL + 1:g}", "--http", "127.0.0.1:1")
    assert refused.value.code == 2 and f"at most {top.MAX_INTERVAL:,.0f} seconds" in capsys.readouterr().err
