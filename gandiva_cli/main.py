"""`gandiva`: the operator's command line. Each subcommand lives in its own module.

A module in SUBCOMMAND_MODULES exposes ``register(subparsers)``, which adds its
parsers and sets ``func`` (taking the parsed args, returning the exit code).

This entry point lives outside the packages it assembles: the scheduler's commands
(scheduler.cli), the Migration Helper's (`gandiva helper`, `logs`, `bench`) and the
simulator's, so that `scheduler/` never imports `migration_helper/` (issue 9).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMAND_MODULES = [
    "scheduler.cli.serve",      # gandiva scheduler
    "scheduler.cli.db",         # gandiva db upgrade|current|downgrade|prune
    "scheduler.cli.token",      # gandiva token create|list|revoke
    "scheduler.cli.tls",        # gandiva tls init
    "scheduler.cli.ops",        # gandiva get|describe|kill|suspend|resume|priority|migrate
    "migration_helper.cli",     # gandiva helper, gandiva logs
    "scheduler.sim.cli",        # gandiva sim
    "migration_helper.bench_cli",  # gandiva bench ...
    "scheduler.cli.demo",       # gandiva demo
    "scheduler.cli.top",        # gandiva top
    "scheduler.cli.automl",     # gandiva automl
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gandiva",
        description="Gandiva: introspective cluster scheduling for deep-learning training.",
        epilog="Clients find the scheduler from --scheduler ADDR or GANDIVA_SCHEDULER "
        "(default 127.0.0.1:50051). Submit jobs with gandiva-submit.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # Only a missing subcommand module itself is tolerated (a partial
            # install); an import error inside a module is a bug and propagates.
            if err.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
