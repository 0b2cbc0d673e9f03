"""The whole table: every ITP trace and every Gavel Philly trace of >= 500 jobs, four policies.

Each trace is replayed on 25x4 at --target-load 0.9 with the mechanism costs of
docs/simulator.md (Gavel's V100 table for the Gavel traces, the built-in table for ITP,
whose model names it does not know). Per trace it prints avg JCT, avg and median time to
the first 100 mini-batches, makespan with its lower bound, yarn-cs's queueing share, and
the ratios the goals of issue 11 are stated in, with a verdict per goal:

- ff: gandiva's average time to the first 100 mini-batches <= 0.25x yarn-cs's;
- jct: gandiva's avg JCT <= 0.8x yarn-cs's where yarn-cs queues >= 25% of its JCT,
  else never above yarn-cs; and within 10% of tiresias's (<= 1.1x);
- mk: makespan <= 1.05x yarn-cs's.

--ablate adds one row per gandiva rule set (see docs/policy.md), e.g.
--ablate paper=las_slices:false+slice_growth:0+max_jobs_per_gpu:4,no-las=las_slices:false
where every rule set is CONFIG_FIELD[:VALUE] joined with +, applied on top of the defaults
(which already have las_slices, slice_growth 0.1 and max_jobs_per_gpu 16).
--plot DIR writes each trace's CDFs and utilization plot into DIR/TRACE/.
--compare A.json,B.json,... replays nothing: it prints, from files earlier runs wrote with
--json, one markdown row per trace with gandiva's result in each (avg JCT h, its ratios to
yarn-cs / to tiresias, ff, makespan to yarn-cs, goals ff/jct/mk, and each goal won (+) or
lost (-) against the first file), and the goals met per file: the table docs/simulator.md
shows for each rule set.
--baselines FILE takes yarn-cs's, tiresias' and yarn-cs-local's results from a file an
earlier run wrote with --json (same --cluster and --target-load) and replays gandiva alone:
an ablation over every trace then costs gandiva's time only. The last lines count the goals
met by the gandiva column and by each --ablate rule set.

    .venv/bin/python benchmarks/sim_table.py [--only cluster10,2869ce] [--json OUT] [--plot DIR]
    .venv/bin/python benchmarks/sim_table.py --json base.json          # once: every policy
    .venv/bin/python benchmarks/sim_table.py --baselines base.json --ablate rule=FIELD:VALUE
    .venv/bin/python benchmarks/sim_table.py --trace other/clusterA.csv --trace t.trace.gz

--trace FILE (repeatable) replays those files instead of the evaluation set: any trace
`gandiva sim` reads (its format detected; compressed or not), a Gavel-format one timed by the
simulation_throughputs.json in its folder or above (else the one under --traces), any other
by the built-in table.

Needs ../shared/traces. All traces take hours on this shared machine: use --only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sim_traces import (  # benchmarks/ is the script's folder
    TRACES,
    gavel_table_for,
    jct_goal,
    load_trace_as,
    parse_config,
    parse_rules,
    trace_files,
    trace_name,
)

from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.types import ServerView
from scheduler.sim.engine import SimResult, Simulator, make_cluster
from scheduler.sim.load import makespan_bound, scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

POLICIES = ("gandiva", "yarn-cs", "tiresias", "yarn-cs-local")
BASELINES = POLICIES[1:]
JCT, FIRST = "avg_jct_s", "avg_time_to_first_n_s"


def verdicts(g: dict, y: dict, t: dict) -> dict[str, Any]:
    """The goals of issue 11 for one trace."""
    goal, queue_share = jct_goal(y)
    ff = g["avg_time_to_first_n_s"] / y["avg_time_to_first_n_s"] if y["avg_time_to_first_n_s"] else 0.0
    jct_y = g["avg_jct_s"] / y["avg_jct_s"]
    jct_t = g["avg_jct_s"] / t["avg_jct_s"]
    mk = g["makespan_s"] / y["makespan_s"]
    return {"yarn_queue_share": queue_share, "ff_ratio": ff, "jct_ratio_yarn": jct_y, "jct_ratio_tiresias": jct_t,
            "makespan_ratio": mk, "ff_ok": ff <= 0.25, "jct_ok": jct_y <= goal and jct_t <= 1.1,
            "makespan_ok": mk <= 1.05, "jct_goal": goal}


GOALS = (("ff_ok", "ff"), ("jct_ok", "jct"), ("makespan_ok", "mk"))


def replay_policies(jobs: list[JobSpec], servers: tuple[ServerView, ...], model: MechanismModel,
                    gandiva_cfg: PolicyConfig | None = None, ablations: dict[str, PolicyConfig] | None = None,
                    stored: dict[str, Any] | None = None) -> tuple[dict[str, SimResult], dict[str, Any]]:
    """One workload under every policy of the table (gandiva with ``gandiva_cfg``) and under
    gandiva with each of ``ablations``' rule sets (as ``gandiva[NAME]``); a baseline that
    ``stored`` (an earlier ``--json`` entry of this workload) holds is taken from it, not
    replayed. Returns the replays' results and, per policy, ``summarize``'s metrics with the
    replay's CPU seconds (``cpu_s``): the ``--json`` entry's policy fields."""
    stored = stored or {}
    runs = [(name, get_policy(name, gandiva_cfg if name == "gandiva" else None))
            for name in POLICIES if not (name in BASELINES and name in stored)]
    runs += [(f"gandiva[{label}]", get_policy("gandiva", cfg)) for label, cfg in (ablations or {}).items()]
    results: dict[str, SimResult] = {}
    m: dict[str, Any] = {}
    for name, policy in runs:
        began = time.process_time()
        results[name] = Simulator(jobs, servers, policy, model).run()
        m[name] = {**summarize(results[name]), "cpu_s": time.process_time() - began}
    m.update({name: stored[name] for name in BASELINES if name in stored})
    return results, m


def compare(paths: list[Path]) -> int:
    """Print gandiva's result per trace in each of ``paths`` (``--json`` files), the goals won
    or lost against the first, and the goals met per file."""
    runs: list[dict[str, Any]] = []
    for path in paths:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            print(f"--compare {path}: {exc}", file=sys.stderr)
            return 2
    traces = [t for t in runs[0] if all(t in r for r in runs)]
    missing = sorted({t for r in runs for t in r} - set(traces))
    if not traces:
        print("--compare: the files have no trace in common", file=sys.stderr)
        return 2
    for t in traces:
        settings = {json.dumps(r[t].get("settings"), sort_keys=True) for r in runs}
        if len(settings) > 1:
            print(f"--compare: {t} was replayed with different settings: {' / '.join(sorted(settings))}",
                  file=sys.stderr)
            return 2

    def cell(entry: dict[str, Any], first: dict[str, Any] | None) -> str:
        v, g = entry["goals"], entry["gandiva"]
        met = "/".join("yes" if v[k] else "**no**" for k, _ in GOALS)
        if first is not None:
            moved = [("+" if v[k] else "-") + n for k, n in GOALS if v[k] != first["goals"][k]]
            met += f" ({', '.join(moved)})" if moved else ""
        return (f"{g[JCT] / 3600:,.1f} h ({v['jct_ratio_yarn']:.2f} / {v['jct_ratio_tiresias']:.2f}), "
                f"ff {v['ff_ratio']:.2f}, mk {v['makespan_ratio']:.2f}: {met}")

    print("| trace | " + " | ".join(p.stem for p in paths) + " |")
    print("|---|" + "---|" * len(paths))
    totals = [[0, 0, 0] for _ in runs]
    for t in traces:
        print(f"| {t} | " + " | ".join(cell(r[t], None if i == 0 else runs[0][t]) for i, r in enumerate(runs)) + " |")
        for i, r in enumerate(runs):
            for j, (k, _) in enumerate(GOALS):
                totals[i][j] += bool(r[t]["goals"][k])
    print("| goals met (ff / jct / mk) | " + " | ".join(f"**{a} / {b} / {c}** of {len(traces)}" for a, b, c in totals)
          + " |")
    if missing:
        print(f"left out (not in every file): {', '.join(missing)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=TRACES,
                    help="the evaluation set's folder: itp/*.csv and gavel/traces/msr/seed=*/*.trace (default: "
                         "../shared/traces)")
    ap.add_argument("--trace", type=Path, action="append", default=[], metavar="FILE",
                    help="replay this trace file instead of the evaluation set (repeatable; any format gandiva "
                         "sim reads)")
    ap.add_argument("--only", help="comma-separated trace names (file stems)")
    ap.add_argument("--min-jobs", type=int, default=500, help="Gavel traces with at least this many jobs")
    ap.add_argument("--skip-invalid", action="store_true",
                    help="leave out the job lines that cannot be replayed (0 GPUs, no length, repeated ids) "
                         "instead of stopping; how many, and why, is printed per trace (as gandiva sim)")
    ap.add_argument("--cluster", default="25x4")
    ap.add_argument("--target-load", type=float, default=0.9)
    ap.add_argument("--ablate", default="", help="extra gandiva rows: NAME=FIELD[:VALUE]+...,NAME2=...")
    ap.add_argument("--config", default="", help="rules for the gandiva column (FIELD[:VALUE]+...)")
    ap.add_argument("--host-memory-gib", type=float, default=0.0, metavar="G",
                    help="each server's host memory: the policies place a job on a server only while its "
                         "jobs' processes, running and suspended, fit in 90%% of it (default 0: not checked)")
    ap.add_argument("--job-host-memory-gib", type=float, default=MechanismModel.job_host_memory_gib, metavar="G",
                    help="host memory each job's processes hold (default %(default)s, an assumption)")
    ap.add_argument("--json", type=Path, help="also write every metric here")
    ap.add_argument("--plot", type=Path, metavar="DIR", help="plots per trace into DIR/TRACE/")
    ap.add_argument("--baselines", type=Path, metavar="FILE",
                    help="reuse the baselines' results from an earlier --json file; replay gandiva only")
    ap.add_argument("--compare", metavar="A.json,B.json", help="replay nothing: compare gandiva's results "
                    "in files earlier --json runs wrote, trace by trace, goals won or lost against the first")
    args = ap.parse_args()
    if args.compare:
        return compare([Path(p) for p in args.compare.split(",")])
    if not args.trace and not args.traces.is_dir():
        print(f"no traces at {args.traces.resolve()}: this benchmark needs ../shared/traces (or --trace FILE)")
        return 2
    missing_files = [str(p) for p in args.trace if not p.is_file()]
    if missing_files:
        print(f"--trace {', '.join(missing_files)}: no such file; nothing was replayed", file=sys.stderr)
        return 2
    if args.json is not None:  # before hours of replay, not after
        folder = args.json.parent
        if args.json.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            why = "a directory" if args.json.is_dir() else f"no writable folder {folder}"
            print(f"--json {args.json}: cannot write there ({why}); give a file in a folder you can write; "
                  "nothing was replayed", file=sys.stderr)
            return 2
    settings = {"cluster": args.cluster, "target_load": args.target_load}
    stored: dict[str, Any] = {}
    if args.baselines is not None:
        if args.plot is not None:
            ap.error("--plot needs every policy's replay: leave out --baselines")
        try:
            stored = json.loads(args.baselines.read_text())
        except (OSError, ValueError) as exc:
            ap.error(f"--baselines {args.baselines}: {exc}")
    wanted = set(args.only.split(",")) if args.only else None
    every = args.trace or trace_files(args.traces, args.min_jobs)
    names = {p: trace_name(p) for p in every}
    twice = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
    if twice:
        print(f"two traces are named {', '.join(twice)} ({', '.join(str(p) for p in every if names[p] in twice)}): "
              "the table and --json name each trace by its file's stem; rename one", file=sys.stderr)
        return 2
    paths = [p for p in every if wanted is None or names[p] in wanted]
    unknown = sorted(wanted - {names[p] for p in paths}) if wanted else []
    if unknown or not paths:
        found = ", ".join(names.values()) or "none"
        where = "the --trace files" if args.trace else (
            f"{args.traces} (expected itp/*.csv or gavel/traces/msr/seed=*/*.trace with at least --min-jobs "
            f"{args.min_jobs} jobs)")
        print(f"no trace {', '.join(unknown) or 'at all'} in {where}; found: {found}", file=sys.stderr)
        return 2
    workloads: dict[Path, list[JobSpec]] = {}
    formats: dict[Path, str] = {}
    for path in paths:  # every trace is read before hours of replay, so a bad one stops the run at once
        try:
            workloads[path], formats[path] = load_trace_as(path, args.skip_invalid)
        except SystemExit as exc:
            print(exc, file=sys.stderr)
    if len(workloads) < len(paths):
        print("fix or leave out (--only) the traces above (or --skip-invalid, where it is offered); "
              "nothing was replayed", file=sys.stderr)
        return 2
    # A Gavel trace's steps are timed by Gavel's throughput table (the one beside it, else the
    # evaluation set's); every other format's by the built-in table.
    default_table = args.traces / "gavel" / "simulation_throughputs.json"
    builtin = MechanismModel.default()
    tables: dict[Path, MechanismModel] = {}
    models: dict[Path, MechanismModel] = {}
    for path in workloads:
        table = gavel_table_for(path, formats[path], default_table)
        if table is None:
            models[path] = builtin
            continue
        if table not in tables:
            try:
                tables[table] = MechanismModel.from_gavel(table)
            except ValueError as exc:
                print(f"error: {exc} (the Gavel trace {path} needs it; put Gavel's simulation_throughputs.json "
                      "beside it)", file=sys.stderr)
                return 2
        models[path] = tables[table]
    try:
        servers = make_cluster(args.cluster, host_memory_gib=args.host_memory_gib)
    except ValueError as exc:
        ap.error(f"--cluster: {exc}")
    host = args.host_memory_gib
    if host < 0 or args.job_host_memory_gib < 0:
        ap.error("--host-memory-gib and --job-host-memory-gib must not be negative")
    widest = max(s.num_gpus for s in servers)
    if host and args.baselines is not None and 0.9 * host < widest * args.job_host_memory_gib:
        # The stored baselines ran without the check; one job per GPU must fit for them to stand.
        ap.error(f"--baselines: the stored baselines ran one job per GPU without a host memory check; "
                 f"{widest} jobs of {args.job_host_memory_gib} GiB do not fit in 90% of {host} GiB, so "
                 f"replay the baselines too (leave out --baselines)")
    for mech in (builtin, *tables.values()):
        mech.job_host_memory_gib = args.job_host_memory_gib
    scaled: dict[Path, list[JobSpec]] = {}
    for path, workload in workloads.items():  # before any replay: a trace this cluster cannot replay stops the run
        try:
            scaled[path], _ = scale_to_load(workload, servers, models[path], args.target_load)
        except ValueError as exc:
            print(f"{path}: {exc} (--cluster {args.cluster}, --target-load {args.target_load})", file=sys.stderr)
    if len(scaled) < len(workloads):
        print("give another --cluster or leave out (--only) the traces above; nothing was replayed", file=sys.stderr)
        return 2
    gandiva_cfg = parse_config(args.config)
    ablations = parse_rules(args.ablate)
    everything: dict[str, Any] = {}
    tally: dict[str, list[int]] = {}  # rule set -> goals met: ff, jct, mk, traces
    print(f"{'trace':>9} {'jobs':>5} | {'avg JCT h g/y/t/yl':>24} | {'first-100 avg s g/y/t':>24} "
          f"{'med g':>6} | {'mksp h g/y':>11} {'bound':>6} | {'yQ%':>4} {'ff':>5} {'jct/y':>5} {'jct/t':>5} "
          f"{'mk/y':>5} | goals ff/jct/mk | CPU s (gandiva)")
    for path in workloads:
        model = models[path]
        tname = names[path]
        jobs = scaled[path]
        bound, _ = makespan_bound(jobs, servers, model)
        start = time.process_time()
        old: dict[str, Any] = {}
        if args.baselines is not None:
            old = stored.get(tname) or {}
            if old.get("settings") != settings or old.get("jobs") != len(jobs):
                print(f"{args.baselines} has no baselines for {tname} at {settings} ({len(jobs)} jobs): "
                      f"write them first with --json (every policy)", file=sys.stderr)
                return 2
        results, m = replay_policies(jobs, servers, model, gandiva_cfg, ablations, old)
        g, y, t, yl = (m[p] for p in POLICIES)
        v = verdicts(g, y, t)
        everything[tname] = {"jobs": len(jobs), "makespan_lower_bound_s": bound, "goals": v,
                                 "settings": settings, **m}
        if host:
            everything[tname]["host_memory"] = {"server_gib": host, "job_gib": args.job_host_memory_gib}
        for label, met in [("gandiva", v)] + [(lb, verdicts(m[f"gandiva[{lb}]"], y, t)) for lb in ablations]:
            row = tally.setdefault(label, [0, 0, 0, 0])
            for i, (k, _) in enumerate(GOALS):
                row[i] += bool(met[k])
            row[3] += 1
        ok = "/".join("yes" if v[k] else "NO" for k, _ in GOALS)
        print(f"{tname:>9} {len(jobs):>5} | "
              f"{'/'.join(f'{x[JCT] / 3600:.1f}' for x in (g, y, t, yl)):>24} | "
              f"{'/'.join(f'{x[FIRST]:.0f}' for x in (g, y, t)):>24} "
              f"{g['median_time_to_first_n_s']:>6.0f} | "
              f"{g['makespan_s'] / 3600:>5.0f}/{y['makespan_s'] / 3600:<5.0f} {bound / 3600:>6.0f} | "
              f"{100 * v['yarn_queue_share']:>4.0f} {v['ff_ratio']:>5.2f} {v['jct_ratio_yarn']:>5.2f} "
              f"{v['jct_ratio_tiresias']:>5.2f} {v['makespan_ratio']:>5.2f} | {ok:>15} | "
              f"{time.process_time() - start:.0f} (g {g['cpu_s']:.0f})", flush=True)
        for label in ablations:
            a = m[f"gandiva[{label}]"]
            va = verdicts(a, y, t)
            print(f"{'':>9} {'':>5}   gandiva[{label}]: JCT {a['avg_jct_s'] / 3600:.1f} h, first-100 avg "
                  f"{a['avg_time_to_first_n_s']:.0f} s median {a['median_time_to_first_n_s']:.0f} s, makespan "
                  f"{a['makespan_s'] / 3600:.0f} h, suspends {a['suspends']} (at most {a['max_suspended_per_server']} "
                  f"on one server; gandiva {g['max_suspended_per_server']}), ratios ff {va['ff_ratio']:.2f} "
                  f"jct/y {va['jct_ratio_yarn']:.2f} jct/t {va['jct_ratio_tiresias']:.2f} "
                  f"mk/y {va['makespan_ratio']:.2f}, goals "
                  f"{'/'.join('yes' if va[k] else 'NO' for k in ('ff_ok', 'jct_ok', 'makespan_ok'))}", flush=True)
        if args.plot is not None:
            from scheduler.sim.plots import write_plots

            write_plots(results, args.plot / tname)
    for label, (ff, jct, mk, n) in tally.items():
        print(f"goals met, {label}: ff {ff} / jct {jct} / mk {mk} of {n} traces")
    if args.json:
        # Whole or not at all: a stopped run leaves the last complete file, never half of one.
        tmp = args.json.with_name(f".{args.json.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(everything, indent=2, sort_keys=True))
            os.replace(tmp, args.json)
        finally:
            tmp.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
