"""Pages of a listing: how many items, how many bytes, and the token that resumes it.

A page holds at most ``page_size`` items and stops early once its encoded size
passes PAGE_BYTES, so any page fits a client's default 4 MiB receive limit (one
job is at most a few hundred KiB: scheduler/validation.py bounds every field).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from scheduler.errors import InvalidArgument

PAGE_BYTES = 2 << 20
T = TypeVar("T")


def page_size(requested: int, limit: int, default: int, maximum: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", "must be 0 (the default) or positive")
    if limit < 0:
        raise InvalidArgument("limit", "must be 0 (no limit) or positive")
    size = min(requested or default, maximum)
    return min(size, limit) if limit else size


def encode(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode(token: str) -> Any:
    if len(token) > 512:
        raise InvalidArgument("page_token", "not a token this scheduler issued")
    try:
        return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError:
        raise InvalidArgument("page_token", "not a token this scheduler issued") from None


def job_cursor(token: str) -> tuple[float, int, str] | None:
    """(submitted_at, array_index, id) of the last job listed. A token of an older
    scheduler, (submitted_at, id), resumes at that submission time's first member: its
    jobs may be listed again, none is skipped."""
    if not token:
        return None
    value = decode(token)
    if isinstance(value, list) and len(value) == 2:
        value = [value[0], -1, value[1]]
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], (int, float))
            and isinstance(value[1], int) and not isinstance(value[1], bool) and -1 <= value[1] < 2**31
            and isinstance(value[2], str) and 0 <= value[0] < 2**63  # a submission time (NaN fails too)
            # A job id: what JSON can carry beyond that (a lone surrogate, a NUL) reached the
            # database and was INTERNAL (UnicodeEncodeError on SQLite, DBAPIError on PostgreSQL).
            and len(value[2]) <= 64 and value[2].isascii() and value[2].isprintable()):
        raise InvalidArgument("page_token", "not a job listing token")
    return float(value[0]), value[1], value[2]


def event_cursor(token: str, after_id: int) -> int:
    if not token:
        return after_id
    value = decode(token)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:  # an event id
        raise InvalidArgument("page_token", "not an event listing token")
    return value


def fill(items: Sequence[T], encode_one: Callable[[T], Any], full: bool) -> tuple[list[Any], T | None]:
    """Encode items until the page's byte budget is spent.

    Returns the messages and the last item included when more remain (either the
    budget cut the page short, or the query returned a full page), else None."""
    out: list[Any] = []
    used = 0
    for i, item in enumerate(items):
        msg = encode_one(item)
        used += msg.ByteSize()
        if out and used > PAGE_BYTES:
            return out, items[i - 1]
        out.append(msg)
    return out, (items[-1] if full and items else None)
