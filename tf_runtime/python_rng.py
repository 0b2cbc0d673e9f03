"""Random numbers a program draws in every step from Python's global generators.

A program that samples its mini-batches or its noise with `np.random.uniform(...)`,
`np.random.randint(...)` or `random.random()` in every step, never reseeding, draws the
numbers of step k+1 from where step k left the generator. A restarted copy seeds (or not)
at its start and draws from there: other numbers, another result, though its loop resumes
from the global step. Such a program is not migratable.

The generators are compared between two looks (at some steps, and before a checkpoint or
a migration; see Watch): Mersenne Twister state is a
block of 624 words and a position in it. The same block at a later position means draws
from the same stream; another block that is the old one regenerated ("twisted") up to
`TWISTS` times means many draws from the same stream. Another block that is no twist of the
old one means the program reseeded (`np.random.seed(step)` in every step keeps it migratable),
and an unchanged state means no draws.

Generators the program owns are looked at too: a `np.random.RandomState`, a
`np.random.Generator` (`np.random.default_rng(0)`) or a `random.Random` held in a variable
of the program's frames that called `Session.run` (its module's globals, a function's
locals, an attribute of an object there such as `self.rng`). The same object drawn on
between two steps is one stream; a new one made every step (`RandomState(step)`) is not
the same object. A `Generator` cannot be reseeded in place, so any change of its state is
a draw.
"""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Callable
from typing import Any

import numpy as np

TWISTS = 256  # regenerations of the state searched between two steps: ~160,000 words
_WORDS = 624


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


def _mt_numpy(rs: Any) -> Any:
    legacy: Any = rs.get_state()  # ('MT19937', keys, pos, has_gauss, cached)
    return (legacy[1].copy(), int(legacy[2]))


def _mt_python(r: Any) -> Any:
    return r.getstate()[1]


def _generator(g: Any) -> Any:
    return repr(g.bit_generator.state)


def _numpy_continues(a: Any, b: Any) -> bool:
    (keys0, pos0), (keys1, pos1) = a, b
    if np.array_equal(keys0, keys1):
        return bool(pos0 != pos1)
    return _numpy_twist_of(keys0, keys1)


def _python_continues(a: Any, b: Any) -> bool:
    keys0, keys1 = a[:_WORDS], b[:_WORDS]
    if keys0 == keys1:
        return bool(a[_WORDS] != b[_WORDS])
    return _python_twist_of(keys0, keys1)


def _changed(a: Any, b: Any) -> bool:
    return bool(a != b)


# What to read of each kind of generator, and how to tell one stream drawn on.
_KINDS: list[tuple[type, str, Callable[[Any], Any], Callable[[Any, Any], bool]]] = [
    (np.random.RandomState, "np.random.RandomState", _mt_numpy, _numpy_continues),
    (np.random.Generator, "np.random.Generator", _generator, _changed),
    (random.Random, "random.Random", _mt_python, _python_continues),
]
_GLOBAL = (np.random.mtrand._rand, getattr(random, "_inst", None))
_SKIP_MODULES = ("tf_runtime", "tensorflow", "keras", "numpy", "importlib", "runpy")
_PLAIN = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
          types.MethodType)
Snapshot = dict[str, tuple[Any, Callable[[Any, Any], bool], Any]]
# Calls of `np.random.seed` and `random.seed` so far (counted once count_seeds ran).
_SEEDS = {"numpy.random": 0, "random": 0}
_COUNTING: list[Any] = []  # the counting wrappers put in place


def count_seeds() -> None:
    """Count the program's calls of `np.random.seed(...)` and `random.seed(...)` (the
    module attributes, looked up at each call), so a reseed to the number the generator
    was seeded with before is told from draws at once (see Watch)."""
    for label, module in (("numpy.random", np.random), ("random", random)):
        seed = module.seed
        if seed in _COUNTING:
            continue

        def counting(*args: Any, _label: str = label, _seed: Any = seed, **kwargs: Any) -> Any:
            _SEEDS[_label] += 1
            return _seed(*args, **kwargs)

        functools.update_wrapper(counting, seed)
        _COUNTING.append(counting)
        setattr(module, "seed", counting)  # noqa: B010 (mypy: a module of the tuple)


def snapshot(frame: Any = None) -> Snapshot:
    """The state of numpy's global generator, of Python's `random` module and, given the
    innermost frame to look from, of the generators the program's frames hold."""
    out: Snapshot = {
        "numpy.random": (_GLOBAL[0], _numpy_continues, _mt_numpy(np.random.mtrand._rand)),
        "random": (_GLOBAL[1], _python_continues, random.getstate()[1]),
    }
    for label, obj in owned(frame).items():
        for cls, name, read, continues in _KINDS:
            if isinstance(obj, cls):
                out[f"the {name} in {label}"] = (obj, continues, read(obj))
                break
    return out


def owned(frame: Any, limit: int = 64) -> dict[str, Any]:
    """Generators held by the program's frames from `frame` outwards: label -> object."""
    found: dict[str, Any] = {}
    seen: set[int] = {id(g) for g in _GLOBAL}
    kinds = tuple(k[0] for k in _KINDS)

    def visit(label: str, value: Any, depth: int) -> None:
        if isinstance(value, kinds):
            if id(value) not in seen:
                seen.add(id(value))
                found[label] = value
        elif depth and not isinstance(value, _PLAIN) and \
                not type(value).__module__.startswith(_SKIP_MODULES + ("builtins",)):
            attrs = getattr(value, "__dict__", None)
            if isinstance(attrs, dict):
                for key, inner in list(attrs.items())[:limit]:
                    visit(f"{label}.{key}", inner, depth - 1)

    depth = 0
    while frame is not None and depth < limit:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(_SKIP_MODULES):
            # A module's code: its globals; a function's: its locals.
            for key, value in list(frame.f_locals.items())[:4 * limit]:
                visit(key, value, 1)
        frame, depth = frame.f_back, depth + 1
    return found


def describe(label: str) -> str:
    """A generator `continued` names, as a person would say it."""
    return {"numpy.random": "numpy's global generator (np.random.uniform(...) and the like)",
            "random": "Python's global generator (random.random(...) and the like)"}.get(
                label, label)


def continued(before: Snapshot, after: Snapshot) -> str:
    """The generator that drew from one stream between the two snapshots, never
    reseeded (`numpy.random`, `random`, or the program's own, named); "" for none."""
    for label, (obj, continues, state) in before.items():
        now = after.get(label)
        if now is not None and now[0] is obj and continues(state, now[2]):
            return label
    return ""


def _fresh(a: Any) -> bool:
    """Whether a Mersenne Twister reading is of a generator just seeded, not drawn on since
    (or one that drew exactly to the end of its block: the same reading)."""
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], np.ndarray):
        return a[1] == _WORDS  # numpy
    return isinstance(a, tuple) and len(a) == _WORDS + 1 and a[_WORDS] == _WORDS  # random


def _same(a: Any, b: Any) -> bool:
    """Whether two readings of one generator are the same state (no draw, no reseed)."""
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], np.ndarray):
        return bool(np.array_equal(a[0], b[0]) and a[1] == b[1])
    return bool(a == b)


class Watch:
    """Compares the generators at steps 1, 2 and 3 (the verdict's steps), then at two
    consecutive steps in every `every` steps, so a program that starts drawing after a
    warm-up is seen too, at a cost amortised to well under a microsecond a step; and at
    any `look` (a checkpoint or a migration about to be taken). Each look is compared with
    the one before, however many steps apart: a program that draws only at some steps
    (the MNIST tutorial's reader shuffles its examples with `np.random.shuffle` once per
    epoch) continues the stream between two looks too. Before, only consecutive steps were
    compared, so such a program was judged migratable and a migrated copy, its generator
    seeded anew, shuffled its next epochs otherwise. A generator that two consecutive
    steps found reseeded (`np.random.seed(step)` every step) is not searched across a gap:
    telling its reseeds from draws there costs ~10 ms, and it reseeds anyway.

    A generator just seeded at one step and found drawn on from there at the next either
    drew from that seed, or was seeded with the same number again and drew as much: a
    program that seeds `np.random.seed(7)` at its start and then `np.random.seed(step)` in
    every step, restored at step 7 (or started at step 0 after `np.random.seed(0)`). Before,
    that was taken for a stream and the job refused as not migratable, depending on the step
    a migration restored it at. Now such a pair is left open: the next look tells (another
    state: reseeded; drawn on again, or not at all, from there: a stream, as before); a
    checkpoint or migration asked for before any next step is refused, as it cannot tell.
    Unless the program called `np.random.seed` / `random.seed` since the look before (counted,
    count_seeds): then it reseeded, told at once (a migration right after the first step of a
    job started at step 0 after `np.random.seed(0)` used to be refused); the open pair stays
    for a seed the count misses (`from numpy.random import seed` bound before the shim)."""

    def __init__(self, first: int = 3, every: int = 128) -> None:
        self.first, self.every = first, every
        count_seeds()
        self._last: tuple[int, Snapshot, dict[str, int]] | None = None
        self._reseeding: set[str] = set()
        self._open: set[str] = set()  # seeded, then drawn on as much as after a reseed

    def step(self, n: int, frame: Any = None) -> str:
        """At the end of step `n` (1, 2, ...), `frame` the innermost frame to look for the
        program's own generators from: the generator found drawing, or ""."""
        if n > self.first and (not self.every or n % self.every not in (0, 1)):
            return ""
        return self.look(n, frame, now=False)

    def look(self, n: int, frame: Any = None, now: bool = True) -> str:
        """Compare the generators now (at step `n`) with the last look (`now`: a
        checkpoint or migration is asked for, which cannot wait for a next look)."""
        state_now, seeds_now = snapshot(frame), dict(_SEEDS)
        last, self._last = self._last, (n, state_now, seeds_now)
        if last is None:
            return ""
        consecutive = last[0] == n - 1
        for label, (obj, continues, state) in last[1].items():
            after = state_now.get(label)
            if after is None or after[0] is not obj or (
                    not consecutive and label in self._reseeding):
                continue
            seeded = label in seeds_now and seeds_now[label] != last[2][label]
            if continues(state, after[2]) and not (seeded and _fresh(state)):
                if now or not consecutive or not _fresh(state) or label in self._open:
                    return label
                self._open.add(label)  # drawn on, or seeded alike again: the next look tells
            elif not _same(state, after[2]):
                self._open.discard(label)  # reseeded
                if consecutive:
                    self._reseeding.add(label)
            elif label in self._open:
                # No draw since: drawn on once after its seed (refused, as a draw once
                # after the initialiser is), or no step since (a migration: cannot tell).
                return label
        return ""
