"""argparse types for numbers of seconds (or days): a finite number in range, else
argparse's one-line usage error naming the flag, exit 2 (`nan`, `inf` and `-1` are
refused, not taken as "never" or "at once")."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import time
from collections.abc import Callable


def _number(unit: str, positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of {unit}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"must be {'more than 0' if positive else '0 or more'} {unit} (a finite number), got {text!r}")
        return value

    parse.__name__ = f"{'positive' if positive else 'non-negative'} {unit}"  # argparse names the type
    return parse


positive_seconds = _number("seconds", positive=True)


def at_least_seconds(low: float, why: str, zero_ok: bool = False) -> Callable[[str], float]:
    """A positive number of seconds no smaller than ``low`` (``why``: what smaller ones do);
    ``zero_ok``: 0 too (the flag's "never")."""
    return _at_least("seconds", low, f"{low:g} seconds", why, zero_ok)


def _at_least(unit: str, low: float, shown: str, why: str, zero_ok: bool) -> Callable[[str], float]:
    """A number of ``unit`` no smaller than ``low`` (said as ``shown``)."""
    def parse(text: str) -> float:
        value = _number(unit, positive=not zero_ok)(text)
        if value < low and not (zero_ok and value == 0):
            raise argparse.ArgumentTypeError(f"must be {'0 or ' if zero_ok else ''}at least {shown} "
                                             f"(shorter: {why}), got {text!r}")
        return value

    parse.__name__ = unit
    return parse


non_negative_seconds = _number("seconds", positive=False)
non_negative_days = _number("days", positive=False)
# `gandiva scheduler --event-retention-days`: its prune runs hourly, so a shorter time keeps
# nothing longer (1e-9 was taken and deleted every finished job's events, and every event of
# the cluster's own, at the first prune after it ended).
retention_days = _at_least("days", 1 / 24, "1 hour (0.042 days)",
                           "the hourly prune would delete a job's events as soon as it ends", zero_ok=True)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# ASCII digits as the examples show them: float() also takes other scripts' digits
# ("\u0665" is 5), "1_000", "+5" and blanks around the number.
_DURATION = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?[smhd]?", re.ASCII | re.IGNORECASE)


def duration(text: str) -> float:
    """A length of time: seconds, or a number with s, m, h or d (90, 90s, 30m, 1.5h, 2d)."""
    number, unit = (text[:-1], text[-1]) if text[-1:].lower() in _UNITS else (text, "s")
    if not _DURATION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a length of time such as 90s, 30m, 1h or 2d, got {text!r}")
    value = float(number) * _UNITS[unit.lower()]
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 (a finite length of time such as 1h), got {text!r}")
    return value


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?)?"
                   r"(Z|[+-][0-9]{2}:?[0-9]{2})?", re.ASCII)


_TIME_OF_DAY = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?", re.ASCII)
# Any time before 1970 is this one (one second before it), which every command that takes a
# time refuses or reads as "from the start": `--at 1e308s` (-1e308) and `--until 0001-01-01`
# broke the messages that print the time (OverflowError: timestamp out of range) or were
# argparse's "invalid point_in_time value".
BEFORE_1970 = -1.0


def point_in_time(text: str) -> float:
    """A time, as unix seconds: how long ago (a DURATION: 90s, 30m, 12h, 7d), a time of day
    (03:12, 03:12:30: the latest at or before now, today's or yesterday's), or a date with an
    optional time of day, by this machine's clock unless it names its zone (2026-11-30,
    2026-11-30T08:00, '2026-11-30 08:00:00', 2026-11-30T08:00Z, 2026-11-30T08:00+01:00)."""
    if _DURATION.fullmatch(text):
        return max(BEFORE_1970, time.time() - duration(text))
    clock = _TIME_OF_DAY.fullmatch(text)
    if clock:
        hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise argparse.ArgumentTypeError(f"not a time of day: {text!r} (00:00 to 23:59:59)")
        now = dt.datetime.now()
        when = now.replace(hour=hour, minute=minute, second=second, microsecond=0)
        return (when if when <= now else when - dt.timedelta(days=1)).timestamp()
    if not _DATE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected how long ago (90s, 30m, 12h, 7d), a time of day (03:12, the latest one) or a date "
            f"with an optional time (2026-11-30, 2026-11-30T08:00), by this machine's clock; got {text!r}")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:  # a month 13, a 30th of February
        raise argparse.ArgumentTypeError(f"not a date and time: {text!r} ({e})") from None
    try:
        return max(BEFORE_1970, when.timestamp())  # a naive time is local, as `get events` prints times
    except (ValueError, OverflowError):  # 0001-01-01 local: "year 0 is out of range"
        return BEFORE_1970


_WHOLE = re.compile(r"[0-9]{1,3}(,[0-9]{3})+|[0-9]+(_[0-9]+)*", re.ASCII)


def _whole(text: str) -> int | None:
    """A whole number in ASCII digits (1,000 and 1_000 as people write them), else None."""
    return int(text.replace(",", "")) if _WHOLE.fullmatch(text) else None


def mini_batches(text: str) -> int:
    """A job's total mini-batches: a whole number from 1 (ASCII digits; 1,000 and 1_000
    as people write them)."""
    value = _whole(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of mini-batches, 1 or more, got {text!r}")
    return value


def whole_number(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """A flag's whole number from ``low`` to ``high`` (ASCII digits); else an error saying
    the range (and ``why``, where the bound needs a reason)."""
    def parse(text: str) -> int:
        value = _whole(text)
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high:,}{why}, got {text!r}")
        return value
    return parse


def db_flag_on_actions(actions: argparse._SubParsersAction, help_text: str) -> None:
    """The command's --db also after each of its actions: `gandiva db current --db URL` (as
    `gandiva scheduler --db URL` reads) was "unrecognized arguments: --db", with the top-level
    usage. Given before the action, the command's own --db keeps it."""
    for parser in actions.choices.values():
        parser.add_argument("--db", default=argparse.SUPPRESS, help=help_text)
