"""argparse types for numbers of seconds (or days): a finite number in range, else
argparse's one-line usage error naming the flag, exit 2 (`nan`, `inf` and `-1` are
refused, not taken as "never" or "at once")."""

from __future__ import annotations

import argparse
import math
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
non_negative_seconds = _number("seconds", positive=False)
non_negative_days = _number("days", positive=False)
