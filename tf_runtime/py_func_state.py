"""Python state that a `py_func` / `numpy_function` in a training run keeps between steps.

`tf.numpy_function(aug, [x], ...)` runs `aug` in the program's Python at every step. When
`aug` changes something of its own on every call (a call counter in a dict it closes over, a
running mean in a global, an attribute of the object whose method it is), step k+1 computes
from what step k left there; a restarted copy starts that state over and trains on other
data, though it resumes from the global step. No checkpoint holds it.

`digest` summarises what such a function can keep: the contents of its closure cells, the
module globals its code names, and the object of a bound method, skipping modules, classes,
functions and other code. Two steps whose digests differ show the function changing its
state. Values are read, never called: arrays by their bytes, containers and objects'
`__dict__` to a small depth; anything else (a C object, a generator) is left out.
"""

from __future__ import annotations

import hashlib
import types
from typing import Any

import numpy as np

_DEPTH = 3
_MAX_ITEMS = 256
_MAX_ELEMENTS = 65536
_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
         types.MethodType, types.CodeType)


def _feed(h: Any, obj: Any, depth: int) -> None:
    if isinstance(obj, _SKIP):
        return
    if isinstance(obj, (bool, int, float, complex, str, bytes, type(None))):
        h.update(repr(obj).encode())
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            return
        h.update(f"{obj.dtype}{obj.shape}".encode())
        # A sample of a large array (a data set the function indexes), never a copy of all
        # of it: a state the function changes (a running mean) changes the sample too.
        sample = obj if obj.size <= _MAX_ELEMENTS else obj.flat[::obj.size // _MAX_ELEMENTS]
        h.update(np.ascontiguousarray(sample).tobytes())
    elif isinstance(obj, np.generic):
        h.update(repr(obj).encode())
    elif depth <= 0:
        return
    elif isinstance(obj, dict):
        h.update(b"{%d" % len(obj))
        for i, (k, v) in enumerate(obj.items()):
            if i >= _MAX_ITEMS:
                break
            h.update(repr(k).encode())
            _feed(h, v, depth - 1)
    elif isinstance(obj, (list, tuple)):
        h.update(b"[%d" % len(obj))
        for v in obj[:_MAX_ITEMS]:
            _feed(h, v, depth - 1)
    elif isinstance(obj, (set, frozenset)):
        h.update(b"(%d" % len(obj))
    elif isinstance(getattr(obj, "__dict__", None), dict):
        _feed(h, vars(obj), depth - 1)


def _function(registered: Any) -> Any:
    """The program's function behind a registered py_func (TensorFlow wraps it: an
    EagerFunc's `_func`, numpy_function's closure over `func`)."""
    for _ in range(4):
        inner = getattr(registered, "_func", None)
        if inner is None:
            code = getattr(registered, "__code__", None)
            cells = dict(zip(code.co_freevars, registered.__closure__ or ())) if code else {}
            cell = cells.get("func")
            inner = cell.cell_contents if cell is not None else None
            if not isinstance(inner, (types.FunctionType, types.MethodType)):
                break
        registered = inner
    return registered


def state_of(fn: Any) -> dict[str, Any]:
    """What `fn` can keep between calls, by name: closure cells, the globals its code
    names, `self` of a bound method."""
    out: dict[str, Any] = {}
    if isinstance(fn, types.MethodType):
        out["self"] = fn.__self__
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if code is None:
        return out
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    names = set(code.co_names)
    for const in code.co_consts:  # nested functions' and comprehensions' names
        if isinstance(const, types.CodeType):
            names.update(const.co_names)
    glob = getattr(fn, "__globals__", {})
    for name in sorted(names):
        if name in glob:
            out[name] = glob[name]
    return out


def digest(tokens: tuple[str, ...] | frozenset[str] | set[str]) -> dict[str, tuple[str, bytes]]:
    """For each py_func token: (the function's name, a digest of each thing it keeps)."""
    from tensorflow.python.ops import script_ops

    out: dict[str, tuple[str, bytes]] = {}
    for token in sorted(tokens):
        registered = script_ops._py_funcs.get(token)
        if registered is None:
            continue
        fn = _function(registered)
        for name, obj in state_of(fn).items():
            h = hashlib.blake2b(digest_size=16)
            _feed(h, obj, _DEPTH)
            label = getattr(fn, "__qualname__", None) or repr(fn)
            out[f"{token}:{name}"] = (f"{label} ({name})", h.digest())
    return out


def changed(before: dict[str, tuple[str, bytes]], after: dict[str, tuple[str, bytes]]) -> str:
    """The first kept thing whose digest differs between two looks, described, or ""."""
    for key, (label, d) in before.items():
        now = after.get(key)
        if now is not None and now[1] != d:
            return label
    return ""
