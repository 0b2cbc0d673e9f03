"""Values a run returned that the program keeps in Python under a second name: the best
validation loss of early stopping (`vl = sess.run(loss, val); if vl < best: best, bad = vl,
0`), the best loss of a learning rate halved on a plateau (`if value < best: best = value`).
That state is in no checkpoint: a restarted copy starts it over (`best = inf`, the count at
0), compares its next value with nothing, and stops, or halves its rate, at another step
than an uninterrupted run, with other weights (probed, s44: early stopping cut at step 237).
No cut is safe once such a value is kept: after any cut, the copy's next comparison differs
from the uninterrupted run's whenever that value does not improve on the kept one. A value
kept only to choose when to save the program's own best checkpoint is no different: the
copy's first evaluation beats its fresh `best` and overwrites that checkpoint with a worse
model than the one an uninterrupted run keeps.

A run returns fresh NumPy scalars, so the program holds one of them under two names only
by assigning it on. Seen (right before the program's next run, in the program's frames):
- two names of the object itself (`best = vl`), in one frame or in two;
- a name of a copy converted to a Python float, as is or rounded (`best = float(vl)`,
  `vl.item()`, `round(vl, 4)`), for a value that is not a short binary fraction (0.5 or an
  accuracy of 7/8 may be a constant of the program's own), a rounded one only with 3
  significant digits or more (0.9 or 0.001 may be the program's momentum or rate);
- an attribute of an object of the program's own classes (`self.best = vl`), one level;
- for an evaluation's value (a run that does not train), the last item of a list or deque
  or a value of a small dict (`history.append(vl)`, `stats["best"] = vl`), also inside
  such an attribute. A training run's loss appended to a list is left alone: logging
  (a running mean of the last losses) is what that mostly is.
Not seen: a value changed by arithmetic (`best = vl * 1.0`), kept deeper in objects, in a
container of a training run's values, or rounded to 1-2 significant digits (known limits);
a constant of 3 digits or more (`beta2 = 0.999`) equal to a value rounded is still taken
for a copy of it."""

from __future__ import annotations

import collections
import sys
import sysconfig
import types
import weakref
from typing import Any

import numpy as np

from .python_rng import _SKIP_MODULES

# Code installed with Python or into its environment (a test runner, absl, a launcher's
# library) is not the program's: its frames may hold the program's values on the way.
_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                        "platlib")})
_LARGEST = 64  # objects' and dicts' items looked at; larger ones are not such state
# Weakly: a program making a class per step (`namedtuple` in its batch function) kept every
# one alive here (10,000 classes after 10,000 looks).
_PROGRAM_TYPES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
_ABSENT = object()  # not None: `values.get(id(None)) is None` would match every None
# Types that hold no kept value inside them (looked at as themselves only).
_PLAIN = frozenset({float, int, bool, str, bytes, type(None), type, types.ModuleType,
                    types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                    np.float32, np.float64, np.int32, np.int64, np.ndarray})
_FLOATS = frozenset({np.float16, np.float32, np.float64})


def _program_frame(frame: Any) -> bool:
    return not (str(frame.f_globals.get("__name__", "")).startswith(_SKIP_MODULES)
                or frame.f_code.co_filename.startswith(_INSTALLED))


def _program_type(kind: type) -> bool:
    """Whether instances of `kind` are of a class the program defined (a trainer)."""
    known = _PROGRAM_TYPES.get(kind)
    if known is None:
        name = getattr(kind, "__module__", "") or ""
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) or ""
        known = bool(path) and not (name.startswith(_SKIP_MODULES) or path.startswith(_INSTALLED))
        _PROGRAM_TYPES[kind] = known
    return known


class _Match:
    """Which kept value (its id) an object the program holds is: the value itself, or a
    Python float (or NumPy float) it was converted to, as is or rounded to 3-8 places."""

    __slots__ = ("high", "low", "plain", "rounded", "values")

    def __init__(self, values: dict[int, Any]) -> None:
        self.values = values
        self.plain: dict[float, int] = {}
        for key, value in values.items():
            if isinstance(value, np.floating) and np.isfinite(value) and not _short(float(value)):
                self.plain[float(value)] = key
        self.rounded: dict[float, int] | None = None  # made when first needed
        # Rounded to 3 places or more, a value is within 5e-4 of one of them.
        self.low = min(self.plain, default=0.0) - 6e-4
        self.high = max(self.plain, default=0.0) + 6e-4

    def find(self, held: Any) -> int | None:
        if self.values.get(id(held), _ABSENT) is held:
            return id(held)
        if not self.plain or not (type(held) is float or isinstance(held, np.floating)):
            return None
        f = float(held)
        found = self.plain.get(f)
        if found is not None or not self.low < f < self.high or _short(f):
            return found
        if self.rounded is None:
            self.rounded = {}
            for p, key in self.plain.items():
                value = self.values[key]
                for n in range(3, 9):
                    self.rounded.setdefault(round(p, n), key)
                    self.rounded.setdefault(float(np.round(value, n)), key)
        found = self.rounded.get(f)
        # One or two significant digits (0.9, 0.1, 0.001) are far likelier the program's own
        # momentum, rate or decay than a rounded copy: a training loop's metric of 0.9003,
        # rounded to 3 places, was taken for `momentum = 0.9` kept, and the job refused.
        return None if found is None or _few_digits(f) else found


def _few_digits(f: float) -> bool:
    """One or two significant digits (0.9, 0.01, 5e-4), as a double or a float32."""
    return abs(float(f"{f:.2g}") - f) <= abs(f) * 1e-6


def _short(f: float) -> bool:
    """A short binary fraction (0, 0.5, 7/8): maybe a constant of the program's own."""
    return (f * 1024).is_integer()


def _inside(key: str, value: Any, containers: bool, seen: set[int],
            match: _Match, older: dict[int, Any] | None = None) -> list[tuple[str, int]]:
    """Kept values an object a name holds holds (looked at once per object), named: the
    last item of a list, the values of a small dict, the attributes of an object of the
    program's own classes (and the last item of a list among them). ``older``: when
    given, only a list or dict in it (held while the run was in flight) is looked into."""
    kind, found = type(value), list[tuple[str, int]]()
    if containers and older is not None and older.get(id(value), _ABSENT) is not value:
        return found  # made since the run (a row, a dict or an object of results to log): not kept
    if containers and kind in (list, collections.deque):
        if value:
            seen.add(id(value))
            if (at := match.find(value[-1])) is not None:
                found.append((f"{key}[-1]", at))
    elif containers and kind is dict:
        if 0 < len(value) <= _LARGEST:
            seen.add(id(value))
            found += [(f"{key}[{k!r}]", at) for k, v in list(value.items())
                      if (at := match.find(v)) is not None]
    elif _PROGRAM_TYPES.get(kind, True) and _program_type(kind):
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and len(attrs) <= _LARGEST:
            seen.add(id(value))
            for attr, v in list(attrs.items()):
                if (at := match.find(v)) is not None:
                    found.append((f"{key}.{attr}", at))
                elif containers and type(v) in (list, collections.deque) and v \
                        and id(v) not in seen and (older is None or older.get(id(v), _ABSENT) is v):
                    seen.add(id(v))
                    if (at := match.find(v[-1])) is not None:
                        found.append((f"{key}.{attr}[-1]", at))
    return found


def containers_held(frame: Any, limit: int = 16) -> dict[int, Any]:
    """The lists, deques, dicts and objects of its own classes the program's frames hold,
    and the lists in those objects' attributes (id -> the object): taken while a run is in
    flight, so that one the program makes afterwards to log the run's values (`results =
    {"val_loss": vl}`, `row = [step, vl]`, `Result(vl)`) is told from one it keeps them in."""
    held: dict[int, Any] = {}
    depth = 0
    while frame is not None and depth < limit:
        if _program_frame(frame):
            for value in list(frame.f_locals.values()):
                _hold(value, held)
        frame, depth = frame.f_back, depth + 1
    return held


def _hold(value: Any, held: dict[int, Any]) -> None:
    """Adds ``value`` to ``held`` if it is a container ``containers_held`` takes."""
    kind = type(value)
    if kind in (list, collections.deque, dict):
        held[id(value)] = value
    elif kind not in _PLAIN and _PROGRAM_TYPES.get(kind, True) and _program_type(kind):
        held[id(value)] = value
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and len(attrs) <= _LARGEST:
            held.update((id(v), v) for v in list(attrs.values()) if type(v) in (list, collections.deque))


def second_name(frame: Any, values: dict[int, Any], limit: int = 16,
                containers: bool = False, older: dict[int, Any] | None = None,
                held: dict[int, Any] | None = None) -> tuple[str, str] | None:
    """Two names under which the program's frames, from `frame` outwards, hold one of
    `values` (id -> value), as is or converted (see the module's docstring), or None.
    `containers`: the values are an evaluation's; look into lists and dicts too, only
    those in `older` when given (``containers_held`` while the run was in flight).
    `held`: filled as ``containers_held`` would fill it, in the same walk (complete only
    where None is returned: a second name ends the walk)."""
    names: dict[int, str] = {}
    match = _Match(values)
    seen: set[int] = set()
    depth = 0
    while frame is not None and depth < limit:
        if _program_frame(frame):
            for key, value in list(frame.f_locals.items()):
                if held is not None:
                    _hold(value, held)
                kind = type(value)
                if values.get(id(value), _ABSENT) is value:
                    found: int | None = id(value)
                elif match.plain and (kind is float or kind in _FLOATS):
                    found = match.find(value)
                else:
                    found = None
                named: list[tuple[str, int]] = [(key, found)] if found is not None else []
                if kind not in _PLAIN and id(value) not in seen:
                    named += _inside(key, value, containers, seen, match, older)
                for name, found in named:
                    if found in names:  # a second name (in this frame or an outer one)
                        return names[found], name
                    names[found] = name
        frame, depth = frame.f_back, depth + 1
    return None
