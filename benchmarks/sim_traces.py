"""What the simulator benchmarks share: where the evaluation traces are and which count,
and the ``FIELD[:VALUE]+...`` rule sets their ``--config``/``--ablate`` flags take.

The evaluation set (issue 11): every ITP trace (``itp/*.csv``, also gzip, bzip2 or xz
compressed) and every Gavel Philly msr trace (``gavel/traces/msr/seed=*/*.trace``, seed 0
first) with at least ``min_jobs`` jobs. A trace is named by its file's stem (``cluster04``,
``e13805``), a Gavel trace of another seed folder by its stem and seed (``e13805-seed1``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from scheduler.policy import PolicyConfig
from scheduler.sim.model import gavel_table_near
from scheduler.sim.trace import GAVEL as GAVEL_FORMATS
from scheduler.sim.trace import JobSpec, TraceError, read_trace_as

# ../shared/traces next to the repository (never committed).
TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
GAVEL = TRACES / "gavel"


def _jobs_in(path: Path) -> int:
    with path.open() as f:
        return sum(1 for line in f if line.strip())


def gavel_traces(folder: Path, min_jobs: int) -> list[Path]:
    """The Gavel traces in ``folder`` (one job a line) with at least ``min_jobs`` jobs, by name."""
    return [p for p in sorted(folder.glob("*.trace")) if _jobs_in(p) >= min_jobs]


COMPRESSED = (".gz", ".bz2", ".xz")  # what the trace reader decompresses as it reads


def _seed(folder: Path) -> tuple[int, str]:
    number = folder.name.partition("=")[2]
    return (int(number), "") if number.isdigit() else (1 << 62, folder.name)


def trace_files(root: Path, min_jobs: int) -> list[Path]:
    """Every ITP trace under ``root`` (``itp/*.csv``, compressed or not), then every Gavel msr
    trace with at least ``min_jobs`` jobs, seed folder by seed folder (seed 0 first)."""
    itp = sorted(p for p in (root / "itp").glob("*.csv*")
                 if p.is_file() and (p.suffix == ".csv" or (p.suffix in COMPRESSED and p.stem.endswith(".csv"))))
    msr = root / "gavel" / "traces" / "msr"
    seeds = sorted((d for d in msr.glob("seed=*") if d.is_dir()), key=_seed)
    return itp + [p for folder in seeds for p in gavel_traces(folder, min_jobs)]


def trace_name(path: Path) -> str:
    """The name a trace goes by in the tables, --only and --json: its file's stem without a
    compression suffix (``cluster04.csv.gz``: ``cluster04``); a Gavel trace of a seed folder
    other than ``seed=0`` gets the seed too (``seed=1/e13805.trace``: ``e13805-seed1``), as
    every seed folder holds the same file names."""
    name = path.name
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    name = name.rpartition(".")[0] or name
    folder = path.parent.name
    if folder.startswith("seed=") and folder != "seed=0":
        name += "-seed" + folder.partition("=")[2]
    return name


def gavel_table_for(path: Path, fmt: str, fallback: Path) -> Path | None:
    """The Gavel throughput table that times a trace read as `fmt`: for a Gavel-format trace
    the ``simulation_throughputs.json`` in its folder or up to five above it, else
    `fallback`; None for any other format (the built-in table times it)."""
    if fmt not in GAVEL_FORMATS:
        return None
    return gavel_table_near(path) or fallback


def load_trace(path: Path, skip_invalid: bool = False) -> list[JobSpec]:
    """The trace's jobs, or exit with its FILE:LINE error (never a traceback).

    ``skip_invalid``: leave out the job lines that cannot be replayed (``gandiva sim
    --skip-invalid``), and say on stderr how many, by reason, with the first such line."""
    return load_trace_as(path, skip_invalid)[0]


def load_trace_as(path: Path, skip_invalid: bool = False) -> tuple[list[JobSpec], str]:
    """``load_trace``, and the format the trace was read as (``gavel6``, ``csv``, ...: a Gavel
    trace's steps are timed by Gavel's throughput table, any other's by the built-in one)."""
    if not skip_invalid:
        try:
            return read_trace_as(path)
        except TraceError as exc:
            hint = " (or --skip-invalid: leave out every job line that cannot be replayed)" if exc.skippable else ""
            raise SystemExit(f"error: {exc}{hint}") from None
    skipped: list[TraceError] = []
    try:
        jobs, fmt = read_trace_as(path, skipped=skipped)
    except TraceError as exc:
        raise SystemExit(f"error: {exc}") from None
    if skipped:
        from scheduler.sim.cli import skip_reasons

        print(f"{path}: --skip-invalid left out {len(skipped):,} of {len(skipped) + len(jobs):,} job lines:",
              file=sys.stderr)
        for count, first in skip_reasons(skipped).values():
            print(f"  {count:,} like line {first.line}: {first.reason}", file=sys.stderr)
    return jobs, fmt


def parse_config(spec: str) -> PolicyConfig:
    """``field[:value]+field...`` into a PolicyConfig on top of the defaults; ``none`` turns
    off a rule whose field may be None (e.g. ``large_block_after_s:none``)."""
    types = {f.name: f.type for f in dataclasses.fields(PolicyConfig)}
    changes: dict[str, Any] = {}
    for rule in filter(None, spec.split("+")):
        field, _, value = rule.partition(":")
        if field not in types:
            raise SystemExit(f"{field!r} is not a PolicyConfig field (one of {', '.join(sorted(types))})")
        kind = str(types[field])
        if value.lower() == "none" and "None" in kind:
            changes[field] = None
            continue
        try:
            changes[field] = (True if not value else value.lower() == "true") if kind == "bool" else \
                (int(value) if kind == "int" else float(value))
        except ValueError:
            raise SystemExit(f"{rule!r}: {value!r} is not a {kind}") from None
    return PolicyConfig(**changes)


def parse_rules(text: str) -> dict[str, PolicyConfig]:
    """``name=field[:value]+field...,name2=...`` into PolicyConfigs on top of the defaults."""
    out: dict[str, PolicyConfig] = {}
    for item in filter(None, text.split(",")):
        name, _, spec = item.partition("=")
        out[name] = parse_config(spec)
    return out


def jct_goal(yarn: dict[str, Any]) -> tuple[float, float]:
    """Issue 11's JCT goal against yarn-cs's result ``yarn`` (summarize's keys), and yarn-cs's
    queueing share: at most 0.8x yarn-cs's average JCT where yarn-cs queues at least 25% of
    it (room a better order can take), else at most 1.0x."""
    share = yarn["avg_queueing_delay_s"] / yarn["avg_jct_s"] if yarn["avg_jct_s"] else 0.0
    return (0.8 if share >= 0.25 else 1.0), share
