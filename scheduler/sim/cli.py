"""`gandiva sim`: replay a trace (or a generated workload) through the policies in virtual time."""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from scheduler.policy import POLICIES, PolicyConfig, get_policy
from scheduler.sim.engine import SimResult, Simulator, make_cluster, skipped_note
from scheduler.sim.generator import generate
from scheduler.sim.load import (
    duration_alone,
    fastest_run_s,
    makespan_bound,
    offered_load,
    replayed,
    scale_to_load,
)
from scheduler.sim.metrics import job_columns, job_rows, summarize
from scheduler.sim.model import MIN_SPREAD_FACTOR, Costs, MechanismModel, gavel_table_near
from scheduler.sim.trace import (
    FORMATS,
    FRACTIONAL,
    FRACTIONAL_HELP,
    GAVEL,
    MAX_SUBMIT_S,
    STDIN,
    JobSpec,
    TraceError,
    read_trace_as,
)

logger = logging.getLogger(__name__)
MAX_COST_S = 86400.0  # a suspend, migration or restart of more than a day models nothing real
# A job's run alone: more than 1e9 s (31 years; Gavel's slowest real jobs, on K80s, run 3)
# is a unit mistake, and gandiva replays it in slices of at most 32 quanta (minutes per job).
MAX_RUN_S = 1e9
LARGE_TRACE_BYTES = 10 << 20  # a trace file this large is said before it is read (seconds)
MAX_MEMORY_GIB = 1 << 20  # 1 PiB per server or job: larger is a typo (and 1e300 overflowed)

DESCRIPTION = """\
Replay a workload through the scheduling policies in virtual time. The simulator drives
the very same policy code as the live scheduler; only the clock and the cluster are
simulated (docs/simulator.md documents the mechanism model and every parameter).

Workload: --trace FILE, else a synthetic Philly-like workload from the project's
generator (--jobs, --seed). Trace formats (--format; by default detected from the first
line that is not blank or a # comment):
  gavel6    Gavel's older msr traces: tab separated, no header, 6 columns (job_type, command,
            num_steps_arg, total_steps, arrival_time_s, scale_factor)
  gavel7    Gavel/Philly msr trace: tab separated, no header, 7 columns (job_type, command,
            num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor)
  gavel10   Gavel physical-cluster trace: tab separated, no header, 10 columns (job_type,
            command, working_dir, num_steps_arg, needs_data_dir, total_steps, scale_factor,
            priority_weight, SLO, arrival_time_s)
  itp       Microsoft ITP (ElasticFlow) CSV: a header naming job_id and submission_time
            (job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration)
  tiresias  Tiresias CSV: a header naming job_id, num_gpu and submit_time
            (job_id,num_gpu,submit_time,iterations,model_name,duration,interval)
  helios    SenseTime Helios CSV: a header naming gpu_num and cpu_num (job_id,user,gpu_num,
            cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue); its CPU
            jobs (gpu_num 0) and jobs of duration 0 (never ran) are left out, counted
  philly    Microsoft Philly's cluster_job_log: JSON, a list of jobs with jobid,
            submitted_time and attempts; GPUs: the most one attempt held (its detail's
            gpus), length: its attempts' run times added up; jobs that never ran or held
            no GPU are left out, counted
  pai       Alibaba PAI 2020 pai_job_table/pai_task_table/pai_instance_table (no header) and
            Alibaba GPU v2023 openb_pod_list: detected and refused, saying how to write them
            as csv (their GPUs are fractions: plan_gpu 50, gpu_milli 500 = half a GPU);
            --fractional-gpus ceil replays the task table and the pod list, rounding up
  csv       any other CSV: submit_time,num_gpus,duration[,model], header optional; also
            Slurm's sacct -P export (| between fields, its header: JobID, Submit, Elapsed or
            Start and End, AllocTRES's gres/gpu), job steps (123.batch) not taken for jobs
A GPU count that is not a whole number (0.5) is refused, naming the line (--skip-invalid
leaves such lines out): round it up yourself, or with --fractional-gpus ceil.
A CSV with a header is read by column name (any order and case, extra columns ignored,
commas or tabs); without one, --format itp or tiresias reads their column order. Times
are seconds (or ISO 8601 dates), durations seconds, unless the column's name ends in its
unit (duration_ms, duration_min, submit_time_h); gzip, bzip2 and xz files are read as they
are, and --trace - reads standard input; docs/simulator.md "Workloads" has the details and
what is refused.
"""

EPILOG = """\
examples:
  gandiva sim --trace ../shared/traces/gavel/traces/msr/seed=0/0e4a51.trace \\
      --compare gandiva,yarn-cs,tiresias --cluster 25x4 --target-load 0.9
  gandiva sim --jobs 2000 --cluster 50x4 --policy gandiva -o json
  gandiva sim --jobs 500 --compare gandiva,fifo --plot plots/
"""


# The boolean PolicyConfig rules that `gandiva sim` takes as --RULE / --no-RULE (_rule_flag).
RULE_FLAGS: dict[str, None] = {}


def _rule_flag(group: argparse._ArgumentGroup, field: str, help: str) -> None:
    """The boolean PolicyConfig field ``field`` as --FIELD / --no-FIELD, its default the
    field's, passed to the policy's config by run()."""
    group.add_argument("--" + field.replace("_", "-"), action=argparse.BooleanOptionalAction,
                       default=getattr(PolicyConfig, field), help=help)
    RULE_FLAGS[field] = None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `gandiva sim` to the gandiva CLI."""
    p = subparsers.add_parser("sim", help="replay a trace through the policies in virtual time",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--trace", type=_trace_path,
                   help="trace file to replay, or - for standard input; gzip, bzip2 and xz files are read as "
                        "they are (default: a generated workload)")
    w.add_argument("--format", choices=FORMATS, default="auto", help="trace layout (default: detect)")
    w.add_argument("--skip-invalid", action="store_true",
                   help="leave out the trace's job lines that cannot be replayed (CPU jobs with 0 GPUs, "
                        "jobs of no length, repeated ids, missing fields, jobs the throughput table gives "
                        "a rate of 0) instead of stopping at the "
                        "first; how many, and why, is printed (default: stop, naming the line)")
    w.add_argument("--fractional-gpus", choices=FRACTIONAL, default="refuse", help=FRACTIONAL_HELP)
    w.add_argument("--jobs", type=int, default=1000, help="generated workload: number of jobs")
    w.add_argument("--seed", type=int, default=0, help="generated workload: random seed")
    w.add_argument("--target-load", type=_finite, metavar="L",
                   help="scale arrival times so the offered load (GPU-time demanded / "
                        "(GPUs x span)) is L; the factor is printed")
    s = p.add_argument_group("cluster and policies")
    s.add_argument("--cluster", default="25x4", help="SERVERSxGPUS (default 25x4 = 100 GPUs)")
    s.add_argument("--host-memory-gib", type=_finite, default=0.0, metavar="G",
                   help="each server's host memory: a server takes a job only while its jobs' processes, "
                        "running and suspended, fit in 90%% of it (--job-host-memory-gib each; default 0: "
                        "not checked, only --max-jobs-per-gpu bounds time-slicing)")
    s.add_argument("--policy", default="gandiva", choices=list(POLICIES), help="policy to run")
    s.add_argument("--compare", metavar="P1,P2,...",
                   help="run several policies side by side (overrides --policy)")
    s.add_argument("--quantum", type=_finite, default=60.0, help="time slice in seconds (gandiva)")
    s.add_argument("--defrag-free-gpus", type=int, default=3,
                   help="defragment non-idle servers with at least this many free GPUs")
    s.add_argument("--max-jobs-per-gpu", type=int, default=PolicyConfig.max_jobs_per_gpu,
                   help="jobs that may time-share one GPU before new jobs queue (gandiva; "
                        "default %(default)s, the paper's setup used 4)")
    _rule_flag(s, "las_slices",
               help="gandiva: in a time-slice group the least-served job runs next "
                    "(--no-las-slices: the one waiting longest, as in the paper)")
    s.add_argument("--slice-growth", type=_finite, default=PolicyConfig.slice_growth, metavar="G",
                   help="gandiva: a slice is G x the job's attained service, 1-32 quanta "
                        "(default %(default)s; 0: one quantum, as in the paper)")
    s.add_argument("--fifo-after", type=_finite, default=PolicyConfig.fifo_after_s, metavar="S",
                   help="gandiva, with --las-slices: a job with S seconds of service per GPU joins the "
                        "long bucket, served first come first served after every shorter job "
                        "(default %(default)s; 0: least attained service throughout)")
    s.add_argument("--starve-factor", type=_finite, default=PolicyConfig.starve_factor, metavar="K",
                   help="gandiva, with --las-slices: a job suspended for K x its service per GPU "
                        "runs next (default %(default)s; 0: no starvation limit)")
    s.add_argument("--share-block-after", type=_seconds_or_off, default=PolicyConfig.share_block_after_s, metavar="S",
                   help="gandiva: once the first queued job that fits a server has waited S seconds, "
                        "later jobs take free GPUs only and do not join time-slice groups "
                        "(default: off)")
    s.add_argument("--large-block-after", type=_seconds_or_off, default=PolicyConfig.large_block_after_s, metavar="S",
                   help="gandiva: once the first queued job that fits a server has waited S seconds, "
                        "jobs larger than a server take free GPUs only and do not join time-slice "
                        "groups, so their groups drain and free servers for it; smaller jobs still "
                        "time-share at once (default %(default)s; off: no block)")
    _rule_flag(s, "groupless_block",
               help="gandiva: jobs larger than a server take free GPUs only and do not join time-slice "
                    "groups at once (not after --large-block-after) while the first queued job that fits "
                    "a server has no time-slice group of its GPU count anywhere (default: off)")
    _rule_flag(s, "balance_sizes",
               help="gandiva: when the jobs of one GPU count are more crowded on their servers than "
                    "another count's, hand a server of the less crowded count to them (its jobs "
                    "join same-size time-slice groups elsewhere; default: on)")
    _rule_flag(s, "balance_park",
               help="gandiva, with --balance-sizes: when no server can be handed over by moving its "
                    "jobs into other groups of their size (all full), park the jobs of the one with the "
                    "fewest (checkpointed to disk, back in the queue) and hand it over (default: on)")
    _rule_flag(s, "balance_per_gpu",
               help="gandiva, with --balance-sizes: measure a GPU count's crowding in jobs per GPU "
                    "instead of per same-size GPU set, so servers go to the jobs that get the fewest "
                    "GPU-seconds each (favours small jobs; default: off)")
    _rule_flag(s, "gittins_slices",
               help="gandiva, with --las-slices: the job with the highest Gittins index of its service per "
                    "GPU runs next, the index computed from the service with which the latest 1,000 jobs "
                    "left (least attained service on heavy-tailed lengths, first come first served on "
                    "others; least attained service until 100 jobs have left; default: on; nothing "
                    "to order with --no-las-slices)")
    _rule_flag(s, "gittins_censored",
               help="gandiva, with --gittins-slices: the index's distribution counts the jobs still "
                    "present too, censored at the service they have (Kaplan-Meier), not only the "
                    "jobs that left (default: off)")
    _rule_flag(s, "gittins_tail_fifo",
               help="gandiva, with --gittins-slices: jobs served longer than the departures tell about "
                    "run first come first served behind the others, not by least attained service "
                    "(default: off)")
    _rule_flag(s, "gittins_history",
               help="gandiva, with --gittins-slices: the index's distribution is the latest 1,000 "
                    "departures and an even sample of up to 1,000 of the departures before them, so a "
                    "burst of short jobs moves it less (default: off)")
    _rule_flag(s, "eldest_runs",
               help="gandiva, with --las-slices: the job submitted first of those of its GPU count "
                    "holding GPUs runs ahead of its time-slice group and keeps its GPUs to itself "
                    "until it ends (the others of its group are parked; default: off)")
    _rule_flag(s, "eldest_parks",
               help="gandiva, with --eldest-runs: park the other members of the eldest's group "
                    "(--no-eldest-parks: they stay suspended in its group until it ends or free GPUs "
                    "elsewhere take them; default: on)")
    _rule_flag(s, "eldest_second_group",
               help="gandiva, with --eldest-runs: the eldest keeps its GPUs to itself only while its "
                    "GPU count holds another time-slice group for its newcomers (default: off)")
    _rule_flag(s, "eldest_first_turns",
               help="gandiva, with --eldest-runs: a never-run newcomer with no other place takes its "
                    "first turn on the eldest's GPUs, then is parked (default: off)")
    _rule_flag(s, "fifo_after_measured",
               help="gandiva, with --las-slices: --fifo-after's buckets with the boundary set from the "
                    "service with which the latest 1,000 jobs left: where their mean residual service "
                    "is highest (no bucket while it still rises; default: off)")
    _rule_flag(s, "probe_slices",
               help="gandiva: a job that has never run and finds every time-slice group of its size "
                    "full joins one anyway for its first turn, then is parked (checkpointed to disk, "
                    "back in the queue; its next start costs --restart-s) if the group is still full "
                    "(default: on; --no-probe-slices: it waits for room, as in the paper)")
    _rule_flag(s, "probe_park_last",
               help="gandiva, with --probe-slices: when a newcomer's first turn is over in a full group, "
                    "park the member the group's slice order ranks last (most service, lowest Gittins "
                    "index) instead of the newcomer, if the newcomer ranks ahead of it (default: off)")
    _rule_flag(s, "gather_large",
               help="gandiva: when jobs larger than a server wait and their GPU count is the most "
                    "crowded, hold whole servers for them, move the jobs there into other time-slice "
                    "groups, and start the first of them there; with --probe-slices the servers are "
                    "only lent, for a never-run job's first turn, then parked and given back "
                    "(default: off; the live scheduler cannot launch over servers yet)")
    _rule_flag(s, "probe_large",
               help="gandiva, with --probe-slices: the first never-run job larger than a server takes its "
                    "first turn over whole servers of other GPU counts (the least recently lent first), their "
                    "running jobs suspended in place and their groups held until the turn is over, then "
                    "is parked (default: off; the live scheduler cannot launch over servers yet)")
    m = p.add_argument_group("mechanism model (defaults: our measurements, see docs/simulator.md)")
    m.add_argument("--throughputs", default="auto", metavar="FILE|auto|none",
                   help="Gavel simulation_throughputs.json for rates, packing and spread; "
                        "auto: found next to a Gavel trace; none: built-in table")
    m.add_argument("--gpu-type", default="v100", help="GPU type in the throughput table")
    m.add_argument("--suspend-resume-s", type=_not_negative, default=Costs.suspend_resume_s)
    m.add_argument("--migrate-s", type=_not_negative, default=Costs.migrate_s)
    m.add_argument("--restart-s", type=_not_negative, default=Costs.restart_s)
    m.add_argument("--job-host-memory-gib", type=_finite, default=MechanismModel.job_host_memory_gib, metavar="G",
                   help="host memory each job's processes hold, running or suspended (default %(default)s, "
                        "an assumption; read only with --host-memory-gib)")
    m.add_argument("--spread-factor", type=_finite, metavar="F",
                   help="rate factor of a job spread over servers, for every model (default: "
                        "Gavel's per-model ratio with a table, else 0.42); 1 replays the "
                        "trace's durations as they are, wherever a job runs")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--output", choices=("table", "json"), default="table")
    o.add_argument("--plot", type=_plot_path, metavar="DIR", help="write jct_cdf.png, first_n_cdf.png and utilization.png")
    o.add_argument("--first-n", type=_at_least_one, default=100,
                   help="report the time until each job's first N mini-batches (default 100)")
    o.add_argument("--jobs-csv", type=_out_path, metavar="FILE",
                   help="write one CSV row per job and policy: submit, first run, first N mini-batches, "
                        "finish, JCT, GPUs, suspends, migrations...; jobs unfinished, skipped or left out "
                        "have status and note saying so (docs/simulator.md \"Output\")")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _seconds_or_off(text: str) -> float | None:
    """A rule's limit in seconds, or ``off`` (also ``none``) to turn the rule off."""
    if text.lower() in ("off", "none"):
        return None
    try:
        return _finite(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'off', got {text!r}") from None


def _finite(text: str) -> float:
    """A number flag: NaN and infinity would replay nonsense without a word, so they are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _not_negative(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _policies(args: argparse.Namespace) -> list[str]:
    # Each policy once: `--compare gandiva,yarn-cs,gandiva` replayed gandiva twice (hours on a
    # large trace) to print one column.
    names = list(dict.fromkeys(n.strip() for n in (args.compare if args.compare is not None else args.policy)
                               .split(",") if n.strip()))
    if not names:
        raise ValueError(f"--compare {args.compare!r} names no policy; give one or more of "
                         f"{', '.join(POLICIES)}, separated by commas")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; valid policies: {', '.join(POLICIES)}")
    return names


def _model(args: argparse.Namespace, trace_fmt: str | None) -> MechanismModel:
    costs = Costs(args.suspend_resume_s, args.migrate_s, args.restart_s)
    path: Path | None = None
    if args.throughputs not in ("auto", "none"):
        path = Path(args.throughputs)
    elif args.throughputs == "auto" and args.trace is not None and trace_fmt in GAVEL and str(args.trace) != STDIN:
        path = gavel_table_near(args.trace)  # (standard input has no folder: not the current one's)
    # Below 0.01 a spread job's time-slice group rotates for ages (1e-9: 1e14 s in 1,920-s slices,
    # a replay without end); Gavel measured 0.10 to 1.35.
    if args.spread_factor is not None and not MIN_SPREAD_FACTOR <= args.spread_factor <= 1:
        raise ValueError(f"--spread-factor must be in [{MIN_SPREAD_FACTOR}, 1], got {args.spread_factor} "
                         f"(Gavel measured 0.10 to 1)")
    for flag, cost in (("--suspend-resume-s", costs.suspend_resume_s), ("--migrate-s", costs.migrate_s),
                       ("--restart-s", costs.restart_s)):
        if cost > MAX_COST_S:  # 1e300 printed an average JCT of 6.7e298 s, or never ended
            raise ValueError(f"{flag} {cost:g} is more than a day ({MAX_COST_S:,.0f} s); give the mechanism's "
                             f"cost in seconds")
    if costs.suspend_resume_s >= args.quantum:
        # 2,000 s against the 60-s quantum: every resume's pause outlasted the slice, each job
        # was suspended again with nothing trained, and the replay never ended.
        raise ValueError(f"--suspend-resume-s {costs.suspend_resume_s:g} is not below --quantum {args.quantum:g}: a "
                         f"time slice shorter than the switch it pays for trains nothing and the replay may never "
                         f"end; give the mechanism's cost in seconds (default {Costs.suspend_resume_s:g})")
    model = MechanismModel.default(costs) if path is None else MechanismModel.from_gavel(path, args.gpu_type, costs)
    if args.spread_factor is not None:
        model.fix_spread(args.spread_factor)
    if args.job_host_memory_gib < 0:
        raise ValueError(f"--job-host-memory-gib must not be negative, got {args.job_host_memory_gib}")
    model.job_host_memory_gib = args.job_host_memory_gib
    return model


def _workload(args: argparse.Namespace, err: Any) -> tuple[list[JobSpec], str | None, list[tuple[str, str]]]:
    """(the jobs, the trace's format, the jobs left out: (job id or "", "line N: why")): the
    records the format says are no GPU job (Helios's CPU jobs, Philly's jobs that never
    ran), and the job lines --skip-invalid left out."""
    if args.trace is None:
        return generate(args.jobs, seed=args.seed), None, []
    left_out: list[TraceError] = []
    skipped: list[TraceError] | None = [] if args.skip_invalid else None
    if str(args.trace) == STDIN and sys.stdin.isatty():  # it would wait for typed lines, without a word
        raise ValueError("--trace -: standard input is a terminal; pipe the trace in (zcat t.csv.gz | gandiva sim "
                         "--trace - ...) or give its file")
    how: dict[str, str] = {}  # the compression it was read through, the columns of a CSV without header
    name = "standard input" if str(args.trace) == STDIN else str(args.trace)
    size = args.trace.stat().st_size if str(args.trace) != STDIN and args.trace.is_file() else 0
    if size >= LARGE_TRACE_BYTES:  # a 100-MB trace takes ~20 s to read, without a word before
        err.print(f"reading {escape(name)} ({size / 1e6:,.0f} MB)...")
    try:
        jobs, fmt = read_trace_as(args.trace, args.format, skipped, left_out, how, args.fractional_gpus)
    except MemoryError:  # a traceback before; a memory limit (ulimit -v, a container) stops the read
        mb = f" ({args.trace.stat().st_size / 1e6:,.0f} MB)" if args.trace.is_file() else ""
        raise TraceError(args.trace, None, f"not enough memory to read the trace{mb}: every job is held in "
                                           f"memory (about 1.5 KB a line while read; a JSON log several times its "
                                           f"size); replay a part of it (split it), or give more memory") from None
    except TraceError as exc:
        if skipped is not None or not exc.skippable:  # the file as a whole: --skip-invalid cannot help
            raise
        raise TraceError(args.trace, exc.line, f"{exc.reason} (or --skip-invalid: leave out every job "
                                               f"line that cannot be replayed, counted by reason)") from None
    # Which reader took the file is said: a layout detected wrongly reads other columns.
    packed = f" ({how['compression']}-compressed)" if "compression" in how else ""
    columns = f" without a header, its columns taken in the order {how['columns']}" if "columns" in how else ""
    err.print(f"read {escape(name)}{packed} as {'an' if fmt == 'itp' else 'a'} {fmt} trace{escape(columns)}"
              + (" (detected; --format chooses another)" if args.format == "auto" else " (--format)")
              + (f"; its {int(how['steps']):,} job step line{'s' if how['steps'] != '1' else ''} (123.batch, "
                 f"123.0: parts of their job) {'are not jobs' if how['steps'] != '1' else 'is not a job'}"
                 if "steps" in how else "")
              + (f"; {int(how['rounded']):,} job{'s' if how['rounded'] != '1' else ''} of a fraction of a GPU "
                 f"rounded up to whole GPUs (--fractional-gpus ceil)" if "rounded" in how else ""))
    if "excel" in how:
        err.print(f"[yellow]warning:[/yellow] {escape(how['excel'])}")
    total = len(jobs) + len(left_out) + len(skipped or [])
    unit = "jobs" if fmt in ("philly", "pai") else "job lines"
    if left_out:
        err.print(f"[yellow]note:[/yellow] left out {len(left_out):,} of {total:,} {unit}, which the {fmt} trace "
                  f"says are no GPU job to replay:")
        _print_reasons(left_out, err)
    if skipped:
        err.print(f"[yellow]note:[/yellow] --skip-invalid left out {len(skipped):,} of {total:,} {unit}:")
        _print_reasons(skipped, err)
    # A left-out line of a layout without ids (or whose id was missing) is named by its line:
    # `line-17` (no job of the trace is so named: theirs start with the trace's name).
    return jobs, fmt, [(exc.job_id or (f"line-{exc.line}" if exc.line is not None else ""),
                        f"line {exc.line}: {exc.reason}" if exc.line is not None else exc.reason)
                       for exc in left_out + (skipped or [])]


def _print_reasons(errors: list[TraceError], err: Any) -> None:
    for count, first in skip_reasons(errors).values():
        where = f"line {first.line}: " if first.line is not None else ""
        err.print(f"  {count:,} like {where}{escape(first.reason)}")


def _out_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give a file to write")
    if text == STDIN:  # (--trace - is standard input; here it was a file named "-" in the current folder)
        raise argparse.ArgumentTypeError("- would be a file named '-'; give a file name (/dev/stdout writes the rows "
                                         "after the summary on standard output)")
    return Path(text)


def _plot_path(text: str) -> Path:
    if text == STDIN:
        raise argparse.ArgumentTypeError("- would be a folder named '-'; give the folder to write the plots in")
    return Path(text)


def _trace_path(text: str) -> Path:
    if not text.strip():  # Path("") is ".", which read as "Is a directory"
        raise argparse.ArgumentTypeError("empty; give a trace file")
    if re.match(r"(https?|ftp|s3|gs|hdfs)://", text, re.IGNORECASE):  # was "No such file or directory"
        raise argparse.ArgumentTypeError(f"{text} is a URL: download the trace first (curl -LO {text}) and give "
                                         f"its file, or pipe it in: curl -sL {text} | gandiva sim --trace - ...")
    return Path(text)


def skip_reasons(skipped: list[TraceError]) -> dict[str, tuple[int, TraceError]]:
    """The left-out lines by reason, most first: reason (the message with its quoted values
    and line numbers blanked) -> (how many, the first such line's error)."""
    groups: dict[str, tuple[int, TraceError]] = {}
    for exc in skipped:
        key = re.sub(r"'[^']*'|\bline \d+", lambda m: "line N" if m[0].startswith("line") else "'...'", exc.reason)
        count, first = groups.get(key, (0, exc))
        groups[key] = (count + 1, first)
    return dict(sorted(groups.items(), key=lambda kv: -kv[1][0]))


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C in a long replay: one line, nothing printed to stdout
        print("gandiva sim: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # in the replay (a trace's read says so itself): one line, not a traceback
        print("gandiva sim: error: out of memory in the replay; replay fewer jobs (a part of the trace) or "
              "fewer policies at once, or give more memory", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    err = _console(stderr=True)
    try:
        names = _policies(args)
        for flag, gib in (("--host-memory-gib", args.host_memory_gib), ("--job-host-memory-gib", args.job_host_memory_gib)):
            if gib > MAX_MEMORY_GIB:  # 1e300 was an OverflowError traceback
                raise ValueError(f"{flag} {gib:g} is more than {MAX_MEMORY_GIB:,} GiB (1 PiB); give a server's "
                                 f"or a job's memory in GiB")
        servers = make_cluster(args.cluster, host_memory_gib=args.host_memory_gib)
        jobs, fmt, left_out_jobs = _workload(args, err)
        total = sum(srv.num_gpus for srv in servers)
        smallest = min(j.num_gpus for j in jobs)
        if smallest > total:  # nothing would replay: a table of zeros says nothing
            raise ValueError(f"every job needs more GPUs than the cluster's {total} (the smallest needs "
                             f"{smallest}); give a --cluster of at least {smallest} GPUs")
        if args.plot is not None:  # before the replay, which may take hours
            try:
                args.plot.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"--plot {args.plot}: cannot create the folder ({exc.strerror or exc}); "
                                 f"give a folder you can write") from None
            if not os.access(args.plot, os.W_OK | os.X_OK):
                raise ValueError(f"--plot {args.plot}: the folder is not writable; give a folder you can write")
        if args.jobs_csv is not None:  # before the replay, which may take hours
            _check_writable(args.jobs_csv, args.trace,
                            None if args.throughputs in ("auto", "none") else Path(args.throughputs))
        model = _model(args, fmt)
        every_job = jobs
        jobs, rateless = _jobs_with_a_rate(jobs, servers, model, args.skip_invalid, err)
        left_out_jobs += rateless
        jobs, endless = _jobs_of_a_length(jobs, servers, model, args.skip_invalid, err)
        left_out_jobs += endless
        config = PolicyConfig(quantum_s=args.quantum, defrag_free_gpus=args.defrag_free_gpus,
                              max_jobs_per_gpu=args.max_jobs_per_gpu,
                              slice_growth=args.slice_growth, fifo_after_s=args.fifo_after,
                              starve_factor=args.starve_factor,
                              share_block_after_s=args.share_block_after,
                              large_block_after_s=args.large_block_after,
                              **{field: getattr(args, field) for field in RULE_FLAGS})
    except TraceError as exc:
        err.print(f"gandiva sim: [red]error:[/red] {escape(str(exc))}")
        return 2
    except ValueError as exc:
        err.print(f"gandiva sim: [red]error:[/red] {escape(_said_as_flags(str(exc), args))}")
        return 2
    if fmt in GAVEL and args.throughputs == "auto" and model.gavel is None:
        # Its lengths are steps: at the built-in rates they are other durations than Gavel's.
        where = ("read from standard input, it has no folder to find simulation_throughputs.json in"
                 if str(args.trace) == STDIN else "no simulation_throughputs.json is in its folder or 5 above")
        err.print(f"[yellow]note:[/yellow] a Gavel trace's lengths are mini-batches, and {where}: they are converted to "
                  "time at the built-in table's rates, not Gavel's measured ones; give --throughputs FILE (or "
                  "--throughputs none to keep the built-in)")
    unknown = sorted({j.model for j in jobs if j.model and not model.knows(j.model)})
    if unknown:
        err.print(f"[yellow]note:[/yellow] {len(unknown)} model name(s) not in {escape(str(model.source))} "
                  f"(e.g. {escape(repr(unknown[0]))}); they run with the default model's figures")
    _note_sub_step_jobs(replayed(jobs, servers), model, err)  # (a skipped job may have no rate there)
    _note_extrapolated_rates(jobs, model, err)
    _note_spread_jobs(jobs, servers, model, err)
    note = skipped_note(jobs, servers)  # said once here, not by each policy's replay
    if note is not None:
        err.print(f"[yellow]note:[/yellow] {escape(note)}")
    runs = len(replayed(jobs, servers))
    load = offered_load(jobs, servers, model) if runs > 1 else float("nan")
    if args.target_load is not None:
        try:
            jobs, factor = scale_to_load(jobs, servers, model, args.target_load)
            first, last = min(j.submit_time for j in jobs), max(j.submit_time for j in jobs)
            if last > MAX_SUBMIT_S:
                # Past 1e11 s a float's step is too coarse for the replay's times: a 1-s job's JCT
                # came out as 0 or 512 s, and a policy's wake-up "0.1 s later" was "now" (no end).
                lowest = args.target_load * (last - first) / (MAX_SUBMIT_S - first)
                raise ValueError(f"--target-load {args.target_load:g} stretches the arrivals to {last:.3g} s, past "
                                 f"1e11 s (3,000 years), where virtual time loses its precision; give at least "
                                 f"{lowest:.3g} for this trace")
        except ValueError as exc:
            err.print(f"gandiva sim: [red]error:[/red] {escape(_said_as_flags(str(exc), args))}")
            return 2
        err.print(f"offered load {load:.3g} -> {args.target_load:g}: arrival times x{factor:.4g}")
    elif math.isfinite(load):
        err.print(f"offered load {load:.3g} (use --target-load to change it)")
    else:  # one job, or all arriving at once: no span to spread them over, nothing to scale
        err.print("offered load: not defined (" + ("one job" if runs < 2 else "all jobs arrive at the same time")
                  + "; --target-load cannot scale it)")
    _note_long_span(replayed(jobs, servers), err)
    left_out = f" ({len(jobs) - runs:,} of them skipped)" if runs < len(jobs) else ""
    total = sum(s.num_gpus for s in servers)
    err.print(f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}{left_out} on {args.cluster} ({total} GPU{'s' if total != 1 else ''}); "
              f"rates from {model.source}")
    if args.host_memory_gib:
        per = int(config.host_memory_use * args.host_memory_gib / model.job_host_memory_gib) \
            if model.job_host_memory_gib else None
        err.print(f"host memory {args.host_memory_gib:g} GiB per server, {model.job_host_memory_gib:g} GiB per job: "
                  + (f"at most {max(per, 1)} jobs per server, running and suspended" if per is not None
                     else "jobs hold none, nothing is bounded"))
    bound, critical = makespan_bound(jobs, servers, model)
    if critical is not None:
        spread = " spread over servers" if critical.num_gpus > max(s.num_gpus for s in servers) else ""
        gpus = f"{critical.num_gpus} GPU{'s' if critical.num_gpus != 1 else ''}"
        err.print(f"makespan lower bound {_hours(bound)}: job {escape(critical.id)} ({gpus}{spread}) "
                  f"cannot finish sooner under any policy")
    results = {name: _simulate(name, jobs, servers, model, config, args, err) for name in names}
    # Every job line of the trace is in one count: finished, unfinished, skipped (wider than
    # the cluster) or left out (--skip-invalid: a line that cannot be replayed).
    summaries = {name: {**summarize(r), "makespan_bound_s": bound, "jobs_left_out": len(left_out_jobs)}
                 for name, r in results.items()}
    # The summary first: a file that cannot be written (a full disk) after hours of replay
    # must not take the results with it (it was a traceback, and nothing printed).
    if args.output == "json":
        print(json.dumps(summaries, indent=2, sort_keys=True))
    else:
        _table(summaries, args.first_n)
    sys.stdout.flush()
    writing = args.jobs_csv
    try:
        if args.jobs_csv is not None:
            gone = {jid for jid, _ in left_out_jobs}
            specs = jobs + [j for j in every_job if j.id in gone]  # (--target-load scaled the kept jobs' times)
            rows = [row for r in results.values() for row in job_rows(r, specs, args.first_n, left_out_jobs)]
            _write_jobs_csv(args.jobs_csv, rows, args.first_n)
            err.print(f"wrote {escape(str(args.jobs_csv))} ({len(rows):,} rows: one per job and policy)")
        if args.plot is not None:
            from scheduler.sim.plots import write_plots

            writing = args.plot
            for path in write_plots(results, args.plot):
                err.print(f"wrote {escape(str(path))}")
    except OSError as exc:
        err.print(f"gandiva sim: [red]error:[/red] cannot write {escape(str(exc.filename or writing))}: "
                  f"{escape(exc.strerror or str(exc))} (the summary above is complete)")
        return 1
    return 0


# What the policy's config, the generator and the load scaling call a flag's value, where that is
# not the flag's name with "_" for "-": their refusals ("slice_growth must not be negative, got
# -1.0", "num_jobs must be at least 1, got 0", "target load must be positive") said a field of
# the code, not the flag the user gave.
_FIELDS_OF_FLAGS = {"num_jobs": "jobs", "target load": "target_load", "host memory": "host_memory_gib",
                    "quantum_s": "quantum", "fifo_after_s": "fifo_after", "share_block_after_s": "share_block_after",
                    "large_block_after_s": "large_block_after"}
_FIELD = re.compile(r"\b(?:target load|host memory|[a-z]+(?:_[a-z]+)+)\b")


def _said_as_flags(text: str, args: argparse.Namespace) -> str:
    """``text`` with each name of a flag's value (``slice_growth``) said as the flag (``--slice-growth``)."""
    def flag(match: re.Match[str]) -> str:
        dest = _FIELDS_OF_FLAGS.get(match[0], match[0])
        return "--" + dest.replace("_", "-") if hasattr(args, dest) else match[0]

    return _FIELD.sub(flag, text)


def _check_writable(path: Path, trace: Path | None, table: Path | None = None) -> None:
    """ValueError unless ``--jobs-csv PATH`` can be written (a folder that exists and is
    writable, and no folder of that name, nor the trace or the --throughputs table itself),
    said before a replay that may take hours. A pipe or a device (``/dev/stdout``) is
    written as it is."""
    for flag, given in (("--trace", trace), ("--throughputs", table)):
        if path.exists() and given is not None and given.exists() and os.path.samefile(path, given):
            what = "trace" if flag == "--trace" else "throughput table"
            raise ValueError(f"--jobs-csv {path} is the {flag} file: the rows would be written over the {what}; "
                             f"give another file")
    if path.is_dir():
        raise ValueError(f"--jobs-csv {path}: a folder; give a file name (e.g. {path / 'jobs.csv'})")
    if path.exists() and not path.is_file():
        return  # a pipe, a terminal, /dev/stdout: opened and written as it is
    folder = path.resolve().parent  # a link's target is replaced, not the link
    if not folder.is_dir():
        raise ValueError(f"--jobs-csv {path}: the folder {folder} does not exist; create it or give another file")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"--jobs-csv {path}: not writable; give a file you can write")


def _write_jobs_csv(path: Path, rows: list[dict[str, Any]], first_n: int) -> None:
    """Write the rows whole: to a temporary file beside ``path`` (beside its target, if a
    link), renamed over it, so that a stopped run never leaves half a file (nor a reader
    sees one). A pipe or a device (``/dev/stdout``) is written to as it is: renaming a file
    over it would replace the device's name, not write to it. A job id named after a trace
    file whose name is not UTF-8 (`w\\xff.csv`: ids `w\\udcff-0`) is written as stderr shows
    it, backslash-escaped (it was a UnicodeEncodeError traceback after the replay)."""
    def write(fh: Any) -> None:
        writer = csv.DictWriter(fh, fieldnames=job_columns(first_n))
        writer.writeheader()
        writer.writerows(rows)

    if path.exists() and not path.is_file():
        with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as fh:
            write(fh)
        return
    target = path.resolve()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8", errors="backslashreplace") as fh:
            write(fh)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _jobs_with_a_rate(jobs: list[JobSpec], servers: tuple, model: MechanismModel, skip: bool,
                      err: Any) -> tuple[list[JobSpec], list[tuple[str, str]]]:
    """The jobs without those the table gives a rate of 0 alone, and those (id, why).
    Gavel's K80 table measured 0 for models that did not fit its memory (ResNet-50, batch 128,
    on 2+ GPUs): such a job never ends (its length in time, divided by 0, was a
    ZeroDivisionError). ValueError names them, unless ``skip`` (--skip-invalid) leaves them
    out, said in a note and counted with the lines left out."""
    server = max(s.num_gpus for s in servers)

    def rate(job: JobSpec) -> float:  # the best it can get: alone, on one server if it fits one
        spread = model.spread(job.model, job.num_gpus) if job.num_gpus > server else 1.0
        return model.alone_rate(job.model, job.num_gpus) * spread

    rateless = [j for j in replayed(jobs, servers) if rate(j) <= 0]
    if not rateless:
        return jobs, []
    job = rateless[0]
    where = " spread over servers" if model.alone_rate(job.model, job.num_gpus) > 0 else ""
    why = (f"a rate of 0 in {model.source}: {job.model!r} on {job.num_gpus} GPU{'s' if job.num_gpus != 1 else ''}"
           f"{where} (e.g. job {job.id}) did not run there (measured as 0: out of memory), so they could never finish")
    fix = f"servers of {job.num_gpus} GPUs (--cluster) or another --gpu-type" if where else "another --gpu-type"
    kept = _refuse_or_leave_out(jobs, servers, rateless, f"have {why}", f"choose {fix}", skip, err)
    return kept, [(j.id, f"a rate of 0 in {model.source} for {j.model!r} on {j.num_gpus} GPU(s): it could not finish")
                  for j in rateless]


def _refuse_or_leave_out(jobs: list[JobSpec], servers: tuple, bad: list[JobSpec], what: str, fix: str, skip: bool,
                         err: Any) -> list[JobSpec]:
    """``jobs`` without ``bad`` (which ``what``, e.g. "have a rate of 0 ..."), said in a note,
    if ``skip`` (--skip-invalid); else, or when no job would be left to replay, ValueError
    saying what they are and ``fix`` (what to do)."""
    count = f"{len(bad):,} job(s)"
    if not skip:
        raise ValueError(f"{count} {what}; {fix}, or leave those jobs out (--skip-invalid)")
    gone = {j.id for j in bad}
    kept = [j for j in jobs if j.id not in gone]
    if not replayed(kept, servers):
        raise ValueError(f"no job can be replayed: {count} {what}; {fix}")
    err.print(f"[yellow]note:[/yellow] --skip-invalid left out {count} that {escape(what)}")
    return kept


def _jobs_of_a_length(jobs: list[JobSpec], servers: tuple, model: MechanismModel, skip: bool,
                      err: Any) -> tuple[list[JobSpec], list[tuple[str, str]]]:
    """The jobs without those that would run more than MAX_RUN_S even alone at their rate,
    and those (id, why). A Gavel job's length is steps, timed by the table's rate: a table
    of rates in another unit (1e-6 mini-batches/s) made two 1,000-step jobs on one GPU a
    gandiva replay of millions of slices (1e-300: one without end; the other policies
    printed an average JCT of 1.5e303 s). ValueError names them, unless ``skip`` leaves
    them out, said in a note and counted with the lines left out."""
    endless = [j for j in replayed(jobs, servers) if fastest_run_s(j, servers, model) > MAX_RUN_S]
    if not endless:
        return jobs, []
    job = max(endless, key=lambda j: fastest_run_s(j, servers, model))
    steps = f"{job.total_steps:g} mini-batches" if job.total_steps is not None else f"{job.duration_s:g} s"
    why = (f"would run more than {MAX_RUN_S:.0e} s (31 years) even alone at the rates of {model.source} (e.g. job "
           f"{job.id}: {steps} of {job.model or 'the default model'!r} on {job.num_gpus} GPU(s) at "
           f"{model.alone_rate(job.model, job.num_gpus):.3g} mini-batches/s: "
           f"{fastest_run_s(job, servers, model):.3g} s); no training job runs so long (a step count or a rate "
           f"in another unit?)")
    kept = _refuse_or_leave_out(jobs, servers, endless, why, "check the trace's lengths and the table's rates "
                                "(--throughputs)", skip, err)
    return kept, [(j.id, f"would run {fastest_run_s(j, servers, model):.3g} s even alone, more than {MAX_RUN_S:.0e} s")
                  for j in endless]


def _note_long_span(jobs: list[JobSpec], err: Any) -> None:
    """Say when the arrivals span more than MAX_RUN_S (31 years; real traces span months): a
    placeholder date (0001-01-01 or 1970-01-01 beside 2020's) or a time in another unit,
    which the replay waits through, so that the makespan and utilization count that span
    (a makespan of 2,000 years was printed without a word)."""
    if len(jobs) < 2:
        return
    first, last = min(jobs, key=lambda j: j.submit_time), max(jobs, key=lambda j: j.submit_time)
    span = last.submit_time - first.submit_time
    if span > MAX_RUN_S:
        err.print(f"[yellow]note:[/yellow] the arrivals span {span / (365.25 * 86400):,.0f} years (job "
                  f"{escape(first.id)} at {first.submit_time:.4g} s, job {escape(last.id)} at {last.submit_time:.4g} s):"
                  f" a placeholder date or a time in another unit? The replay waits through it, and the makespan "
                  f"and utilization count it")


def _note_sub_step_jobs(jobs: list[JobSpec], model: MechanismModel, err: Any) -> None:
    """Say which jobs are shorter than one mini-batch at their rate: the simulator runs a job
    in whole mini-batches, so each of them takes one (0.25 s for a 0.001 s job on the
    built-in table), and their JCT and the makespan are not the trace's."""
    def steps(job: JobSpec) -> float:
        if job.total_steps is not None:
            return job.total_steps
        return (job.duration_s or 0.0) * model.alone_rate(job.model, job.num_gpus)

    short = [j for j in jobs if steps(j) < 1]
    if short:
        job = min(short, key=steps)
        step_s = 1 / model.alone_rate(job.model, job.num_gpus)
        err.print(f"[yellow]note:[/yellow] {len(short):,} job(s) are shorter than one mini-batch at their rate "
                  f"(e.g. {escape(job.id)}: {duration_alone(job, model):.3g} s); each runs one whole mini-batch "
                  f"({step_s:.3g} s for that one), so their completion times are longer than the trace's")


def _note_extrapolated_rates(jobs: list[JobSpec], model: MechanismModel, err: Any) -> None:
    """Say which jobs ask more GPUs than the Gavel table measured for their model (it stops
    at 8): their rates are scaled linearly from the largest count measured, an assumption."""
    if model.gavel is None:
        return
    largest: dict[str, int] = {}
    for name, gpus in model.gavel:
        largest[name] = max(largest.get(name, 0), gpus)
    wide = [j for j in jobs if j.model in largest and j.num_gpus > largest[j.model]]
    if wide:
        job = max(wide, key=lambda j: j.num_gpus)
        err.print(f"[yellow]note:[/yellow] {len(wide):,} job(s) ask more GPUs than the table measured for their "
                  f"model (e.g. {escape(job.id)}: {job.num_gpus} GPUs, measured up to {largest[job.model]}): "
                  f"their rates are scaled linearly from the largest measured count (docs/simulator.md)")


def _note_spread_jobs(jobs: list[JobSpec], servers: tuple, model: MechanismModel, err: Any) -> None:
    """Say how many jobs are wider than a server: they can only run spread over servers, at
    the spread factor of their rate, so a trace's durations of them are not replayed as
    they are (an ITP trace on servers of 4 GPUs has thousands)."""
    server = max(s.num_gpus for s in servers)
    total = sum(s.num_gpus for s in servers)
    wide = [j for j in jobs if server < j.num_gpus <= total]
    factors = sorted({model.spread(j.model, j.num_gpus) for j in wide})
    if not wide or factors == [1.0]:
        return
    rate = f"{factors[0]:.2g}x" if len(factors) == 1 else f"{factors[0]:.2g}x to {factors[-1]:.2g}x"
    err.print(f"[yellow]note:[/yellow] {len(wide):,} job(s) ask more GPUs than a server has ({server}): they run "
              f"spread over servers at {rate} their rate alone, so they take longer than alone "
              f"(--spread-factor 1 replays their lengths as they are)")


def _simulate(name: str, jobs: list[JobSpec], servers: tuple, model: MechanismModel,
              config: PolicyConfig, args: argparse.Namespace, err: Any) -> SimResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if args.no_progress or not err.is_terminal:
        return Simulator(jobs, servers, get_policy(name, config), model, first_n=args.first_n,
                         warn_skipped=False).run()
    with Progress(TextColumn(f"{name:>9}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("jobs done"), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(name, total=len(jobs))
        last = [-1]

        def progress(done: int, total: int) -> None:
            if done != last[0]:
                last[0] = done
                bar.update(task, completed=done)

        return Simulator(jobs, servers, get_policy(name, config), model, first_n=args.first_n,
                         progress=progress, warn_skipped=False).run()


def _table(summaries: dict[str, dict[str, Any]], first_n: int) -> None:
    from rich.table import Table

    rows = [
        ("avg JCT", "avg_jct_s", _hours), ("median JCT", "median_jct_s", _hours),
        ("p95 JCT", "p95_jct_s", _hours), ("makespan", "makespan_s", _hours),
        ("makespan lower bound (any policy)", "makespan_bound_s", _hours),
        ("avg queueing delay", "avg_queueing_delay_s", _hours),
        (f"avg time to first {first_n} mini-batches", "avg_time_to_first_n_s", _seconds),
        ("GPU utilization", "utilization", lambda v: f"{100 * v:.1f}%"),
        ("suspends", "suspends", str),
        ("parked to disk (probe_slices)", "parks", str), ("packs (kept or tried)", "packs", str),
        ("unpacks", "unpacks", str), ("migrations", "migrations", str),
        ("grows / shrinks", None, None),
        ("most suspended jobs on one server (host memory)", "max_suspended_per_server",
         lambda v: "-" if v is None else str(v)), ("jobs finished", "jobs_finished", str),
        ("jobs unfinished", "jobs_unfinished", str),
        ("jobs skipped (more GPUs than the cluster)", "jobs_skipped", str),
        # (a format's records that are no GPU job, such as Helios's CPU jobs, and --skip-invalid's lines)
        ("jobs left out (no GPU job, or --skip-invalid)", "jobs_left_out", str),
    ]
    if not any(s.get("jobs_left_out") for s in summaries.values()):
        rows = [r for r in rows if r[1] != "jobs_left_out"]
    if not any(s.get("parks") for s in summaries.values()):
        rows = [r for r in rows if r[1] != "parks"]
    table = Table()
    table.add_column("metric")
    for name in summaries:
        table.add_column(name, justify="right")
    for label, key, fmt in rows:
        if key is None:
            cells = [f"{s['grows']} / {s['shrinks']}" for s in summaries.values()]
        else:
            cells = [fmt(s[key]) for s in summaries.values()]  # type: ignore[operator]
        table.add_row(label, *cells)
    _console().print(table)


def _hours(seconds: float) -> str:
    """Hours, or seconds below 36 s (0.01 h): a trace of short jobs printed 0.00 h in every
    row, which says nothing (and a nonzero time read as none)."""
    if 0 < seconds < 36:
        return f"{seconds:.3g} s"
    return f"{seconds / 3600:.2f} h"


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s"


def _console(stderr: bool = False) -> Any:
    from scheduler.cli.output import Console

    # soft_wrap: messages naming files must stay on one line, whatever the terminal width.
    return Console(stderr=stderr, file=sys.stderr if stderr else sys.stdout, soft_wrap=stderr,
                   highlight=False)
