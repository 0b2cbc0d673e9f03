"""Held-out evaluation: the defaults and the three baselines on what the policy was not measured on.

Every rule of the policy was measured on the same 19 traces (8 ITP + 11 Gavel Philly msr
traces of >= 500 jobs, 25x4, load 0.9: benchmarks/sim_table.py). This replays, with the
defaults and nothing tuned, the variants those 19 were not, one variant at a time:

- other:      the traces under ../shared/traces not in the 19 (the msr traces of < 500 jobs,
              Gavel's physical_cluster traces, Tiresias' 60_job.csv), on --small-cluster (2x4:
              they have 3 to 100 jobs of at most 8 GPUs); a trace whose jobs all arrive at
              once cannot be scaled to a load and is replayed with its arrivals as given;
- other-25x4: the same traces on 25x4, the 19's cluster;
- load0.7, load1.1: the 19 at --target-load 0.7 and 1.1 (25x4);
- 13x8, 50x2: the 19 on 13 servers of 8 GPUs and on 50 of 2 (load 0.9);
- itp-halves: each ITP trace's first and second half (by submit order: the first half of its
              jobs, then the rest) as two traces, cluster04-h1 and cluster04-h2 (25x4, 0.9);
- gen:        generated workloads (scheduler/sim/generator.py, 2,000 jobs, seed 0) of three
              shapes: bursty arrivals (1-20 jobs at one instant), mostly large jobs (80%
              multi-GPU), a heavy tail (log-normal sigma 2.5); and the generator's defaults.

Each variant's table is printed as it goes (one row per trace, with the goals of issue 11:
ff / jct / mk, as sim_table.py states them), then a summary: goals met per variant.

Cost: the whole run is about 40 min of CPU on this (shared, 2-core) machine, most of it
the four variants of the 19. Measured without cluster03, 04 and 07 (--leave-out, below):
each variant of the other 16 took 3.3-6.4 min of CPU, itp-halves 2 min, gen 17 s, other 1 s;
those three traces cost about as much again (docs/heldout.md). It runs niced (nice 10). --variants picks some; --resume DIR keeps
each trace's results in DIR/VARIANT.json (sim_table.py --json's layout) as it finishes and
reads back those of the same cluster and load instead of replaying them, so a stopped run goes
on where it stopped (a sim_table.py --json file of the 19 at those settings, copied there as
DIR/load0.7.json say, is reused the same way).

    .venv/bin/python benchmarks/sim_heldout.py --resume runs/ --json heldout.json
    .venv/bin/python benchmarks/sim_heldout.py --variants other,gen
    .venv/bin/python benchmarks/sim_heldout.py --trace other/clusterA.csv   # a variant of your own traces
    .venv/bin/python benchmarks/sim_heldout.py --compare before.json,after.json

--trace FILE (repeatable) adds a variant `given` of those files at --cluster and --target-load.
--config RULES replays gandiva with those rules instead of the defaults (a rule measured on the
held-out variants); with --baselines DIR (an earlier run's --resume folder) the baselines are
read from there and gandiva alone is replayed, as sim_table.py --baselines does:

    .venv/bin/python benchmarks/sim_heldout.py --variants other,itp-halves --resume base/
    .venv/bin/python benchmarks/sim_heldout.py --variants other,itp-halves --baselines base/ \
        --config balance_per_gpu --resume rule/ --json rule.json
--compare A.json,B.json replays nothing: for each variant in both files, sim_table.py
--compare's table (gandiva per trace, each goal won or lost against the first file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim_table import (  # benchmarks/ is the script's folder
    GOALS,
    POLICIES,
    compare,
    replay_policies,
    verdicts,
)
from sim_traces import TRACES, gavel_table_for, load_trace_as, parse_config, trace_files, trace_name

from scheduler.sim.engine import make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import makespan_bound, scale_to_load
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

AS_GIVEN = "as given"  # the load of a trace whose jobs all arrive at once: not scaled
LARGE_MIX = ((1, 0.20), (2, 0.10), (4, 0.20), (8, 0.35), (16, 0.10), (32, 0.05))
GEN_SHAPES: dict[str, dict[str, Any]] = {
    "gen-default": {},
    "gen-bursty": {"burst_max": 20},
    "gen-large": {"gpu_mix": LARGE_MIX},
    "gen-heavytail": {"duration_sigma": 2.5},
}
GEN_JOBS = 2000
IDLE_QUEUE = 0.05  # yarn-cs's queueing share under which nobody waits: the ff goal has nothing to gain

Workload = tuple[str, list[JobSpec], MechanismModel]  # (name, jobs, the model that times them)


@dataclass
class Variant:
    name: str
    what: str
    cluster: str
    load: float
    workloads: Callable[[], list[Workload]]


class _Models:
    """Each trace's mechanism model: Gavel's table for a Gavel-format trace, else the built-in one."""

    def __init__(self, root: Path) -> None:
        self.default_table = root / "gavel" / "simulation_throughputs.json"
        self.builtin = MechanismModel.default()
        self.tables: dict[Path, MechanismModel] = {}

    def read(self, path: Path) -> tuple[list[JobSpec], MechanismModel]:
        jobs, fmt = load_trace_as(path)
        table = gavel_table_for(path, fmt, self.default_table)
        if table is None:
            return jobs, self.builtin
        if table not in self.tables:
            self.tables[table] = MechanismModel.from_gavel(table)
        return jobs, self.tables[table]


def other_traces(root: Path, min_jobs: int) -> list[Path]:
    """The traces under ``root`` that are not in the evaluation set: Gavel msr traces of fewer
    than ``min_jobs`` jobs, Gavel's physical_cluster traces, Tiresias' 60_job.csv."""
    the19 = set(trace_files(root, min_jobs))
    msr = sorted(p for p in (root / "gavel" / "traces" / "msr").glob("seed=*/*.trace") if p not in the19)
    physical = sorted((root / "gavel" / "traces" / "physical_cluster").glob("*.trace"))
    tiresias = [p for p in [root / "tiresias" / "60_job.csv"] if p.is_file()]
    return msr + physical + tiresias


def halves(jobs: list[JobSpec]) -> tuple[list[JobSpec], list[JobSpec]]:
    """A trace's first half (the first ceil(n/2) jobs by submit time, ties in the trace's order)
    and its second half (the rest): two periods of one cluster."""
    ordered = sorted(jobs, key=lambda j: j.submit_time)  # stable: ties keep the trace's order
    cut = (len(ordered) + 1) // 2
    return ordered[:cut], ordered[cut:]


def variants(root: Path, min_jobs: int, small: str, extra: list[Path], cluster: str, load: float) -> list[Variant]:
    models = _Models(root)

    def files(paths: Callable[[], list[Path]]) -> Callable[[], list[Workload]]:
        return lambda: [(trace_name(p), *models.read(p)) for p in paths()]

    def itp_halves() -> list[Workload]:
        out: list[Workload] = []
        for path in (p for p in trace_files(root, min_jobs) if p.parent.name == "itp"):
            jobs, model = models.read(path)
            first, second = halves(jobs)
            out += [(f"{trace_name(path)}-h1", first, model), (f"{trace_name(path)}-h2", second, model)]
        return out

    def generated() -> list[Workload]:
        return [(name, generate(GEN_JOBS, seed=0, **shape), models.builtin) for name, shape in GEN_SHAPES.items()]

    the19 = files(lambda: trace_files(root, min_jobs))
    out = [
        Variant("other", f"traces not in the 19, on {small}", small, 0.9, files(lambda: other_traces(root, min_jobs))),
        Variant("other-25x4", "traces not in the 19, on 25x4", "25x4", 0.9, files(lambda: other_traces(root, min_jobs))),
        Variant("load0.7", "the 19 at load 0.7", "25x4", 0.7, the19),
        Variant("load1.1", "the 19 at load 1.1", "25x4", 1.1, the19),
        Variant("13x8", "the 19 on 13 servers of 8 GPUs", "13x8", 0.9, the19),
        Variant("50x2", "the 19 on 50 servers of 2 GPUs", "50x2", 0.9, the19),
        Variant("itp-halves", "each ITP trace's first and second half", "25x4", 0.9, itp_halves),
        Variant("gen", f"generated, {GEN_JOBS:,} jobs, seed 0: default, bursty, large, heavy tail", "25x4", 0.9,
                generated),
    ]
    if extra:
        out.append(Variant("given", "the --trace files", cluster, load, files(lambda: extra)))
    return out


def replay(name: str, jobs: list[JobSpec], model: MechanismModel, cluster: str, load: float,
           rules: str = "", stored: dict[str, Any] | None = None) -> dict[str, Any]:
    """One workload under the four policies (gandiva with its defaults, or with ``rules``,
    sim_table.py's ``--config`` syntax): sim_table.py --json's entry, the rules named in it. A
    workload whose jobs all arrive at once is replayed as given (its load cannot be scaled);
    its settings say so. ``stored``: an earlier entry of this workload whose baselines are
    taken as they are (gandiva alone is replayed)."""
    servers = make_cluster(cluster)
    settings: dict[str, Any] = {"cluster": cluster, "target_load": load}
    try:
        jobs, _ = scale_to_load(jobs, servers, model, load)
    except ValueError as exc:
        if "same time" not in str(exc):
            raise ValueError(f"{name}: {exc} (--cluster {cluster})") from None
        settings["target_load"] = AS_GIVEN
    if stored is not None and (stored.get("settings") != settings or stored.get("jobs") != len(jobs)):
        raise ValueError(f"{name}: the --baselines entry was replayed with {stored.get('settings')} "
                         f"({stored.get('jobs')} jobs), not {settings} ({len(jobs)} jobs)")
    bound, _ = makespan_bound(jobs, servers, model)
    _, m = replay_policies(jobs, servers, model, parse_config(rules), stored=stored)
    entry = {"jobs": len(jobs), "makespan_lower_bound_s": bound, "settings": settings,
             "goals": verdicts(m["gandiva"], m["yarn-cs"], m["tiresias"]), **m}
    if rules:
        entry["gandiva_rules"] = rules
    return entry


def _row(name: str, e: dict[str, Any]) -> str:
    v = e["goals"]
    ok = " / ".join("yes" if v[k] else "**no**" for k, _ in GOALS)
    load = e["settings"]["target_load"]
    jct = " / ".join(f"{e[p]['avg_jct_s'] / 3600:.1f}" for p in POLICIES[:3])
    return (f"| {name} | {e['jobs']:,} | {load} | {jct} | {100 * v['yarn_queue_share']:.0f}% | {v['ff_ratio']:.2f} | "
            f"{v['jct_ratio_yarn']:.2f} ({v['jct_goal']}) | {v['jct_ratio_tiresias']:.2f} | "
            f"{v['makespan_ratio']:.2f} | {ok} |")


HEADER = ("| trace | jobs | load | avg JCT h g / y / t | yarn-cs queueing | ff | jct/y (goal) | jct/t | mk/y | "
          "goals ff / jct / mk |\n|---|---|---|---|---|---|---|---|---|---|")


def met(entries: dict[str, Any]) -> list[int]:
    return [sum(bool(e["goals"][k]) for e in entries.values()) for k, _ in GOALS]


def _stored(path: Path, v: Variant, names: list[str], rules: str | None = "") -> dict[str, Any]:
    """The results in ``path`` (a --resume file or a sim_table.py --json file) for the variant's
    traces at its settings, replayed with gandiva's ``rules`` (None: any); other traces,
    settings and rules are left out (replayed again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for name in names:
        s = data.get(name, {}).get("settings", {})
        if (s.get("cluster") == v.cluster and s.get("target_load") in (v.load, AS_GIVEN)
                and (rules is None or data[name].get("gandiva_rules", "") == rules)):
            out[name] = data[name]
    return out


def _write(path: Path, data: Any) -> None:
    """Whole or not at all (a stopped run leaves the last complete file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def compare_runs(paths: list[Path]) -> int:
    try:
        runs = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError) as exc:
        print(f"--compare: {exc}", file=sys.stderr)
        return 2
    common = [v for v in runs[0] if all(v in r for r in runs)]
    if not common:
        print("--compare: the files have no variant in common", file=sys.stderr)
        return 2
    rc = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in common:
            print(f"\n### {name}\n")
            files = []
            for i, (path, r) in enumerate(zip(paths, runs)):
                files.append(Path(tmp) / str(i) / f"{path.stem}.json")
                files[-1].parent.mkdir(exist_ok=True)
                files[-1].write_text(json.dumps(r[name]["traces"]))
            sys.stdout.flush()
            rc = max(rc, compare(files))
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES, help="../shared/traces (default)")
    ap.add_argument("--min-jobs", type=int, default=500, help="the evaluation set's Gavel traces: at least this many")
    ap.add_argument("--variants", help="comma-separated, of: other, other-25x4, load0.7, load1.1, 13x8, 50x2, "
                    "itp-halves, gen, given (default: all)")
    ap.add_argument("--leave-out", default="", metavar="NAMES",
                    help="comma-separated trace names to leave out of every variant (cluster04 leaves out its "
                         "halves too), e.g. the costliest: cluster03,cluster04,cluster07 (about half the CPU of "
                         "a variant of the 19)")
    ap.add_argument("--small-cluster", default="2x4", help="the cluster of variant other (default 2x4)")
    ap.add_argument("--trace", type=Path, action="append", default=[], metavar="FILE",
                    help="a variant `given` of these trace files, at --cluster and --target-load (repeatable)")
    ap.add_argument("--cluster", default="25x4", help="for --trace (default 25x4)")
    ap.add_argument("--target-load", type=float, default=0.9, help="for --trace (default 0.9)")
    ap.add_argument("--resume", type=Path, metavar="DIR",
                    help="keep each variant's results in DIR/VARIANT.json and reuse them when they match")
    ap.add_argument("--config", default="", metavar="RULES",
                    help="gandiva's rules instead of the defaults, as sim_table.py's --config (FIELD[:VALUE]+...); "
                         "--resume keeps them in DIR/VARIANT[RULES].json")
    ap.add_argument("--baselines", type=Path, metavar="DIR",
                    help="take yarn-cs's, tiresias' and yarn-cs-local's results from an earlier run's --resume DIR "
                         "(same traces and settings) and replay gandiva alone: a rule measured held-out costs "
                         "gandiva's time only")
    ap.add_argument("--json", type=Path, help="write every variant's results here")
    ap.add_argument("--compare", metavar="A.json,B.json", help="replay nothing: compare --json files per variant")
    args = ap.parse_args()
    if args.compare:
        return compare_runs([Path(p) for p in args.compare.split(",")])
    missing = [str(p) for p in args.trace if not p.is_file()]
    if missing:
        print(f"--trace {', '.join(missing)}: no such file; nothing was replayed", file=sys.stderr)
        return 2
    for flag, folder in (("--json", args.json.parent if args.json else None), ("--resume", args.resume)):
        if folder is not None and not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            print(f"{flag}: {folder} is not a folder this user can write; nothing was replayed", file=sys.stderr)
            return 2
    try:
        parse_config(args.config)
    except SystemExit as exc:
        print(f"--config: {exc}; nothing was replayed", file=sys.stderr)
        return 2
    if args.baselines is not None and not args.baselines.is_dir():
        print(f"--baselines: {args.baselines} is not a folder (give an earlier run's --resume DIR); nothing was "
              "replayed", file=sys.stderr)
        return 2
    every = variants(args.traces, args.min_jobs, args.small_cluster, args.trace, args.cluster, args.target_load)
    wanted = args.variants.split(",") if args.variants else [v.name for v in every]
    unknown = sorted(set(wanted) - {v.name for v in every})
    if unknown:
        print(f"--variants: no variant {', '.join(unknown)} (there are: {', '.join(v.name for v in every)}; "
              "given only with --trace)", file=sys.stderr)
        return 2
    chosen = [next(v for v in every if v.name == name) for name in dict.fromkeys(wanted)]  # in the order asked
    if any(v.name != "given" for v in chosen) and not args.traces.is_dir():
        print(f"no traces at {args.traces.resolve()}: this benchmark needs ../shared/traces (or only --trace FILE "
              "with --variants given)", file=sys.stderr)
        return 2
    try:
        os.nice(10)
    except OSError:
        pass
    results: dict[str, Any] = {}
    began = time.process_time()
    for i, v in enumerate(chosen, 1):
        try:
            workloads = v.workloads()
        except SystemExit as exc:  # a trace that cannot be read: its FILE:LINE error
            print(f"variant {v.name}: {exc}; nothing more was replayed", file=sys.stderr)
            return 2
        left = set(filter(None, args.leave_out.split(",")))
        workloads = [w for w in workloads if w[0] not in left and w[0].rpartition("-h")[0] not in left]
        names = [w[0] for w in workloads]
        # A rule set's results go into a file of their own: the defaults' are never overwritten.
        keep = args.resume / (f"{v.name}[{args.config}].json" if args.config else f"{v.name}.json") \
            if args.resume else None
        entries = _stored(keep, v, names, args.config) if keep else {}
        base = _stored(args.baselines / f"{v.name}.json", v, names, None) if args.baselines else {}
        lacking = [n for n in names if args.baselines and n not in base and n not in entries]
        if lacking:
            print(f"variant {v.name}: --baselines {args.baselines} has no {v.name}.json entry for "
                  f"{', '.join(lacking)} at {v.cluster}, load {v.load}: replay them first with --resume there; "
                  "nothing more was replayed", file=sys.stderr)
            return 2
        print(f"\n## {v.name}: {v.what} ({v.cluster}, load {v.load}; variant {i} of {len(chosen)}, "
              f"{len(workloads)} traces{f', {len(entries)} read back from {keep}' if entries else ''}"
              f"{f'; left out: {args.leave_out}' if left else ''})\n", flush=True)
        print(HEADER, flush=True)
        for k, (name, jobs, model) in enumerate(workloads, 1):
            start = time.process_time()
            if name not in entries:
                try:
                    entries[name] = replay(name, jobs, model, v.cluster, v.load, args.config, base.get(name))
                except ValueError as exc:
                    print(f"variant {v.name}: {exc}; nothing more was replayed", file=sys.stderr)
                    return 2
                if keep:  # after each trace: a stopped run goes on from the next one
                    _write(keep, entries)
            print(_row(name, entries[name]) + f" <!-- {k}/{len(workloads)} done, "
                  f"{time.process_time() - start:.0f} s CPU -->", flush=True)
        entries = {n: entries[n] for n in names}
        ff, jct, mk = met(entries)
        print(f"\ngoals met, {v.name}: ff {ff} / jct {jct} / mk {mk} of {len(entries)} "
              f"({time.process_time() - began:.0f} s CPU so far)", flush=True)
        results[v.name] = {"what": v.what, "cluster": v.cluster, "target_load": v.load, "traces": entries}
    print("\n## Goals met per variant\n\n(idle: traces where yarn-cs queues under 5% of its JCT; their jobs start at "
          "once under any policy, so ff <= 0.25x yarn-cs is out of reach there and their ff misses are no loss)\n\n"
          "| variant | cluster | load | traces | ff | jct | mk | idle (ff met there) |\n|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ff, jct, mk = met(r["traces"])
        n = len(r["traces"])
        idle = [e for e in r["traces"].values() if e["goals"]["yarn_queue_share"] < IDLE_QUEUE]
        print(f"| {name}: {r['what']} | {r['cluster']} | {r['target_load']} | {n} | {ff} | {jct} | {mk} | "
              f"{len(idle)} ({sum(bool(e['goals']['ff_ok']) for e in idle)}) |")
    if args.json:
        _write(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
