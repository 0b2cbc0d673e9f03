"""Values a run returned that the program keeps in Python under a second name: the best
validation loss of early stopping (`vl = sess.run(loss, val); if vl < best: best, bad = vl,
0`), the best loss of a learning rate halved on a plateau (`if value < best: best = value`).
That state is in no checkpoint: a restarted copy starts it over (`best = inf`, the count at
0), compares its next value with nothing, and stops, or halves its rate, at another step
than an uninterrupted run, with other weights (probed, s44: early stopping cut at step 237).
No cut is safe once such a value is kept: after any cut, the copy's next comparison differs
from the uninterrupted run's whenever that value does not improve on the kept one.

A run returns fresh NumPy scalars, so the program holds one of them under two names (two
locals, in one frame or in two of its frames) only by assigning it on: `best = vl`. A
value kept after a conversion (`best = float(vl)`) or in an object's attribute is not seen
(a known limit). Looked at once, right before the program's next run."""

from __future__ import annotations

import sysconfig
from typing import Any

from .python_rng import _SKIP_MODULES

# Code installed with Python or into its environment (a test runner, absl, a launcher's
# library) is not the program's: its frames may hold the program's values on the way.
_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                        "platlib")})


def _program_frame(frame: Any) -> bool:
    return not (str(frame.f_globals.get("__name__", "")).startswith(_SKIP_MODULES)
                or frame.f_code.co_filename.startswith(_INSTALLED))


def second_name(frame: Any, values: dict[int, Any], limit: int = 16) -> tuple[str, str] | None:
    """Two names under which the program's frames, from `frame` outwards, hold one of
    `values` (id -> value), or None."""
    names: dict[int, str] = {}
    depth = 0
    while frame is not None and depth < limit:
        if _program_frame(frame):
            for key, value in list(frame.f_locals.items()):
                if id(value) in values and values[id(value)] is value:
                    if id(value) in names:  # a second name (in this frame or an outer one)
                        return names[id(value)], key
                    names[id(value)] = key
        frame, depth = frame.f_back, depth + 1
    return None
