"""Errors told in one line (TensorFlow's run three dozen lines long)."""

from __future__ import annotations


def error_summary(exc: BaseException) -> str:
    """An error in a line. TensorFlow's "Graph execution error:" heads a traceback of where
    the failing node was defined, then "Node: 'name'", then what went wrong ("You must feed
    a value for placeholder tensor ..."): that node and that line."""
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.strip().startswith("[[")]
    if not lines:
        return type(exc).__name__
    nodes = [i for i, ln in enumerate(lines) if ln.startswith("Node:")]
    if nodes and nodes[-1] + 1 < len(lines):
        return f"{lines[nodes[-1] + 1]} ({lines[nodes[-1]]})"
    return lines[0]
