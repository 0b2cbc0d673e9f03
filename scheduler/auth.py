"""Who is calling: per-user tokens, helper tokens scoped to a server, and runtime
tokens scoped to one launch of one job; and the server interceptor that checks
them on every call.

Tokens
  ``gdv.NAME.SECRET``   a user's, an operator's or a helper's (`gandiva token create`);
                        the database keeps only sha256(token).
  ``gdvr.HELPER.JOB.INCARNATION.MAC``  a job runtime's, minted by the helper that
                        launches it: MAC = HMAC-SHA256(key=sha256(helper token),
                        "JOB\\nINCARNATION"). The scheduler checks it against the
                        helper's stored hash, so a runtime can speak only for its
                        own job and launch, and revoking the helper revokes them all.

With authentication off (the loopback default) every caller is ANONYMOUS and
trusted as an operator; spec.user is then what the client says.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy import select

from scheduler.errors import (
    GandivaError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from scheduler.state.db import bytewise
from scheduler.state.models import AuthToken
from scheduler.transport import AUTH_HEADER, rewrap_handler

log = logging.getLogger(__name__)

ROLES = ("user", "operator", "helper")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# Revocation takes effect within this many seconds (verified tokens are cached).
CACHE_S = 2.0
# What ListServers shows a user instead of another user's job id ("hidden-1", ...).
HIDDEN_JOB = "hidden-"


@dataclass(frozen=True)
class Identity:
    name: str
    role: str  # user | operator | helper | runtime | anonymous
    job_id: str = ""
    incarnation: str = ""

    @property
    def sees_all(self) -> bool:
        """Operators, and everyone when authentication is off."""
        return self.role in ("operator", "anonymous")

    @property
    def server(self) -> str:
        """The server a helper's credential is scoped to."""
        return self.name if self.role == "helper" else ""


ANONYMOUS = Identity("", "anonymous")
_current: ContextVar[Identity] = ContextVar("gandiva_identity", default=ANONYMOUS)


def current() -> Identity:
    """The caller of the RPC being served."""
    return _current.get()


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise InvalidArgument("name", f"{name!r}: use 1-64 letters, digits, '_' or '-'")
    return name


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(name: str) -> str:
    return f"gdv.{name}.{secrets.token_urlsafe(32)}"


def runtime_token(helper_token: str, job_id: str, incarnation: str) -> str:
    """The credential a helper hands the runtime of one launch of a job."""
    return f"gdvr.{_name_of(helper_token)}.{job_id}.{incarnation}.{_mac(digest(helper_token), job_id, incarnation)}"


def _name_of(token: str) -> str:
    """NAME of a ``gdv.NAME.SECRET`` token ("" when it has no such part)."""
    return token.split(".")[1] if token.count(".") >= 2 else ""


def _mac(key_hex: str, job_id: str, incarnation: str) -> str:
    return hmac.new(bytes.fromhex(key_hex), f"{job_id}\n{incarnation}".encode(), hashlib.sha256).hexdigest()


# ---- transfer tickets: the scheduler vouches for a checkpoint stream to a helper ------------

# The gRPC metadata key a helper sends a peer's agent its ticket under.
TICKET_HEADER = "gandiva-transfer-ticket"
# How long a ticket stays good (the transfer of a large checkpoint included).
TICKET_S = 3600.0


def transfer_ticket(dest_token_hash: str, dest: str, job_id: str, checkpoint: str, expires: float) -> str:
    """``gdvt.EXPIRES.MAC``: the scheduler's leave for one checkpoint of one job, named
    ``checkpoint`` there, to be streamed into helper ``dest``'s agent until ``expires``
    (Unix time). MAC = HMAC-SHA256(key = sha256(dest's helper token),
    "transfer\nDEST\nJOB\nCHECKPOINT\nEXPIRES"): only the scheduler (which stores that hash)
    can make one, and only ``dest`` (which holds the token) can check it; no secret crosses
    the wire. The name binds it to one checkpoint: without it, whoever held a ticket could
    stream any number of checkpoints of that job under new names for its hour."""
    stamp = f"{int(expires)}"
    return f"gdvt.{stamp}.{_ticket_mac(dest_token_hash, dest, job_id, checkpoint, stamp)}"


def _ticket_mac(key_hex: str, dest: str, job_id: str, checkpoint: str, stamp: str) -> str:
    return hmac.new(bytes.fromhex(key_hex), f"transfer\n{dest}\n{job_id}\n{checkpoint}\n{stamp}".encode(),
                    hashlib.sha256).hexdigest()


def check_transfer_ticket(own_token: str, ticket: str, job_id: str, checkpoint: str,
                          now: float | None = None) -> float:
    """On the destination helper (whose token is ``own_token``): the ticket must be the
    scheduler's, for this helper, this job and this checkpoint name, and not expired; else
    PermissionDenied (Unauthenticated when there is none), saying which. Returns its expiry
    (how long the agent must remember it as spent: it is good for one transfer)."""
    if not ticket:
        raise Unauthenticated("this helper's agent takes checkpoints only from the scheduler's "
                              "registered helpers: the stream carries no transfer ticket (the "
                              "scheduler issues one with each TransferCheckpoint when --auth token is on)")
    parts = ticket.split(".")
    me = _name_of(own_token)
    if len(parts) != 3 or parts[0] != "gdvt" or not parts[1].isdigit():
        raise PermissionDenied("the transfer ticket is malformed")
    if not hmac.compare_digest(parts[2], _ticket_mac(digest(own_token), me, job_id, checkpoint, parts[1])):
        raise PermissionDenied(f"the transfer ticket is not the scheduler's for checkpoint {checkpoint!r} "
                               f"of job {job_id!r} to helper {me!r}")
    if int(parts[1]) < (time.time() if now is None else now):
        raise PermissionDenied("the transfer ticket has expired; the scheduler issues a new one with the next migration")
    return float(parts[1])


# ---- the token store ---------------------------------------------------------------


async def create_token(session: Any, name: str, role: str, now: float | None = None) -> str:
    """A new token for NAME (replacing a revoked one); returns it: it is shown once."""
    check_name(name)
    if role not in ROLES:
        raise InvalidArgument("role", f"{role!r}: one of {', '.join(ROLES)}")
    token = new_token(name)
    row = await session.get(AuthToken, name)
    if row is not None and not row.revoked_at:
        raise InvalidArgument("name", f"{name!r} already has a token; revoke it first")
    if row is None:
        row = AuthToken(name=name)
        session.add(row)
    row.role, row.token_hash, row.created_at, row.revoked_at = role, digest(token), now or time.time(), 0.0
    return token


async def revoke_token(session: Any, name: str, now: float | None = None) -> None:
    row = await session.get(AuthToken, name)
    if row is None or row.revoked_at:
        raise NotFound("token", name)
    row.revoked_at = now or time.time()


async def list_tokens(session: Any) -> list[AuthToken]:
    return list((await session.scalars(select(AuthToken).order_by(bytewise(AuthToken.name)))).all())


# Up to this many tokens, the whole table is read at once (one query per CACHE_S
# however many helpers and users call); past it, each name is read on its own.
TABLE_MAX = 10_000
# A name the cached table lacks has the table read again, at most this often (seconds).
UNKNOWN_READ_S = 0.25


class Authenticator:
    """Turns a bearer token into an Identity, with a short cache so the database is
    not read on every call (a revocation takes effect within CACHE_S).

    The cache is the whole tokens table, read at most once per CACHE_S while calls
    come (a busy cluster's hundred helpers cost one query, not one per helper); a
    name not in it (created since, or unknown) is read on its own and cached alike.
    Once the table is half that old, a call starts reading it again in the background
    and is answered from the table it has: under steady calls none waits for the read
    (every call arriving during it did, up to a quarter of a second under load)."""

    def __init__(self, sessions: Callable[[], Any], clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions = sessions
        self._clock = clock
        self._rows: dict[str, tuple[float, tuple[str, str] | None]] = {}
        self._table: dict[str, tuple[str, str] | None] = {}
        self._table_at = -math.inf
        self._refreshing = asyncio.Lock()
        self._reads = 0  # how many times the table was read
        self._ahead: asyncio.Task | None = None

    async def _refresh(self, max_age: float = CACHE_S, after: int | None = None) -> None:
        """Read the tokens table unless it is younger than ``max_age`` (or, with ``after``,
        unless it was read since read number ``after``): one caller reads; the others wait
        for its answer."""
        async with self._refreshing:
            if (self._reads != after) if after is not None else (self._clock() - self._table_at < max_age):
                return  # read meanwhile by another call
            now = self._clock()
            q = select(AuthToken.name, AuthToken.role, AuthToken.token_hash, AuthToken.revoked_at).limit(TABLE_MAX + 1)
            async with self._sessions() as s:
                rows = (await s.execute(q)).all()
            table = {n: ((role, h) if not revoked else None) for n, role, h, revoked in rows}
            self._rows.clear()
            self._reads += 1
            # Too many to read whole every CACHE_S: from now on each name on its own.
            self._table, self._table_at = (table, now) if len(table) <= TABLE_MAX else ({}, math.inf)

    async def _row(self, name: str, reread: bool = True) -> tuple[str, str] | None:
        """(role, token hash) of a live token, None if unknown or revoked (without ``reread``,
        a name the cached table lacks is None at once)."""
        age = self._clock() - self._table_at
        if age >= CACHE_S:
            await self._refresh()
        elif age >= CACHE_S / 2 and (self._ahead is None or self._ahead.done()):
            self._ahead = asyncio.create_task(self._refresh_ahead())
        if name in self._table:
            return self._table[name]
        if self._table_at != math.inf:  # the whole table is here: a name it lacks is unknown,
            return await self._not_in_table(name) if reread else None  # or created since it was read
        now = self._clock()
        hit = self._rows.get(name)
        if hit is not None and now - hit[0] < CACHE_S:
            return hit[1]
        async with self._sessions() as s:
            row = await s.get(AuthToken, name)
        value = (row.role, row.token_hash) if row is not None and not row.revoked_at else None
        if len(self._rows) > 100_000:
            self._rows.clear()
        self._rows[name] = (now, value)
        return value

    async def _not_in_table(self, name: str) -> tuple[str, str] | None:
        """A name the cached table lacks. The table is read again, one read for every such
        call and at most every UNKNOWN_READ_S, so that a token just created works at once
        (within UNKNOWN_READ_S): reading the name alone cost a query per call, and calls
        with made-up names (no credential needed to send them) took 1.95 ms of the
        scheduler's CPU each instead of 0.39; 16 clients kept it at 124%."""
        seen = self._reads
        wait = UNKNOWN_READ_S - (self._clock() - self._table_at)
        if wait > 0:
            await asyncio.sleep(min(wait, UNKNOWN_READ_S))
        await self._refresh(after=seen)
        if self._table_at == math.inf:  # the table outgrew TABLE_MAX: names are read alone
            return await self._row(name)
        return self._table.get(name)

    async def _refresh_ahead(self) -> None:
        try:
            await self._refresh(CACHE_S / 2)
        except Exception as err:  # noqa: BLE001 - a call past CACHE_S reads it itself and says why
            log.debug("reading the tokens table ahead of time failed: %s", err)

    async def _good_row(self, name: str, good: Callable[[tuple[str, str]], bool]) -> tuple[str, str] | None:
        """The row of NAME if ``good`` says the token matches it; otherwise the table is read
        again (one read for all such calls, at most every UNKNOWN_READ_S) and checked once
        more. A refusal so takes as long whether the name is unknown, revoked or its secret
        wrong: a wrong secret for a known name was refused in 0.5 ms and a made-up name in
        251 ms, which told anyone which names have tokens (operators' included). And a token
        created again (revoke, create) works within UNKNOWN_READ_S, not CACHE_S."""
        row = await self._row(name, reread=False)
        if row is not None and good(row):
            return row
        if self._table_at == math.inf:  # no table to read again: names were read one by one
            return None
        row = await self._not_in_table(name)
        return row if row is not None and good(row) else None

    async def identify(self, token: str) -> Identity:
        parts = token.split(".")
        if parts[0] == "gdv" and len(parts) == 3 and _NAME.match(parts[1]):
            row = await self._good_row(parts[1], lambda r: hmac.compare_digest(r[1], digest(token)))
            if row is not None:
                return Identity(parts[1], row[0])
        elif parts[0] == "gdvr" and len(parts) == 5 and _NAME.match(parts[1]):
            _, helper, job_id, incarnation, mac = parts
            row = await self._good_row(helper, lambda r: r[0] == "helper" and hmac.compare_digest(
                mac, _mac(r[1], job_id, incarnation)))
            if row is not None:
                return Identity(helper, "runtime", job_id=job_id, incarnation=incarnation)
        raise Unauthenticated("the token is unknown or revoked; ask an operator for a new one "
                              "(`gandiva token create`)")


# ---- the server interceptor ----------------------------------------------------------

# Which kind of caller may use which service (operators: all but the runtime stream).
_SERVICE_ROLES = {
    "gandiva.v1.Scheduler": {"user", "operator"},
    "gandiva.v1.Helper": {"helper"},
    "gandiva.v1.Runtime": {"runtime"},
}
# Callable without a credential: load balancers' and tools' health checks.
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def _token_of(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == AUTH_HEADER and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):].strip()
    return ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call's token before its request is received, and makes the caller's
    Identity available to the handler through :func:`current`.

    The check runs here, on the call's metadata, not in the handler: gRPC receives a
    unary request whole before it calls the handler, so a call without a valid token
    used to cost the scheduler its request (up to 16 MiB) first; 64 such 14 MiB
    SubmitJobs at once took it from 95 MB to 690-850 MB. A refused call gets a handler
    that never asks for its request (benchmarks/big_request_memory.py)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.auth = authenticator
        self.streams = _OpenStreams(authenticator)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler
        service = method.split("/")[1] if method.count("/") >= 2 else ""
        try:
            ident = await self._admit(details.invocation_metadata, method, _SERVICE_ROLES.get(service))
        except _Refused as refusal:
            return _refusing(handler, refusal.code, refusal.details)
        return _wrap(handler, ident, lambda: self.streams.opened(_token_of(details.invocation_metadata)))

    async def _admit(self, metadata: Any, method: str, allowed: set[str] | None) -> Identity:
        token = _token_of(metadata)
        if not token:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED,
                           "this scheduler requires a token: pass --token or set GANDIVA_TOKEN")
        try:
            ident = await self.auth.identify(token)
        except Unauthenticated as err:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None
        except GandivaError as err:  # the database is down: say so, not "unauthenticated"
            raise _Refused(grpc.StatusCode.UNAVAILABLE, str(err)) from None
        except Exception as err:
            log.error("token check failed", exc_info=err)
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"cannot check the token now ({type(err).__name__})") from None
        if allowed is not None and ident.role not in allowed:
            raise _Refused(grpc.StatusCode.PERMISSION_DENIED,
                           f"{method}: not allowed for a {ident.role} credential ({ident.name})")
        return ident


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler for ``handler``'s method that answers ``code`` at once without reading
    the request: taken as a request stream, which gRPC does not receive before the
    handler asks for it (the bytes on the wire are the same for every kind)."""
    async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, details)

    async def streaming(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(code, details)
        yield  # an async generator, as gRPC expects of a response stream

    codec = (handler.request_deserializer, handler.response_serializer)
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, *codec)
    return grpc.stream_unary_rpc_method_handler(unary, *codec)


class _OpenStreams:
    """Response streams open under each token, ended when their token stops being good.

    A token is checked when a call starts; a stream opened before its token was revoked
    used to go on for as long as its client kept it: a revoked user's `WatchEvents` still
    received their jobs' events (probed: an event 5 s after the revocation), a revoked
    helper's `ReceiveCommands` its commands, its jobs' runtime streams theirs. Every
    CACHE_S, each distinct token of an open stream is identified again (from the cached
    table: no query of its own); a stream whose token is no longer good is cancelled and
    ends UNAUTHENTICATED, so within 2 * CACHE_S of the revocation. A database that cannot
    be read ends nothing."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.auth = authenticator
        self._open: dict[asyncio.Task[Any], str] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def opened(self, token: str) -> Iterator[Callable[[], bool]]:
        """While the stream is served; yields "was it ended for its token?"."""
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = token
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())
        try:
            yield lambda: task in self._cut
        finally:
            self._open.pop(task, None)
            self._cut.discard(task)

    async def _sweep(self) -> None:
        while self._open:
            await asyncio.sleep(CACHE_S)
            for token in set(self._open.values()):
                try:
                    await self.auth.identify(token)
                except Unauthenticated:
                    for task in [t for t, tok in self._open.items() if tok == token and t not in self._cut]:
                        self._cut.add(task)
                        task.cancel()
                except Exception as err:  # noqa: BLE001 - an outage must not end every stream
                    log.debug("checking the tokens of open streams failed: %s", err)


def _wrap(handler: grpc.RpcMethodHandler, ident: Identity,
          opened: Callable[[], contextlib.AbstractContextManager[Callable[[], bool]]]) -> grpc.RpcMethodHandler:
    """The same handler, binding the caller's identity; a response stream is ended
    UNAUTHENTICATED once its token is revoked (``opened``: _OpenStreams.opened).
    (Each RPC runs in its own task, so a streaming call's binding stays its own.)"""

    def unary(inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            _current.set(ident)
            return await inner(request, context)
        return call

    def streaming(inner: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            _current.set(ident)
            with opened() as was_cut:
                try:
                    async for item in inner(request, context):
                        yield item
                except asyncio.CancelledError:
                    if not was_cut():
                        raise  # the client went away, or the server stops
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                        "the token was revoked while this stream was open; "
                                        "ask an operator for a new one (`gandiva token create`)")
        return call

    # A single response (unary_unary, stream_unary) is awaited; a stream is iterated.
    return rewrap_handler(handler, lambda kind, inner: unary(inner) if kind.endswith("_unary") else streaming(inner))


# ---- authorization rules the servicers apply --------------------------------------------


def may_see_job(ident: Identity, owner: str) -> bool:
    return ident.sees_all or (ident.role == "user" and ident.name == owner)


def require_job_access(ident: Identity, owner: str, job_id: str) -> None:
    if not may_see_job(ident, owner):
        raise PermissionDenied(f"job {job_id} belongs to another user; only its owner and operators may see or act on it")


def require_operator(ident: Identity, what: str) -> None:
    """Only an operator (or anyone, without --auth token) may do ``what``."""
    if ident.role not in ("operator", "anonymous"):
        raise PermissionDenied(f"{what} is for operators only; this credential is {ident.role} {ident.name!r} "
                               "(an operator's token: gandiva token create NAME --operator)")


# The highest priority a user's token may give its own jobs; operators may give up to
# validation.MAX_PRIORITY. A job's time slice on a shared GPU is quantum x its priority and
# the queue goes by priority first, so a user who set 1,000,000 (as any could) would have
# held a GPU shared with another user's job for 60 s x 1,000,000 per turn.
USER_MAX_PRIORITY = 100


def require_priority(ident: Identity, priority: int, field: str) -> None:
    """A user's token sets at most USER_MAX_PRIORITY."""
    if ident.role == "user" and priority > USER_MAX_PRIORITY:
        raise PermissionDenied(
            f"{field}: {priority} is above {USER_MAX_PRIORITY}, the most a user may give their own jobs "
            "(a job's share of a GPU it shares grows with its priority); ask an operator for more")


def require_server(ident: Identity, server: str, field: str = "server") -> None:
    """A helper speaks only for the server its credential names."""
    if ident.role == "anonymous":
        return
    if ident.role != "helper" or ident.server != server:
        raise PermissionDenied(f"{field}: this credential may act only for server {ident.server or '(none)'!r}, not {server!r}")


def require_runtime(ident: Identity, job_id: str, incarnation: str) -> None:
    """A runtime speaks only for its own job and launch."""
    if ident.role == "anonymous":
        return
    if ident.role != "runtime" or ident.job_id != job_id or ident.incarnation != incarnation:
        raise PermissionDenied(
            f"hello: this credential is for job {ident.job_id!r} incarnation {ident.incarnation!r}, "
            f"not {job_id!r} {incarnation!r}")
