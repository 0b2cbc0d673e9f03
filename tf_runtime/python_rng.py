"""Random numbers a program draws in every step from Python's global generators.

A program that samples its mini-batches or its noise with `np.random.uniform(...)`,
`np.random.randint(...)` or `random.random()` in every step, never reseeding, draws the
numbers of step k+1 from where step k left the generator. A restarted copy seeds (or not)
at its start and draws from there: other numbers, another result, though its loop resumes
from the global step. Such a program is not migratable.

The generators are looked at between two consecutive steps: Mersenne Twister state is a
block of 624 words and a position in it. The same block at a later position means draws
from the same stream; another block that is the old one regenerated ("twisted") up to
`TWISTS` times means many draws from the same stream. Another block that is no twist of the
old one means the program reseeded (`np.random.seed(step)` in every step keeps it migratable),
and an unchanged state means no draws.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

TWISTS = 256  # regenerations of the state searched between two steps: ~160,000 words
_WORDS = 624


def snapshot() -> tuple[Any, Any]:
    """The state of numpy's global generator and of Python's `random` module."""
    legacy: Any = np.random.get_state()  # ('MT19937', keys, pos, has_gauss, cached)
    return ((legacy[1].copy(), int(legacy[2])), random.getstate()[1])


def _temper(keys: Any) -> Any:
    """Mersenne Twister's output for each word of a state block (its tempering)."""
    y = keys.astype(np.uint32)
    y ^= y >> np.uint32(11)
    y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
    y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
    y ^= y >> np.uint32(18)
    return y


def _numpy_twist_of(keys: Any, target: Any) -> bool:
    """Whether block `target` is block `keys` regenerated 1 to TWISTS times: the 624 words
    drawn after each regeneration are the regenerated block, tempered."""
    rs = np.random.RandomState()
    start: Any = ("MT19937", keys, _WORDS)
    rs.set_state(start)
    want = _temper(target)
    for _ in range(TWISTS):
        if np.array_equal(rs.randint(0, 2**32, size=_WORDS, dtype=np.uint32), want):
            return True
    return False


def _python_twist_of(keys: tuple[int, ...], target: tuple[int, ...]) -> bool:
    r = random.Random()
    r.setstate((3, (*keys, _WORDS), None))
    for _ in range(TWISTS):
        r.getrandbits(32 * _WORDS)  # from position 624: one regeneration, then its block
        if r.getstate()[1][:_WORDS] == target:
            return True
    return False


def continued(before: tuple[Any, Any], after: tuple[Any, Any]) -> str:
    """Which global generator (`numpy.random`, `random`) drew from one stream between the
    two snapshots, never reseeded; "" for neither."""
    (np_keys0, np_pos0), py0 = before
    (np_keys1, np_pos1), py1 = after
    if np.array_equal(np_keys0, np_keys1):
        if np_pos0 != np_pos1:
            return "numpy.random"
    elif _numpy_twist_of(np_keys0, np_keys1):
        return "numpy.random"
    keys0, keys1 = py0[:_WORDS], py1[:_WORDS]
    if keys0 == keys1:
        if py0[_WORDS] != py1[_WORDS]:
            return "random"
    elif _python_twist_of(keys0, keys1):
        return "random"
    return ""


class Watch:
    """Compares the generators between consecutive steps: steps 1-2 and 2-3 (the verdict's
    steps), then one pair in every `every` steps, so a program that starts drawing after a
    warm-up is seen too, at a cost amortised to well under a microsecond a step."""

    def __init__(self, first: int = 3, every: int = 128) -> None:
        self.first, self.every = first, every
        self._last: tuple[int, tuple[Any, Any]] | None = None

    def step(self, n: int) -> str:
        """At the end of step `n` (1, 2, ...): the generator found drawing, or ""."""
        if n > self.first and n % self.every not in (0, 1):
            return ""
        now = snapshot()
        last, self._last = self._last, (n, now)
        if last is None or last[0] != n - 1:
            return ""
        return continued(last[1], now)
