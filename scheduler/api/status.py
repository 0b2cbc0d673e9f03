"""Domain errors -> gRPC status codes, in one decorator every servicer method wears."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from sqlalchemy import exc as sa_exc

from scheduler.errors import (
    BUSY_METADATA,
    AlreadyExists,
    Busy,
    FailedPrecondition,
    GandivaError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)

CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
]


def code_for(err: Exception) -> grpc.StatusCode | None:
    for kind, code in CODES:
        if isinstance(err, kind):
            return code
    return None


async def _abort_with(err: GandivaError, context: grpc.aio.ServicerContext) -> None:
    """Abort the call with `err`'s status code; re-raise `err` if it has none."""
    code = code_for(err)
    # A busy job's refusal says so in metadata too: clients ask again by it, not by its words.
    trailing = (BUSY_METADATA,) if isinstance(err, Busy) else ()
    await context.abort(code or grpc.StatusCode.INTERNAL, str(err), trailing_metadata=trailing)


def unexpected_status(err: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """A status for an error no domain rule anticipated: never UNKNOWN, and never
    the database's own message (it may quote other users' data)."""
    if isinstance(err, sa_exc.DataError):
        log.warning("%s: the database refused a value: %s", method, err)
        return grpc.StatusCode.INVALID_ARGUMENT, "a value in the request cannot be stored by the database"
    if isinstance(err, sa_exc.IntegrityError):
        log.warning("%s: integrity error: %s", method, err)
        return grpc.StatusCode.FAILED_PRECONDITION, "the request conflicts with the stored state; retry"
    if isinstance(err, sa_exc.TimeoutError):  # the connection pool's wait, not the database's
        log.warning("%s: no database connection free within the pool's timeout", method)
        return grpc.StatusCode.UNAVAILABLE, "the scheduler is busy (every database connection in use); retry shortly"
    if isinstance(err, sa_exc.SQLAlchemyError):
        log.error("%s: database error", method, exc_info=err)
        return grpc.StatusCode.INTERNAL, f"database error ({type(err).__name__}); see the scheduler log"
    log.error("%s: internal error", method, exc_info=err)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(err).__name__}); see the scheduler log"


async def _abort_unexpected(err: Exception, fn: Callable[..., Any], context: grpc.aio.ServicerContext) -> None:
    code, message = unexpected_status(err, fn.__name__)
    await context.abort(code, message)


def grpc_errors(fn: F) -> F:
    """Unary methods: domain errors abort the call with their status code; any
    other error with INTERNAL (or what the database said, mapped), never UNKNOWN."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except GandivaError as err:
            await _abort_with(err, context)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as err:  # noqa: BLE001 - mapped to a status, logged with its trace
            await _abort_unexpected(err, fn, context)

    return wrapper  # type: ignore[return-value]


def grpc_stream_errors(fn: F) -> F:
    """Server-streaming methods (async generators): the same mapping."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in fn(self, request, context):
                yield item
        except GandivaError as err:
            await _abort_with(err, context)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as err:  # noqa: BLE001 - mapped to a status, logged with its trace
            await _abort_unexpected(err, fn, context)

    return wrapper  # type: ignore[return-value]
