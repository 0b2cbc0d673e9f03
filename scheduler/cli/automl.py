"""`gandiva automl`: successive halving or Hyperband over a sweep, from the metric the jobs report.

Every configuration of the sweep starts at once (the scheduler time-slices them); at each
rung of --min-steps x eta^r mini-batches the best 1/eta (by --metric, --mode) get a larger
share of the GPUs and the others are killed; the best is printed.

  --algorithm sha (default): one bracket, until one configuration is left.
  --algorithm hyperband: the configurations are dealt into brackets that start halving
      at --max-steps x eta^-s mini-batches (the last bracket stops none early); the
      survivors of every bracket run to --max-steps and the best there wins. Slower to
      answer than sha; it hedges against early feedback that misleads.
  --async: decide each job at a rung as soon as its fate is certain (same choices,
      without waiting for the rung's slowest entrant).

The sweep file and the {param} placeholders are those of `gandiva-submit --sweep`.
Python API: scheduler.automl.SuccessiveHalving, scheduler.automl.Hyperband.
"""

from __future__ import annotations

import argparse
import os
import sys

from scheduler.cli.argtypes import positive_seconds
from scheduler.cli.client import CliError, add_security_flags, client_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "automl", help="hyper-parameter search with early feedback (successive halving, Hyperband) over a sweep",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="gandiva automl --sweep FILE --metric NAME [--mode min|max] [--algorithm sha|hyperband] "
              "[options] -- COMMAND [ARG ...]")
    p.add_argument("--sweep", required=True, metavar="FILE",
                   help="sweep file: 'grid:' of value lists, or 'list:' of parameter sets")
    p.add_argument("--metric", required=True, help="the metric to rank by, as the jobs report it (e.g. loss)")
    p.add_argument("--mode", choices=("min", "max"), default="min", help="min: lower is better (default); max")
    p.add_argument("--min-steps", type=int, default=50, help="mini-batches before the first rung (default 50)")
    p.add_argument("--eta", type=int, default=2, help="keep the best 1/eta at each rung (default 2)")
    p.add_argument("--algorithm", choices=("sha", "hyperband"), default="sha",
                   help="sha: successive halving until one is left (default); hyperband: brackets")
    p.add_argument("--hyperband", dest="algorithm", action="store_const", const="hyperband",
                   help="the same as --algorithm hyperband")
    p.add_argument("--max-steps", type=int, default=None,
                   help="hyperband: the budget survivors are compared at (required with hyperband)")
    p.add_argument("--async", dest="asynchronous", action="store_true",
                   help="decide each job at a rung as soon as its fate is certain")
    p.add_argument("--seed", type=int, default=0, help="hyperband: how configurations are dealt into brackets")
    p.add_argument("--gpus", type=int, default=1, help="GPUs per configuration (default 1)")
    p.add_argument("--name", help="the multi-job's name (default: the sweep's name, else the script's)")
    p.add_argument("--workdir", help="working directory of the jobs (default: the current one)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable in the jobs' environment (repeatable)")
    p.add_argument("--timeout", type=positive_seconds, default=3600, help="give up after this many seconds (default 3600)")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="scheduler address (default: $GANDIVA_SCHEDULER, else 127.0.0.1:50051)")
    add_security_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="after --: the training command")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scheduler.automl import AutoMLError, Hyperband, SuccessiveHalving
    from scheduler.cli.spec import SpecError
    from scheduler.cli.submit import build_submission

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # The same flags as gandiva-submit, so that specs are built exactly as it builds them.
    submit_args = argparse.Namespace(
        file=None, name=args.name, gpus=args.gpus, priority=1, grow_shrink=None, workdir=args.workdir,
        env=args.env, env_pass=[], no_default_env=False, sweep=args.sweep, array=None, steps=None)
    try:
        if not command or not command[0].strip():  # gandiva-submit's own words named gandiva-submit
            raise SpecError("command: nothing to run; put it after --, e.g. gandiva automl --sweep sweep.yaml "
                            "--metric loss -- python train.py --lr {lr}")
        submission = build_submission(submit_args, command, os.environ, os.getcwd())
        def say(text: str) -> None:
            print(text, flush=True)

        search: SuccessiveHalving
        if args.algorithm == "hyperband":
            if args.max_steps is None:
                raise ValueError("--algorithm hyperband needs --max-steps (the budget survivors are compared at)")
            search = Hyperband(client_from_args(args), args.metric, args.mode, args.min_steps, args.max_steps,
                               args.eta, on_event=say, asynchronous=args.asynchronous, seed=args.seed)
        else:
            if args.max_steps is not None:
                raise ValueError("--max-steps is for --algorithm hyperband; sha runs until one is left")
            search = SuccessiveHalving(client_from_args(args), args.metric, args.mode, args.min_steps, args.eta,
                                       on_event=say, asynchronous=args.asynchronous)
        result = search.run(submission.name, submission.jobs, args.timeout)
    except (SpecError, ValueError) as err:
        print(f"gandiva automl: {err}", file=sys.stderr)
        return 2
    except (CliError, AutoMLError) as err:
        print(f"gandiva automl: {err}", file=sys.stderr)
        return 1
    params = " ".join(f"{k}={v}" for k, v in sorted(result.best_params.items()))
    print(f"best: {params} {args.metric}={result.best_value:.6g} (job {result.best_job}, "
          f"identified after {result.identified_after_s:.1f}s); it keeps training: gandiva get jobs {result.best_job}")
    return 0
