"""How every Gandiva process talks gRPC securely: TLS credentials for servers and
clients, and the bearer token each client call carries. One place that the
scheduler, its CLIs, each helper and each job's runtime import.

Settings come from flags, else the environment:
  GANDIVA_TOKEN     the caller's token (`gandiva token create`)
  GANDIVA_TLS_CA    CA certificate (PEM) that signed the server's certificate
  GANDIVA_TLS_CERT / GANDIVA_TLS_KEY   a client certificate, for mutual TLS
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import ipaddress
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health

from scheduler.inputfile import open_input, writers_besides_owner

AUTH_HEADER = "authorization"
ENV_TOKEN = "GANDIVA_TOKEN"
ENV_TLS_CA = "GANDIVA_TLS_CA"
ENV_TLS_CERT = "GANDIVA_TLS_CERT"
ENV_TLS_KEY = "GANDIVA_TLS_KEY"


class SecurityError(ValueError):
    """A TLS or token setting that cannot be used; the message names it."""


# A certificate chain, or a CA bundle (the system's is about 200 KiB), is far smaller.
MAX_PEM_BYTES = 4 << 20


def _read(path: str, what: str) -> bytes:
    try:
        # Bounded, and a named pipe nothing writes to is refused: `--tls-key /dev/zero` took
        # the scheduler to 2.9 GB in 20 s, and a FIFO held it for ever, before it said a word.
        with open_input(path) as fh:
            st = os.fstat(fh.fileno())  # the file read, not whatever its name leads to later
            data = fh.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise SecurityError(f"{what} {path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_PEM_BYTES:
        raise SecurityError(f"{what} {path}: larger than {MAX_PEM_BYTES >> 20} MiB, so not a certificate or "
                            "key (PEM); give the file `gandiva tls init` wrote")
    if b"-----BEGIN " not in data:  # gRPC said only "Failed to create security handshaker"
        raise SecurityError(f"{what} {path}: not a PEM file (no -----BEGIN line); give the file "
                            "`gandiva tls init` wrote")
    if why := _exposed(st, path, what, b"PRIVATE KEY-----" in data):
        raise SecurityError(why)
    return data


def _exposed(st: os.stat_result, path: str, what: str, secret: bool) -> str:
    """Why a TLS file of these permissions must not be used ("" when it may). Whoever may
    write a certificate, a CA or a key can put their own there (a CA of theirs is then
    trusted, a key of theirs served), and a key every user may read is no longer private;
    SSH refuses such files the same way. A group may read a key (the `ssl-cert` group's
    0640 convention). A pipe (`<(...)`) has no such mode to judge and is let through."""
    if not stat.S_ISREG(st.st_mode):
        return ""
    if why := _replaceable_by_others(path):
        return f"{what} {path}: {why}"
    mode = st.st_mode & 0o7777
    if who := writers_besides_owner(mode):
        return (f"{what} {path} may be written by {who} (mode {mode:o}), who could replace it with their own; "
                f"make it its owner's to write: chmod go-w {path}")
    if secret and mode & 0o004:
        return (f"{what} {path} is a private key every user may read (mode {mode:o}); make it its owner's "
                f"only: chmod 600 {path}")
    return ""


def _replaceable_by_others(path: str) -> str:
    """Why others could put a file of theirs in ``path``'s place ("" when none could): a
    directory above it may be written by its group or every user without the sticky bit (a
    file's own mode 644 kept nobody from renaming it away there: a ca.pem under a /tmp/pki
    of mode 777 was taken), as SSH's StrictModes checks a key's directories. Who owns them
    is not judged: a cluster's CA is usually shared by the operator who made it."""
    directory = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return ""  # (gone since it was read: the read itself is what counted)
        if who := writers_besides_owner(mode, sticky_ok=True):
            return (f"its directory {directory} may be written by {who} (mode {mode & 0o7777:o}), who "
                    f"could replace the file; make it its owner's to write: chmod go-w {directory}")
        parent = os.path.dirname(directory)
        if parent == directory:
            return ""
        directory = parent


_TOKEN_TEXT = re.compile(r"[!-~]+")  # what an HTTP header value may carry unquoted
MAX_TOKEN_CHARS = 1024  # gdv.NAME.SECRET is at most 112; gRPC takes metadata of up to 16 KiB


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: a token, and the TLS trust (and identity) to use."""

    token: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    @classmethod
    def from_env(
        cls,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> ClientSecurity:
        """Flags win over the environment."""
        sec = cls(
            token=(token or environ.get(ENV_TOKEN, "")).strip(),
            tls_ca=tls_ca or environ.get(ENV_TLS_CA, ""),
            tls_cert=tls_cert or environ.get(ENV_TLS_CERT, ""),
            tls_key=tls_key or environ.get(ENV_TLS_KEY, ""),
        )
        if sec.token and not _TOKEN_TEXT.fullmatch(sec.token):
            # A newline was "INTERNAL: Invalid metadata"; a non-ASCII byte, a traceback. The
            # token is a secret: where, not what.
            bad = next(i for i, c in enumerate(sec.token) if not _TOKEN_TEXT.fullmatch(c))
            raise SecurityError(f"--token (or {ENV_TOKEN}): not a token: character {bad + 1} is not printable "
                                "ASCII (a line end, a blank, a pasted quote?); copy it again from "
                                "`gandiva token create`")
        if len(sec.token) > MAX_TOKEN_CHARS:
            # A file's contents given as the token: it went out, and came back as "refused: received
            # metadata size exceeds hard limit (value length 100007 vs. 16384)".
            raise SecurityError(f"--token (or {ENV_TOKEN}): not a token: {len(sec.token):,} characters, where a "
                                f"token (gdv.NAME.SECRET) has at most {MAX_TOKEN_CHARS}; copy it again from "
                                "`gandiva token create`")
        if bool(sec.tls_cert) != bool(sec.tls_key):
            raise SecurityError("--tls-cert and --tls-key go together (a client certificate and its key)")
        if sec.tls_cert and not sec.tls_ca:
            raise SecurityError("a client certificate needs --tls-ca (or GANDIVA_TLS_CA) too")
        return sec

    def env(self) -> dict[str, str]:
        """The same settings as environment variables, for a child process."""
        out = {ENV_TOKEN: self.token, ENV_TLS_CA: self.tls_ca,
               ENV_TLS_CERT: self.tls_cert, ENV_TLS_KEY: self.tls_key}
        return {k: v for k, v in out.items() if v}

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls_ca:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "--tls-ca"),
            private_key=_read(self.tls_key, "--tls-key") if self.tls_key else None,
            certificate_chain=_read(self.tls_cert, "--tls-cert") if self.tls_cert else None,
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTH_HEADER, f"Bearer {self.token}"),) if self.token else ()


class _Details(
    collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                        "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


def _with_token(details: Any, metadata: Sequence[tuple[str, str]]) -> Any:
    merged = list(details.metadata or ()) + list(metadata)
    return _Details(details.method, details.timeout, merged, details.credentials,
                    getattr(details, "wait_for_ready", None), getattr(details, "compression", None))


class _SyncToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.md = metadata

    def intercept_unary_unary(self, cont, details, request):  # type: ignore[no-untyped-def]
        return cont(_with_token(details, self.md), request)

    def intercept_unary_stream(self, cont, details, request):  # type: ignore[no-untyped-def]
        return cont(_with_token(details, self.md), request)

    def intercept_stream_unary(self, cont, details, it):  # type: ignore[no-untyped-def]
        return cont(_with_token(details, self.md), it)

    def intercept_stream_stream(self, cont, details, it):  # type: ignore[no-untyped-def]
        return cont(_with_token(details, self.md), it)


def _aio_interceptors(md: Sequence[tuple[str, str]]) -> list[grpc.aio.ClientInterceptor]:
    class Unary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, cont, details, request):  # type: ignore[no-untyped-def]
            return await cont(_with_token(details, md), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, cont, details, request):  # type: ignore[no-untyped-def]
            return await cont(_with_token(details, md), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, cont, details, it):  # type: ignore[no-untyped-def]
            return await cont(_with_token(details, md), it)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, cont, details, it):  # type: ignore[no-untyped-def]
            return await cont(_with_token(details, md), it)

    return [Unary(), UnaryStream(), StreamUnary(), StreamStream()]


def channel(address: str, security: ClientSecurity | None = None,
            options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel: TLS when a CA is configured, the token on every call."""
    security = security or ClientSecurity()
    creds = security.credentials()
    ch = (grpc.secure_channel(address, creds, options=list(options)) if creds is not None
          else grpc.insecure_channel(address, options=list(options)))
    md = security.metadata()
    return grpc.intercept_channel(ch, _SyncToken(md)) if md else ch


def aio_channel(address: str, security: ClientSecurity | None = None,
                options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """The asyncio counterpart of :func:`channel`."""
    security = security or ClientSecurity()
    creds = security.credentials()
    md = security.metadata()
    interceptors = _aio_interceptors(md) if md else None
    if creds is not None:
        return grpc.aio.secure_channel(address, creds, options=list(options), interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


@dataclass(frozen=True)
class ServerTls:
    """A listener's certificate and key, and the CA its clients' certificates must
    chain to (mutual TLS) when ``client_ca`` is set."""

    cert: str
    key: str
    client_ca: str = ""

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.key, "--tls-key"), _read(self.cert, "--tls-cert"))],
            root_certificates=_read(self.client_ca, "--tls-client-ca") if self.client_ca else None,
            require_client_auth=bool(self.client_ca),
        )

    @classmethod
    def from_flags(cls, cert: str | None, key: str | None, client_ca: str | None) -> ServerTls | None:
        if not cert and not key:
            if client_ca:
                raise SecurityError("--tls-client-ca needs --tls-cert and --tls-key")
            return None
        if not (cert and key):
            raise SecurityError("--tls-cert and --tls-key go together")
        tls = cls(cert, key, client_ca or "")
        tls.credentials()  # unreadable files fail now, naming the flag
        tls._check_pair()
        return tls

    def _check_pair(self) -> None:
        """SecurityError unless --tls-cert is a certificate whose private key is --tls-key
        (and --tls-client-ca holds certificates): gRPC takes any PEM files here and only
        fails when it binds, in words that blame the address."""
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert, key = Path(self.cert).expanduser(), Path(self.key).expanduser()
        try:
            # An encrypted key gets an empty password and fails: gRPC cannot use it either.
            context.load_cert_chain(cert, key, password=b"")
        except ssl.SSLError as exc:
            raise SecurityError(
                f"--tls-cert {self.cert} and --tls-key {self.key} are not a certificate and its "
                f"unencrypted private key ({exc.reason or exc}); give the server.pem and server-key.pem "
                "that `gandiva tls init` wrote, as a pair") from None
        if self.client_ca:
            try:
                context.load_verify_locations(Path(self.client_ca).expanduser())
            except ssl.SSLError as exc:
                raise SecurityError(f"--tls-client-ca {self.client_ca}: not a CA certificate "
                                    f"({exc.reason or exc}); give the ca.pem `gandiva tls init` wrote") from None


def is_loopback(listen: str) -> bool:
    """True when ``host:port`` listens on loopback only (127.0.0.0/8, ::1, localhost)."""
    return is_loopback_host(listen.rpartition(":")[0].strip("[]"))


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an address or a name, no port) is this machine's loopback: 127.0.0.0/8,
    ::1, ::ffff:127.x.x.x (IPv4's, as a dual-stack socket sees it) or localhost in any case.
    The one answer of every server Gandiva runs: which addresses may serve without TLS and
    tokens (gRPC, `check_exposure`) and where the dashboard holds Host to this machine's
    names (scheduler/observe/http.py). They asked in two places, and disagreed: "LOCALHOST"
    was loopback to the dashboard only, ::ffff:127.0.0.1 to neither
    (tests/scheduler/security/test_tls_and_exposure.py -k agree)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name or a wildcard ("", 0.0.0.0, [::]): reachable from elsewhere
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


# Options of every gRPC server Gandiva runs. gRPC sets SO_REUSEPORT by default, so a
# second scheduler (or helper) started on a port already in use would bind it too and take
# half the connections; without it the second one stops with "address in use".
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (("grpc.so_reuseport", 0),)
# A server takes FD_RESERVE fewer connections than the process may open files: 20,000
# idle connections from one client (no token is needed to connect) used up the
# scheduler's file descriptors, and with them its database ("unable to open database
# file": every call and round failed as an outage). Past the cap gRPC closes a new
# connection at once; those open, and the files the process needs, are kept.
FD_RESERVE = 256


def server_options() -> list[tuple[str, Any]]:
    """SERVER_OPTIONS and the connection cap, for a server started now. The soft limit on
    open files is raised to the hard one first (often 1,024 against 524,288)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    cap = 1 << 20 if soft == resource.RLIM_INFINITY else max(16, min(soft - FD_RESERVE, soft * 3 // 4))
    return [*SERVER_OPTIONS, ("grpc.max_allowed_incoming_connections", cap)]


def check_listen(listen: str, flag: str = "--listen") -> None:
    """ValueError unless ``listen`` is ``HOST:PORT`` with a port gRPC can bind (0-65535; 0
    picks a free one) or a ``unix:`` path. gRPC itself takes 99999 as 99999 - 65536."""
    if listen.startswith("unix:"):
        return
    _host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise ValueError(f"{flag} {listen!r}: expected HOST:PORT (e.g. 127.0.0.1:50051)")
    if int(port) > 65535:
        raise ValueError(f"{flag} {listen!r}: port {int(port)} is out of range (0-65535)")


def add_port(server: grpc.aio.Server, listen: str, tls: ServerTls | None, flag: str = "--listen") -> int:
    """Bind ``listen``; OSError naming the address when it cannot be bound (in use, say)."""
    check_listen(listen, flag)
    try:
        if tls is None:
            return server.add_insecure_port(listen)
        return server.add_secure_port(listen, tls.credentials())
    except RuntimeError:  # grpc: "Failed to bind to address ..."
        raise OSError(f"{flag} {listen}: cannot listen there: the address is in use (another "
                      "scheduler or helper?) or not on this host") from None


def check_exposure(listen: str, tls: ServerTls | None, auth: bool, insecure: bool, what: str,
                   auth_flag: str = "--auth token") -> str:
    """Refuse to serve an open address without TLS and authentication.

    Returns the warning to log when serving without them is allowed (loopback, or
    --insecure); raises SecurityError naming the flags otherwise."""
    missing = [flag for flag, ok in (("--tls-cert/--tls-key", tls is not None),
                                     (auth_flag, auth)) if not ok]
    if not missing:
        return ""
    if is_loopback(listen):
        return (f"{what} listens on loopback {listen} without {' and '.join(missing)}: "
                "only this machine can reach it")
    if insecure:
        return (f"{what} listens on {listen} WITHOUT {' and '.join(missing)} (--insecure): "
                "anyone who can reach it can act as any user")
    raise SecurityError(
        f"refusing to listen on {listen} without {' and '.join(missing)}: anyone who can reach "
        f"it could act as the cluster. Give {' and '.join(missing)} (see `gandiva tls init` and "
        "`gandiva token create`), listen on 127.0.0.1, or pass --insecure"
    )


# ---- requests that are not protobuf messages ---------------------------------------------


class _Malformed:
    """What a request that does not parse as its method's message turns into."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(deserialize: Any) -> Any:
    def load(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, or anything a parser raises
            return _Malformed(str(err) or type(err).__name__)
    return load


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a request that does not parse as its method's protobuf message with
    INVALID_ARGUMENT naming the method and the message type: gRPC itself answers UNKNOWN
    with its internal exception's text. Every Gandiva gRPC server installs it (innermost:
    the other interceptors, such as the token check, see the request first)."""

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        message = getattr(getattr(handler.request_deserializer, "__self__", None), "DESCRIPTOR", None)
        expected = f"a {message.full_name} message" if message is not None else "a valid message"
        method = details.method

        async def refuse(request: _Malformed, context: Any) -> None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{method}: the request is not {expected} ({request.error}); "
                                f"check that the client sends this method's request type")

        def unary(inner: Any) -> Any:
            async def call(request: Any, context: Any) -> Any:
                if isinstance(request, _Malformed):
                    await refuse(request, context)
                return await inner(request, context)
            return call

        def unary_streaming(inner: Any) -> Any:
            if not inspect.isasyncgenfunction(inner):
                # A handler that writes its answers (`await context.write(...)`), as the
                # health service's Watch does: iterated, it failed every call UNKNOWN
                # ("'async for' requires an object with __aiter__ method, got coroutine").
                async def call_writing(request: Any, context: Any) -> Any:
                    if isinstance(request, _Malformed):
                        await refuse(request, context)
                    return await inner(request, context)
                return call_writing

            async def call(request: Any, context: Any) -> Any:
                if isinstance(request, _Malformed):
                    await refuse(request, context)
                async for item in inner(request, context):
                    yield item
            return call

        def checked(requests: Any, context: Any) -> Any:
            async def each() -> Any:
                async for request in requests:
                    if isinstance(request, _Malformed):
                        await refuse(request, context)
                    yield request
            return each()

        def stream_unary(inner: Any) -> Any:
            async def call(requests: Any, context: Any) -> Any:
                return await inner(checked(requests, context), context)
            return call

        def stream_stream(inner: Any) -> Any:
            if not inspect.isasyncgenfunction(inner):  # writes its answers (above)
                async def call_writing(requests: Any, context: Any) -> Any:
                    return await inner(checked(requests, context), context)
                return call_writing

            async def call(requests: Any, context: Any) -> Any:
                async for item in inner(checked(requests, context), context):
                    yield item
            return call

        wrappers = {"unary_unary": unary, "unary_stream": unary_streaming, "stream_unary": stream_unary,
                    "stream_stream": stream_stream}
        return rewrap_handler(handler, lambda kind, inner: wrappers[kind](inner),
                              _tolerant(handler.request_deserializer))


# Health watches open at once. They need no token (load balancers), so anyone who reaches
# the port may open them: 5,000 took a scheduler from 99 to 193 MB (about 19 KB each).
MAX_HEALTH_WATCHES = 1024


class BoundedHealth(health.aio.HealthServicer):
    """The standard health service, with at most MAX_HEALTH_WATCHES `Watch` streams open
    at once; past them RESOURCE_EXHAUSTED. `Check` is unbounded (one answer each)."""

    def __init__(self, most: int = MAX_HEALTH_WATCHES) -> None:
        super().__init__()
        self._most, self._open = most, 0

    async def Watch(self, request: Any, context: Any) -> None:  # type: ignore[override]
        if self._open >= self._most:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self._most} health watches are open already; use Check, or close one")
        self._open += 1
        try:
            await super().Watch(request, context)
        finally:
            self._open -= 1


class LetGoOfRequestsInterceptor(grpc.aio.ServerInterceptor):
    """Outermost on the scheduler: a unary call refused (a bad token, an invalid request:
    any abort) lets go of its request at once (_let_go)."""

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def call(request: Any, context: Any) -> Any:
            try:
                return await inner(request, context)
            except (grpc.aio.AbortError, asyncio.CancelledError) as exc:
                # A refusal (or a call its client gave up on); anything else keeps its
                # traceback for gRPC's "Unexpected error" log.
                _let_go(exc)
                del request  # this frame joins the traceback as the exception leaves it
                raise

        return grpc.unary_unary_rpc_method_handler(call, handler.request_deserializer, handler.response_serializer)


def _let_go(exc: BaseException) -> None:
    """Drops the tracebacks of ``exc`` and of the exceptions it chains. A refused call's
    exception (gRPC's AbortError, chained to the InvalidArgument it reports) ends up in a
    reference cycle inside gRPC, freed only by the cyclic collector, which a running scheduler
    runs seldom (quiet_gc): meanwhile the frames on its traceback held the call's request.
    20 refused 14 MiB submissions kept 620 MB, and under --auth token 64 refused without a
    token kept 1.1 GB, each time they came. (Its frames are not cleared: frame.clear() would
    close a coroutine still suspended that once caught an exception of the chain.)"""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 32:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        each.__traceback__ = None
        todo += [each.__cause__, each.__context__]


_HANDLER_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
                  ("unary_stream", grpc.unary_stream_rpc_method_handler),
                  ("stream_unary", grpc.stream_unary_rpc_method_handler),
                  ("stream_stream", grpc.stream_stream_rpc_method_handler))


def rewrap_handler(handler: grpc.RpcMethodHandler, wrap: Any, request_deserializer: Any = None) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour replaced by ``wrap(kind, behaviour)`` (kind: unary_unary,
    unary_stream, stream_unary or stream_stream), for server interceptors."""
    codec = (request_deserializer or handler.request_deserializer, handler.response_serializer)
    for kind, make in _HANDLER_KINDS:
        inner = getattr(handler, kind)
        if inner is not None:
            return make(wrap(kind, inner), *codec)
    raise ValueError(f"a gRPC method handler with no behaviour: {handler!r}")
