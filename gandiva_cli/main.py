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
    "scheduler.cli.maintenance",  # gandiva cordon|uncordon|drain
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
    # Also accepted before the command (`gandiva --scheduler ADDR get jobs`), as the
    # usual habit of CLIs with global options; run() hands it to the command.
    parser.add_argument("--scheduler", dest="global_scheduler", metavar="ADDR",
                        help="scheduler address for the command (also accepted after it)")
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
    _describe_subcommands(parser)
    return parser


def _describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """A subcommand's --help opens with the line its parent lists it with, where it has no
    description of its own (`gandiva migrate --help` said nothing of what it does)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        said = {choice.dest: choice.help for choice in action._choices_actions}
        for name, child in action.choices.items():
            if child.description is None and said.get(name):
                text = str(said[name])
                child.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
            _describe_subcommands(child)


def main(argv: Sequence[str] | None = None) -> int:
    from scheduler.cli.output import quiet_on_broken_pipe, refuse_text_not_utf8

    # Output piped into a reader that stopped (`gandiva describe job ID | head -1`): the
    # reader has what it wanted; exit quietly, with the command's own code, or 0 when
    # cut short (what was asked was done; the rest was output).
    try:
        return quiet_on_broken_pipe(lambda: refuse_text_not_utf8(
            "gandiva", lambda: run(sys.argv[1:] if argv is None else list(argv))))
    except KeyboardInterrupt:
        # Ctrl-C in a command without its own answer to it (tls init, token create, a
        # scheduler still starting): one line, not a traceback through cryptography or alembic.
        print("gandiva: interrupted", file=sys.stderr)
        return 130


def run(argv: list[str]) -> int:
    parser = build_parser()
    _check_leading_options(parser, argv)
    args = parser.parse_args(_describe_job_implied(argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.global_scheduler is not None:
        if not hasattr(args, "scheduler"):
            parser.error(f"--scheduler: `gandiva {args.command}` takes no scheduler address")
        if args.scheduler is None:  # given after the command too: that one wins
            args.scheduler = args.global_scheduler
    return int(args.func(args) or 0)


def _describe_job_implied(argv: list[str]) -> list[str]:
    """`gandiva describe ID` as `gandiva describe job ID` (a kind left out is a job): it was
    "argument job: invalid choice: 'j-...' (choose from 'job')"."""
    i = 0
    while i < len(argv) and argv[i].startswith("--scheduler"):
        i += 1 if "=" in argv[i] else 2
    if argv[i:i + 1] == ["describe"] and len(argv) > i + 1 and argv[i + 1] not in ("job", "server") \
            and not argv[i + 1].startswith("-"):
        return [*argv[:i + 1], "job", *argv[i + 1:]]
    return argv


def _check_leading_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option before the command other than --scheduler (`gandiva -o json get jobs`)
    would be read as the command's name ("invalid choice: 'json'"); say where it goes."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "--", "-h", "--help"):
        arg = argv[i]
        if arg == "--scheduler":
            i += 2
            continue
        if arg.startswith("--scheduler="):
            i += 1
            continue
        parser.error(f"{arg}: options go after the command, e.g. gandiva get jobs {arg} ...; "
                     "only --scheduler may come before it")


if __name__ == "__main__":
    sys.exit(main())
