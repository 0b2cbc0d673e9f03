"""Trace readers: each returns a list of JobSpec sorted by submit time.

Formats (``--format``, or detected from the first line):
- ``gavel7``   Gavel/Philly msr traces, tab separated, no header:
               job_type, command, num_steps_arg, needs_data_dir, total_steps,
               arrival_time_s, scale_factor
- ``gavel10``  Gavel physical-cluster traces, tab separated, no header:
               job_type, command, working_dir, num_steps_arg, needs_data_dir,
               total_steps, scale_factor, priority_weight, SLO, arrival_time_s
- ``tiresias`` CSV with header job_id,num_gpu,submit_time,iterations,model_name,duration,interval
- ``csv``      generic CSV: submit_time,num_gpus,duration[,model] (header optional)

A bad line raises TraceError naming the file and the line.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from scheduler.validation import MAX_GPUS

FORMATS = ("auto", "gavel7", "gavel10", "tiresias", "csv")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class JobSpec:
    """One job of a workload. Its length is ``total_steps``, or ``duration_s`` alone on
    ``num_gpus`` GPUs of one server (the simulator converts it to steps)."""

    id: str
    submit_time: float
    num_gpus: int
    model: str = ""
    total_steps: float | None = None
    duration_s: float | None = None
    priority: int = 1
    grow_shrink: bool = False
    multi_job: str | None = None


def _num(text: str, what: str, path: Path, line: int, kind: type = float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(path, line, f"{what} {text!r} is not a finite number")
    if kind is int:
        value = int(value)
    if value < 0:
        raise TraceError(path, line, f"{what} {text!r} is negative")
    return value


def _gpus(text: str, path: Path, line: int) -> int:
    n = int(_num(text, "GPU count", path, line, int))
    if n < 1:
        raise TraceError(path, line, f"GPU count {text!r} must be at least 1")
    if n > MAX_GPUS:
        raise TraceError(path, line, f"GPU count {text!r} is more than {MAX_GPUS}")
    return n


def _read_gavel(path: Path, rows: list[tuple[int, list[str]]], columns: int) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    for line, cols in rows:
        if len(cols) != columns:
            raise TraceError(path, line, f"expected {columns} tab-separated columns, got {len(cols)}")
        if columns == 7:
            steps, arrival, gpus = cols[4], cols[5], cols[6]
            priority = 1
        else:
            steps, gpus, arrival = cols[5], cols[6], cols[9]
            priority = max(1, int(_num(cols[7], "priority weight", path, line)))
        jobs.append(JobSpec(
            id=f"{path.stem}-{len(jobs)}", submit_time=_num(arrival, "arrival time", path, line),
            num_gpus=_gpus(gpus, path, line), model=cols[0],
            total_steps=_num(steps, "total steps", path, line), priority=priority,
        ))
    return jobs


def _read_csv(path: Path, rows: list[tuple[int, list[str]]], fmt: str) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    for line, cols in rows:
        if fmt == "tiresias":
            if len(cols) < 6:
                raise TraceError(path, line, f"expected 7 Tiresias columns, got {len(cols)}")
            jobs.append(JobSpec(
                id=f"{path.stem}-{cols[0]}", submit_time=_num(cols[2], "submit_time", path, line),
                num_gpus=_gpus(cols[1], path, line), model=cols[4],
                duration_s=_num(cols[5], "duration", path, line),
            ))
        else:
            if len(cols) not in (3, 4):
                raise TraceError(path, line, f"expected submit_time,num_gpus,duration[,model], "
                                             f"got {len(cols)} columns")
            duration = _num(cols[2], "duration", path, line)
            if duration <= 0:
                raise TraceError(path, line, f"duration {cols[2]!r} must be positive")
            jobs.append(JobSpec(
                id=f"{path.stem}-{len(jobs)}", submit_time=_num(cols[0], "submit_time", path, line),
                num_gpus=_gpus(cols[1], path, line), model=cols[3] if len(cols) == 4 else "",
                duration_s=duration,
            ))
    return jobs


def detect_format(first: str) -> str:
    if "\t" in first:
        n = len(first.rstrip("\n").split("\t"))
        return {7: "gavel7", 10: "gavel10"}.get(n, f"tab-separated with {n} columns")
    if first.startswith("job_id,num_gpu"):
        return "tiresias"
    return "csv"


def read_trace(path: str | Path, fmt: str = "auto") -> list[JobSpec]:
    """Read a trace file into JobSpecs sorted by submit time (stable)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, None, f"cannot read trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(path, None, f"not UTF-8 text (byte {exc.start})") from None
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    if not lines:
        raise TraceError(path, None, "trace is empty")
    if fmt == "auto":
        fmt = detect_format(lines[0][1])
        if fmt not in FORMATS:
            raise TraceError(path, lines[0][0], f"unrecognised trace layout ({fmt})")
    if fmt in ("gavel7", "gavel10"):
        rows = [(i, ln.rstrip("\n").split("\t")) for i, ln in lines]
        jobs = _read_gavel(path, rows, 7 if fmt == "gavel7" else 10)
    else:
        rows = [(i, [c.strip() for c in next(csv.reader([ln]))]) for i, ln in lines]
        if rows and not _is_number(rows[0][1][0]):
            rows = rows[1:]  # a header line
        jobs = _read_csv(path, rows, fmt)
    if not jobs:
        raise TraceError(path, None, "trace has no jobs")
    return sorted(jobs, key=lambda j: j.submit_time)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
