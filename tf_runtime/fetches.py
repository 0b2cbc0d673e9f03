"""Flattening run() fetches the way Session.run structures its results.

Session.run accepts a fetch or nested lists, tuples, namedtuples and dicts of
fetches, and returns results of the same structure. The shim flattens both the
same way to find the metrics a program fetched, and keys its per-signature
classification cache on the identities of the leaves (strings by value).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


def flatten(structure: Any) -> list[Any]:
    """Leaves in Session.run's order (dicts in iteration order, like its fetch mapper)."""
    out: list[Any] = []
    _flatten(structure, out)
    return out


def _flatten(x: Any, out: list[Any]) -> None:
    t = type(x)
    if t is list or t is tuple or (isinstance(x, tuple) and hasattr(x, "_fields")):
        for item in x:
            _flatten(item, out)
    elif isinstance(x, dict):
        for item in x.values():
            _flatten(item, out)
    else:
        out.append(x)


def fetch_key(fetches: Any) -> Hashable:
    """A cheap hashable key of a fetch structure (leaf identities, strings by value)."""
    t = type(fetches)
    if t is str:
        return fetches
    if t is list or t is tuple:
        return (t, tuple(x if type(x) is str else fetch_key(x)
                         if isinstance(x, (list, tuple, dict)) else id(x) for x in fetches))
    if isinstance(fetches, dict):
        return (dict, tuple((k, fetch_key(v)) for k, v in fetches.items()))
    if isinstance(fetches, tuple):
        return (t, tuple(fetch_key(v) for v in fetches))
    return id(fetches)
