"""Domain errors -> gRPC status codes, in one decorator every servicer method wears."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from scheduler.errors import (
    FailedPrecondition,
    GandivaError,
    InvalidArgument,
    NotFound,
    Unavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
]


def code_for(err: Exception) -> grpc.StatusCode | None:
    for kind, code in CODES:
        if isinstance(err, kind):
            return code
    return None


async def _abort_with(err: GandivaError, context: grpc.aio.ServicerContext) -> None:
    """Abort the call with `err`'s status code; re-raise `err` if it has none."""
    code = code_for(err)
    if code is None:
        raise err
    await context.abort(code, str(err))


def grpc_errors(fn: F) -> F:
    """Unary methods: domain errors abort the call with their status code."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except GandivaError as err:
            await _abort_with(err, context)

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

    return wrapper  # type: ignore[return-value]
