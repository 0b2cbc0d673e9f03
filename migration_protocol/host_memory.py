"""Host memory, as the helpers report it and the scheduler budgets it.

A suspended job keeps its process (with its GPU state copied out) in its server's host
memory, and so does every running one; the policy bounds time-slicing per server by it
(scheduler/policy: ``ServerView.host_memory_bytes``, ``JobProfile.host_memory_bytes``).
Each helper reports the host memory its jobs may use (``server_host_memory``) and the
resident set of each job's processes (``resident_bytes``); sizes given on either side's
command line (``gandiva helper --host-memory``, ``gandiva scheduler --policy-option
job_host_memory_bytes=...``) are read by ``parse_size``. Linux only (/proc, cgroup v2);
elsewhere a server reports 0 (unknown: not checked).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``64GiB``, ``512MiB``, ``1.5G``, ``4096`` (bytes) -> bytes. Units are binary (K, M,
    G, T with or without B / iB all mean powers of 1024). A ValueError saying what is
    wrong and what is accepted otherwise."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: give bytes (e.g. 68719476736) or a number "
                         "with a unit K, M, G or T (binary: 64GiB, 512MiB, 1.5G)")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value >= 1 << 62:
        raise ValueError(f"{text!r} is too large for a size")
    return int(value)


def format_size(n: float) -> str:
    """Bytes as ``12.3 GiB`` / ``512.0 MiB`` / ``900 B``, for people."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def mem_total(root: Path = Path("/")) -> int:
    """The machine's MemTotal from /proc/meminfo, in bytes (0 when it cannot be read)."""
    try:
        text = (root / "proc/meminfo").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            try:
                return int(fields[1]) * (1024 if fields[2:3] in ([], ["kB"]) else 1)
            except (IndexError, ValueError):
                return 0
    return 0


def cgroup_limit(root: Path = Path("/"), pid: str = "self") -> int:
    """The lowest cgroup v2 ``memory.max`` on the path of ``pid``'s cgroup, from it up to
    the hierarchy's root (a parent's limit binds its children too); 0 when there is none
    (``max`` everywhere, no cgroup v2, or not readable)."""
    try:
        lines = (root / f"proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return 0
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return 0  # cgroup v1 only
    base = root / "sys/fs/cgroup"
    limits = []
    parts = [p for p in path.strip().split("/") if p]
    for depth in range(len(parts), -1, -1):
        try:
            raw = (base.joinpath(*parts[:depth]) / "memory.max").read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            limits.append(int(raw))
    return min(limits) if limits else 0


def server_host_memory(root: Path = Path("/")) -> int:
    """The host memory this process's jobs may use: the machine's MemTotal, or the
    memory.max of its cgroup (or a parent's) when lower; 0 when unknown."""
    total, limit = mem_total(root), cgroup_limit(root)
    return min(total, limit) if total and limit else total or limit


def process_rss(pid: int, root: Path = Path("/")) -> int:
    """The resident set (VmRSS) of process ``pid`` in bytes; 0 when it has none (a
    zombie or a kernel thread) or is gone. A stopped (SIGSTOP) process keeps its
    resident set: it is counted as any other."""
    try:
        text = (root / f"proc/{pid}/status").read_text()
    except (OSError, ValueError):  # gone meanwhile, or not ours to read
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return 0
    return 0


def resident_bytes(pids: Iterable[int], root: Path = Path("/")) -> int:
    """The resident sets of ``pids`` together (a page shared by several of them, e.g. a
    forked worker's, is counted in each, as ``ps`` counts it: an upper bound)."""
    return sum(process_rss(pid, root) for pid in set(pids))
