"""A minimal HTTP/1.1 server on asyncio for ``/metrics``, the dashboard and its JSON.

GET and HEAD only, one request per connection, no framework: the scheduler and the
helpers already run an asyncio loop, and this is all Prometheus and a browser need.
Routes map a path to an async handler returning a ``Response``; query parameters
arrive as a dict of single values.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import logging
import re
import socket
import struct
import termios
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from scheduler.transport import SecurityError, is_loopback_host

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 << 10
READ_TIMEOUT_S = 10.0
# A client that stops reading its answer for this long is cut off. Without it, a client that
# asked for a large answer (a long /api/timeline, /metrics of many jobs) and never read it held
# its connection for ever: 64 of them, and the dashboard and /metrics answered 503 to everyone.
# A slow client that keeps reading is served however long it takes.
WRITE_STALL_S = 10.0
# Connections served at once. Without a bound, idle connections (each held up to
# READ_TIMEOUT_S) used up the process's file descriptors: the scheduler's gRPC listener then
# accepted no helper or client ("File descriptor limit reached") and its database could open
# no file. Past it a new connection takes the place of the one that has waited longest for
# its request's head (a client sends its head at once; one that trickles it in is holding a
# place): 64 connections sending a byte a second, opened again every 10 s, had the dashboard
# and /metrics answer 503 to everyone. With none such, the new one is answered 503.
MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"

    @staticmethod
    def json(value: Any, status: int = 200) -> Response:
        return Response(status, json.dumps(value, separators=(",", ":")).encode(), "application/json")


Handler = Callable[[Mapping[str, str]], Awaitable[Response]]
# Called with the path and the request's bearer token ("" without one) before a route's
# handler; a Response refuses the request (401, 403), None lets it through.
Guard = Callable[[str, str], Awaitable["Response | None"]]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 421: "Misdirected Request",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def split_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); a clear ValueError for anything else."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise ValueError(f"--http-listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9100 (port 0 picks one)")
    if int(port) > 65535:  # the event loop would bind it modulo 65536 (99999 -> 34463)
        raise ValueError(f"--http-listen {listen!r}: port {int(port)} is out of range (0-65535)")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpServer:
    """Serve ``routes`` on ``listen`` (HOST:PORT; port 0 picks a free one). With a
    ``guard``, every route but those in ``public`` passes it first."""

    def __init__(self, listen: str, routes: Mapping[str, Handler], guard: Guard | None = None,
                 public: frozenset[str] = frozenset(), allow_hosts: Iterable[str] = (),
                 any_host: bool = False) -> None:
        self.host, self.port = split_listen(listen)
        # Only this machine reaches a loopback address, so only this machine's names may be
        # asked for there (``host_allowed``), whatever address the server listens on; and the
        # names the operator allows (--http-allow-host: a proxy on this machine that passes the
        # name its users asked for, nginx's `proxy_set_header Host $host`). Without a ``guard``
        # (no tokens) every request is held so, unless ``any_host``: a page of any site that a
        # browser on another machine of the network opens could have its name resolve to this
        # server's address and read what it serves (check_dashboard_exposure).
        self.loopback = is_loopback_host(self.host)
        self.own_names = local_names() | allowed_host_names(allow_hosts)
        self.every_host_held = guard is None and not any_host
        self.routes = dict(routes)
        self.guard = guard
        self.public = public
        self._server: asyncio.base_events.Server | None = None
        self.address = ""
        self._open = 0
        # Connections still reading their request's head, oldest first (dicts keep order).
        self._reading: dict[asyncio.StreamWriter, None] = {}

    async def start(self) -> str:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_REQUEST_BYTES)
        except OSError as err:
            raise OSError(f"--http-listen {self.host}:{self.port}: {err.strerror or err}") from err
        port = self._server.sockets[0].getsockname()[1]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        self.address = f"{host}:{port}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS and self._reading:
            slowest = next(iter(self._reading))
            del self._reading[slowest]
            log.info("HTTP connections full: cut the one that has sent no whole request the longest")
            slowest.transport.abort()  # its _read_head ends at once; its place is this one's
        elif self._open >= MAX_CONNECTIONS:
            with contextlib.suppress(ConnectionError):
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                             b"Connection: close\r\n\r\n")
            writer.close()  # not awaited: nothing waits on a client that reads nothing
            return
        self._open += 1
        try:
            await self._serve_one(reader, writer)
        finally:
            self._open -= 1

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = ""
        try:
            head = await self._head(reader, writer)
        except (asyncio.LimitOverrunError, ValueError):
            response = Response(431, f"request head over {MAX_REQUEST_BYTES} bytes\n".encode())
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        else:
            try:
                # UTF-8 as browsers send it; undecodable bytes are replaced, not an error.
                method, target, _ = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace").split(" ", 2)
            except ValueError:
                response = Response(400, b"malformed request line; expected METHOD PATH HTTP/1.1\n")
            else:
                try:
                    refused = self._misdirected(head, writer)
                    response = refused or await self._respond(method, target, _bearer(head))
                except Exception:  # a bug in one page must not take the server down
                    log.exception("HTTP handler failed")
                    response = Response(500, b"internal error; see the server log\n")
        reason = _REASONS.get(response.status, "")
        challenge = 'WWW-Authenticate: Bearer realm="gandiva"\r\n' if response.status == 401 else ""
        header = (f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n{challenge}"
                  f"Content-Length: {len(response.body)}\r\nCache-Control: no-store\r\n"
                  "Connection: close\r\n\r\n").encode()
        try:
            writer.write(header + (b"" if method == "HEAD" else response.body))
            await _drain(writer)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        self._reading[writer] = None
        try:
            return await asyncio.wait_for(_read_head(reader), READ_TIMEOUT_S)
        finally:
            self._reading.pop(writer, None)

    def _misdirected(self, head: bytes, writer: asyncio.StreamWriter) -> Response | None:
        """421 for a request that came in on a loopback address whose Host header names another
        host: a web page of any site a browser on this machine visits can have its own name
        resolve to 127.0.0.1 (DNS rebinding) and read the answers as its own. Without --auth
        token its JavaScript read every user's jobs (/api/state) and /metrics; on 0.0.0.0 too,
        through 127.0.0.1."""
        on_loopback = self.loopback
        if not on_loopback:
            local = writer.get_extra_info("sockname")
            on_loopback = isinstance(local, tuple) and is_loopback_host(str(local[0]))
            if not on_loopback and not self.every_host_held:
                return None
        for raw in _headers(head, b"host"):
            value = raw.decode("latin-1")
            if host_allowed(value, self.own_names):
                continue
            if not on_loopback:
                return Response(421, f"this server has no tokens (--auth token), so it answers only the names "
                                     f"it knows, and this request names host {value[:100]!r} (a web page that "
                                     "had its own name resolve here: DNS rebinding?): ask for this machine's "
                                     "name or its address, or start this server with --http-allow-host NAME "
                                     "for each name its users type\n".encode())
            return Response(421, f"this request came in on a loopback address, which only this machine "
                                 f"reaches, and names host {value[:100]!r} (a web page that had its own name "
                                 "resolve here: DNS rebinding?): ask for localhost, this machine's name or an "
                                 "address (a proxy in front of it: pass Host as it connects, e.g. nginx "
                                 "proxy_set_header Host $proxy_host, or start this server with "
                                 "--http-allow-host NAME for the name it passes)\n".encode())
        return None

    async def _respond(self, method: str, target: str, token: str = "") -> Response:
        if method not in ("GET", "HEAD"):
            return Response(405, f"{method} is not supported; use GET\n".encode())
        url = urlsplit(target)
        handler = self.routes.get(url.path)
        if handler is None:
            known = ", ".join(sorted(self.routes))
            return Response(404, f"no page at {url.path}; try one of: {known}\n".encode())
        if self.guard is not None and url.path not in self.public:
            refused = await self.guard(url.path, token)
            if refused is not None:
                return refused
        return await handler(dict(parse_qsl(url.query)))


async def _drain(writer: asyncio.StreamWriter) -> None:
    """Wait until the answer is handed to the kernel, while the client keeps reading: a client
    that read nothing for WRITE_STALL_S is cut off (its connection aborted, the answer dropped)."""
    left = _unsent(writer)
    while True:
        try:
            await asyncio.wait_for(writer.drain(), WRITE_STALL_S)
            return
        except TimeoutError:
            now_left = _unsent(writer)
            if now_left >= left:
                log.info("HTTP client read nothing for %.0fs; connection cut (%d bytes unsent)",
                         WRITE_STALL_S, now_left)
                writer.transport.abort()
                return
            left = now_left


def _unsent(writer: asyncio.StreamWriter) -> int:
    """Bytes of the answer the client has not taken yet: those still in the event loop's buffer,
    and (Linux) those in the socket's send queue not yet acknowledged. The loop's buffer alone
    moves in steps of up to a third of the kernel's send buffer (megabytes), so a client reading
    steadily but slowly could seem to read nothing for many seconds."""
    unsent = writer.transport.get_write_buffer_size()
    sock = writer.get_extra_info("socket")
    if sock is not None and hasattr(termios, "TIOCOUTQ"):
        with contextlib.suppress(OSError):
            unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    return unsent


def check_dashboard_exposure(listen: str, tokens: bool, allow_hosts: Iterable[str], insecure: bool) -> str:
    """Refuse a dashboard (every user's jobs) on an address other machines reach without
    tokens and without the names it is asked by: any web page a browser on that network
    opens could have its own name resolve to this address and read it (DNS rebinding), as
    only requests on loopback were held to known names. Returns the warning to log when it
    is allowed anyway (--insecure); raises SecurityError saying what to give otherwise."""
    host, _ = split_listen(listen)
    if tokens or is_loopback_host(host) or any(True for _ in allow_hosts):
        return ""
    if insecure:
        return (f"the dashboard listens on {listen} without --auth token or --http-allow-host (--insecure): "
                "a web page a browser of that network opens can read every user's jobs (DNS rebinding)")
    raise SecurityError(
        f"refusing --http-listen {listen} without --auth token: the dashboard shows every user's jobs, and any "
        "web page a browser on that network opens could read it by having its own name resolve to this "
        "address (DNS rebinding). Give --http-allow-host NAME for each name its users type (this machine's "
        "own names and its addresses are always answered), or --auth token, or listen on 127.0.0.1 "
        "(or pass --insecure)")


def local_names(hosts: str = "/etc/hosts") -> frozenset[str]:
    """This machine's own names: its host name, and those ``hosts`` gives a loopback address
    (Debian's `127.0.1.1 gpu1.example gpu1`). Read without DNS, which may wait for a resolver."""
    names = {socket.gethostname().lower()}
    with contextlib.suppress(OSError, UnicodeDecodeError), open(hosts, encoding="utf-8") as fh:
        for line in fh.read(1 << 20).splitlines():
            address, *aliases = line.partition("#")[0].split() or [""]
            if aliases and is_loopback_host(address):
                names.update(a.lower().rstrip(".") for a in aliases)
    return frozenset(names)


# A name --http-allow-host takes: a DNS host name (labels of letters, digits and '-'), no
# port, no address (addresses are always answered) and no wildcard.
_HOST_NAME = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def allowed_host_names(values: Iterable[str]) -> frozenset[str]:
    """The names of ``--http-allow-host`` (lower case, without a trailing dot); ValueError
    naming the first that is not a host name."""
    names = set()
    for value in values:
        name = value.strip().lower().rstrip(".")
        if not name.isascii():  # bücher.example: browsers send its ASCII form, xn--bcher-kva.example
            try:
                name = name.encode("idna").decode("ascii")
            except UnicodeError:
                pass  # (refused below, as written)
        if not _HOST_NAME.fullmatch(name):
            raise ValueError(f"--http-allow-host {value[:100]!r}: not a host name; give the name a proxy "
                             "passes in Host, without a port (e.g. gandiva.example.org)")
        names.add(name)
    return frozenset(names)


def host_allowed(value: str, own_names: frozenset[str] = frozenset()) -> bool:
    """Whether a request's Host header may reach a server through a loopback address: an
    address (a rebinding page has its own name in Host, never an address), localhost or a name
    under .localhost (browsers resolve those to loopback themselves, never by DNS), or one of
    this machine's own names (``own_names``, ``local_names``)."""
    name = value.strip().lower()
    if name.startswith("["):  # [::1]:9100
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost") or name in own_names:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _headers(head: bytes, wanted: bytes) -> list[bytes]:
    """The values of every header of the request named ``wanted`` (lower case)."""
    out = []
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == wanted:
            out.append(value.strip())
    return out


def _bearer(head: bytes) -> str:
    """The token of the request's ``Authorization: Bearer TOKEN`` header ("" without one)."""
    for value in _headers(head, b"authorization"):
        scheme, _, token = value.partition(b" ")
        if scheme.lower() == b"bearer":
            return token.strip().decode("ascii", "replace")
    return ""


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers, up to the blank line that ends them: CRLF as HTTP
    says, or bare LF as tolerant servers take it (`printf 'GET / HTTP/1.1\n\n'` used to
    wait out the read timeout and get no answer). ValueError past MAX_REQUEST_BYTES."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = await reader.readline()  # the stream's limit: LimitOverrunError / ValueError
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(b"".join(lines) + line, None)
        size += len(line)
        if size > MAX_REQUEST_BYTES:
            raise ValueError("request head too large")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)
        lines.append(line)


def prometheus_route(registry: Any, refresh: Callable[[], Awaitable[None]] | None = None) -> Handler:
    """A ``/metrics`` handler: refresh the gauges computed at scrape time, then render."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def handle(_: Mapping[str, str]) -> Response:
        if refresh is not None:
            await refresh()
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return handle
