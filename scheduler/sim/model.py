"""The mechanism model: how fast a job runs where, and what each scheduling action costs.

Every number is a documented parameter (docs/simulator.md lists them with sources):

- Throughput (mini-batches/s) per model and GPU count: the Gavel measured table
  (``simulation_throughputs.json``, V100 by default) when given, otherwise the
  built-in ``DEFAULT_MODELS`` table below. GPU counts missing from a table are
  scaled linearly from the largest measured count below them (a 16-GPU job runs
  at 2x the 8-GPU rate; Gavel's table stops at 8).
- Packing: two jobs running at once on the same GPUs each run at a fraction of
  their alone rate. From the Gavel co-location pairs when given (a pair measured
  as 0 did not fit in memory: both make no progress, so a packing trial fails);
  otherwise each model's ``pack`` factor from the brief's P40 measurements of two
  copies of the same model (per job = (1 + gain) / 2, capped at 1), and the mean of
  the two factors for a mixed pair.
- Spread over several servers: the rate is multiplied by the Gavel
  unconsolidated/consolidated ratio for that model when given, else by
  ``DEFAULT_SPREAD_FACTOR``.
- Costs (seconds without progress), measured on our own machine (issue 5): a
  suspend+resume round trip through the job-side hook 0.02 s; a migration through
  the fast path 1.0 s (ResNet-50-sized job); a naive checkpoint-kill-restart 6 s,
  charged to policies without a job-side hook for every preemption.
"""

from __future__ import annotations

import ast
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.inputfile import open_input

logger = logging.getLogger(__name__)

GIB = 1 << 30
# Median of Gavel's V100 unconsolidated/consolidated throughput ratios (57 entries).
DEFAULT_SPREAD_FACTOR = 0.42
# The lowest spread factor replayed (``--spread-factor``, a table's unconsolidated ratio): below it a
# spread job's time-slice group rotates for ages (1e-9: 1e14 s in 1,920-s slices), and at 0 a job
# placed over servers never ends. Gavel measured 0.10 to 1.35.
MIN_SPREAD_FACTOR = 0.01
# A --throughputs table larger than this is not one (Gavel's is 1.2 MB).
MAX_TABLE_BYTES = 64 << 20


@dataclass(frozen=True)
class ModelInfo:
    """One model of the built-in table.

    rate: mini-batches/s on one GPU alone. scaling: fraction of linear speed-up kept
    per doubling of GPUs. pack: each job's fraction of its alone rate when packed with
    a copy of itself. memory_gib / util: its profile (GPU memory, utilization 0..1).
    """

    rate: float
    scaling: float
    pack: float
    memory_gib: float
    util: float


def _pack(gain: float) -> float:
    return min(1.0, (1.0 + gain) / 2.0)


# Packing gains: the brief's P40 measurements (2 copies of one model). Rates, memory
# and utilization are assumptions of typical size for these models, not measurements.
DEFAULT_MODELS: dict[str, ModelInfo] = {
    "resnet50": ModelInfo(4.0, 0.9, _pack(-0.13), 9.0, 0.95),
    "resnext50": ModelInfo(3.0, 0.9, _pack(-0.11), 10.0, 0.95),
    "vae": ModelInfo(50.0, 0.7, _pack(4.12), 1.0, 0.25),
    "superresolution": ModelInfo(20.0, 0.8, _pack(2.60), 2.0, 0.35),
    "rhn": ModelInfo(8.0, 0.85, _pack(0.46), 4.0, 0.6),
    "scrnn": ModelInfo(10.0, 0.85, _pack(0.39), 3.0, 0.6),
    "milstm": ModelInfo(8.0, 0.85, _pack(0.17), 5.0, 0.7),
    "lstm": ModelInfo(6.0, 0.85, _pack(-0.16), 6.0, 0.85),
}
DEFAULT_MODEL = "resnet50"


@dataclass(frozen=True)
class Costs:
    """Seconds a job makes no progress because of a scheduling action."""

    suspend_resume_s: float = 0.02
    migrate_s: float = 1.0
    restart_s: float = 6.0


@dataclass
class MechanismModel:
    """Rates and costs for the simulator; build with ``default()`` or ``from_gavel()``."""

    costs: Costs = field(default_factory=Costs)
    spread_factor: float = DEFAULT_SPREAD_FACTOR
    # Host memory each job's processes hold (what its helper would measure), running or
    # suspended: 4 GiB, the policy's assumption for a job not measured yet (an assumption
    # of a TensorFlow process with its CUDA context and input pipeline, not a measurement).
    job_host_memory_gib: float = 4.0
    gavel: dict[tuple[str, int], dict] | None = None
    gavel_spread: dict[tuple[str, int], float] | None = None
    source: str = "built-in defaults"
    _rate_cache: dict[tuple[str, int], float] = field(default_factory=dict)

    @classmethod
    def default(cls, costs: Costs | None = None) -> MechanismModel:
        return cls(costs=costs or Costs())

    @classmethod
    def from_gavel(cls, path: Path, gpu_type: str = "v100", costs: Costs | None = None) -> MechanismModel:
        """Load the Gavel throughput table; ValueError names the file and what is wrong."""
        why = f"{path}: cannot read the Gavel throughput table"
        try:
            # Bounded (`/dev/zero` read until the memory was full); Gavel's own is 1.2 MB.
            with open_input(path) as fh:  # a named pipe with no writer: an OSError, not a wait
                data = fh.read(MAX_TABLE_BYTES + 1)
            if len(data) > MAX_TABLE_BYTES:
                raise ValueError(f"{why}: larger than {MAX_TABLE_BYTES >> 20} MiB")
            raw = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{why}: not UTF-8 text (byte {exc.start})") from None
        except RecursionError:  # `[[[[...`: the parser recursed per level (a traceback)
            raise ValueError(f"{why}: nested too deeply to be a table") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{why}: {exc}") from exc
        # The table maps GPU types to {"(model, gpus)": {"null": rate, ...}}.
        types = [k for k, v in raw.items() if isinstance(v, dict)] if isinstance(raw, dict) else []
        if not types:
            raise ValueError(f"{path}: not a Gavel throughput table (a JSON object of GPU types, "
                             f"e.g. {{\"v100\": {{...}}}}); it has no GPU types")
        if gpu_type not in types:
            raise ValueError(f"{path}: no GPU type {gpu_type!r}; it has {', '.join(types)} "
                             "(--gpu-type)")
        table = _rows(path, gpu_type, raw[gpu_type], packing=True)
        spread = {}
        unconsolidated = raw.get(f"{gpu_type}_unconsolidated", {})
        for key, v in (_rows(path, f"{gpu_type}_unconsolidated", unconsolidated)
                       if isinstance(unconsolidated, dict) else {}).items():
            if key in table and table[key]["null"]:
                spread[key] = v["null"] / table[key]["null"]
                if spread[key] < MIN_SPREAD_FACTOR:
                    # fifo, yarn-cs and tiresias place a job that fits one server over several
                    # when that is where GPUs are free: at 0 it stayed there unfinished.
                    raise ValueError(
                        f"{path}: {gpu_type}_unconsolidated[\"('{key[0]}', {key[1]})\"][\"null\"]: {v['null']:g} is "
                        f"{spread[key]:.2g}x the rate on one server ({table[key]['null']:g}), below the lowest spread "
                        f"factor replayed ({MIN_SPREAD_FACTOR}): a job placed over servers would make no progress, "
                        f"or next to none, and might never end; give the rate measured (Gavel's are 0.10x to 1.35x "
                        f"the rate on one server), or leave the row out")
        return cls(costs=costs or Costs(), gavel=table, gavel_spread=spread,
                   source=f"{path} ({gpu_type})")

    # --- rates ----------------------------------------------------------------------

    def knows(self, model: str) -> bool:
        if self.gavel is not None:
            return (model, 1) in self.gavel
        return model in DEFAULT_MODELS

    def alone_rate(self, model: str, gpus: int) -> float:
        """Mini-batches/s of ``model`` alone on ``gpus`` GPUs of one server."""
        key = (model, gpus)
        if key not in self._rate_cache:
            self._rate_cache[key] = self._alone_rate(model, gpus)
        return self._rate_cache[key]

    def _alone_rate(self, model: str, gpus: int) -> float:
        if self.gavel is not None and (model, 1) in self.gavel:
            measured = max(k for (m, k) in self.gavel if m == model and k <= gpus)
            return self.gavel[(model, measured)]["null"] * gpus / measured
        info = DEFAULT_MODELS.get(model, DEFAULT_MODELS[DEFAULT_MODEL])
        doublings = max(0.0, (gpus.bit_length() - 1))
        return info.rate * gpus * info.scaling**doublings

    def spread(self, model: str, gpus: int) -> float:
        """Factor on the rate when the job's GPUs span more than one server."""
        if self.gavel_spread:
            measured = [k for (m, k) in self.gavel_spread if m == model and k <= gpus]
            if measured:
                return min(1.0, self.gavel_spread[(model, max(measured))])
        return self.spread_factor

    def fix_spread(self, factor: float) -> None:
        """One spread factor for every model, over Gavel's per-model ratios too
        (``--spread-factor``; 1.0 replays a trace's durations as they are, wherever a job runs)."""
        self.spread_factor, self.gavel_spread = factor, None

    def packed(self, model: str, other: str, gpus: int) -> float:
        """Factor on ``model``'s alone rate when packed with ``other`` on the same GPUs."""
        if self.gavel is not None and (model, 1) in self.gavel and (other, 1) in self.gavel:
            measured = max(k for (m, k) in self.gavel if m == model and k <= gpus)
            row = self.gavel[(model, measured)]
            pair = row.get(f"('{other}', {measured})")
            if pair is not None and row["null"]:
                return pair[0] / row["null"]
        a = DEFAULT_MODELS.get(model, DEFAULT_MODELS[DEFAULT_MODEL]).pack
        b = DEFAULT_MODELS.get(other, DEFAULT_MODELS[DEFAULT_MODEL]).pack
        return a if model == other else (a + b) / 2

    def profile(self, model: str) -> tuple[int, float]:
        """(GPU memory bytes, utilization) the profiler would report for ``model``."""
        info = DEFAULT_MODELS.get(model) or _family_profile(model)
        return int(info.memory_gib * GIB), info.util


def gavel_table_near(trace: Path) -> Path | None:
    """Gavel's ``simulation_throughputs.json`` in the trace's folder or up to 5 above it."""
    for parent in trace.resolve().parents[:5]:
        if (parent / "simulation_throughputs.json").is_file():
            return parent / "simulation_throughputs.json"
    return None


def _key(text: str) -> tuple[str, int]:
    name, scale = ast.literal_eval(text)
    return str(name), int(scale)


def _rows(path: Path, gpu_type: str, rows: dict, packing: bool = False) -> dict[tuple[str, int], dict]:
    """A GPU type's rows, keyed by (job type, scale factor); ValueError names the first entry
    that is not a measurement (an ast error of a bad key, or a NaN or negative rate replayed
    as if measured, was what came out before). ``packing``: the pairs are the replay's packed
    rates, so one above the job's rate alone is refused too: the replay would run a job faster
    packed than alone, which no measured pair of Gavel's table does and the makespan lower
    bound (``load.fastest_run_s``) rules out, so a replay could beat the bound it prints."""
    out = {}
    for text, row in rows.items():
        where = f"{path}: {gpu_type}[{text[:60]!r}]"
        try:
            key = _key(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise ValueError(f"{where}: the key is not \"('JOB TYPE', SCALE FACTOR)\"") from None
        if not isinstance(row, dict) or "null" not in row:
            raise ValueError(f"{where}: expected an object with \"null\" (the rate alone)")
        for other, value in row.items():
            values = [value] if other == "null" else value if isinstance(value, list) and len(value) == 2 else None
            if values is None or not all(_rate(v) for v in values):
                shown = "null" if other == "null" else other[:60]
                raise ValueError(f"{where}[{shown!r}]: {str(value)[:40]} is not "
                                 + ("a rate (a number 0 or more)" if other == "null" else
                                    "a pair of rates [this job's, the other's], numbers 0 or more"))
        faster = [other for other, pair in row.items() if other != "null" and pair[0] > row["null"]] if packing else []
        if faster:  # (after the loop: "null" may come after the pairs in the file)
            raise ValueError(f"{where}[{faster[0][:60]!r}]: packed rate {row[faster[0]][0]:g} is above the job's "
                             f"rate alone (\"null\": {row['null']:g}); packing never speeds a job up (no measured "
                             "pair of Gavel's table does, and the makespan lower bound counts on it): give a packed "
                             "rate at most the rate alone")
        out[key] = row
    return out


def _rate(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


# Profiles for Gavel's job types by family (assumed, not measured: the Gavel table
# has no memory or utilization). Packing trials correct wrong guesses by measurement.
_FAMILY = {
    "ResNet-50": ModelInfo(0, 0, 0, 10.0, 0.95),
    "ResNet-18": ModelInfo(0, 0, 0, 4.0, 0.7),
    "Transformer": ModelInfo(0, 0, 0, 8.0, 0.8),
    "LM": ModelInfo(0, 0, 0, 3.0, 0.5),
    "Recommendation": ModelInfo(0, 0, 0, 3.0, 0.4),
    "A3C": ModelInfo(0, 0, 0, 2.0, 0.3),
    "CycleGAN": ModelInfo(0, 0, 0, 6.0, 0.8),
}


def _family_profile(model: str) -> ModelInfo:
    for prefix, info in _FAMILY.items():
        if model.startswith(prefix):
            return info
    return DEFAULT_MODELS[DEFAULT_MODEL]
