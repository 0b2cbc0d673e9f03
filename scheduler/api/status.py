"""Domain errors -> gRPC status codes, in one decorator every servicer method wears."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger(__name__)

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


def grpc_errors(fn: F) -> F:
    """Unary methods: domain errors abort the call with their status code."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except Exception as err:
            code = code_for(err)
            if code is None:
                raise
            await context.abort(code, str(err))

    return wrapper  # type: ignore[return-value]


def grpc_stream_errors(fn: F) -> F:
    """Server-streaming methods (async generators): the same mapping."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in fn(self, request, context):
                yield item
        except Exception as err:
            code = code_for(err)
            if code is None:
                raise
            await context.abort(code, str(err))

    return wrapper  # type: ignore[return-value]
