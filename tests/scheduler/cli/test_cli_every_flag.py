"""Every number flag of every command, gandiva-submit's too (walked from the argparse definitions, so a flag added
later is walked too) given 0, -1, 1e-9, nan, inf, 1e400, a huge whole number, nothing, and a
byte that is not UTF-8: refused by argparse in one line naming the flag (exit 2), or taken.
What is taken is listed below with why: checked when the command runs (naming the flag, each
in its own test), or a value that works (0 for "off", 1e-9 for "at once", huge for "never")."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
from collections.abc import Iterator

import pytest

from gandiva_cli.main import build_parser

VALUES = ("0", "-1", "1e-9", "nan", "inf", "1e400", "99999999999999999999999", "", "1\udcff")
HUGE = "99999999999999999999999"
NEVER, OFF_OR_NEVER, AT_ONCE_OR_NEVER = [HUGE], ["0", HUGE], ["0", "1e-9", HUGE]
SINCE = ["1e-9", HUGE]  # how long ago: now, or before 1970 (from the start)
WHOLE = ["0", "-1", HUGE]  # argparse's int: the command checks the range as it runs
FRACTION = ["0", "-1", "1e-9", HUGE]  # gandiva sim's finite numbers: ranges checked as it runs
PLAIN_FLOAT = ["0", "-1", "1e-9", "nan", "inf", "1e400", HUGE]  # `gandiva helper`: checked at its start

# (command, flag) -> the values of VALUES that argparse takes. A flag not listed takes none.
TAKEN = {
    # Huge: the scheduler's timers (asyncio's) wait as long as they are asked; a time slice,
    # round, timeout or wait that never ends, as given. 0 turns off what says so in --help.
    ("scheduler", "--quantum"): NEVER, ("scheduler", "--tick"): NEVER,
    ("scheduler", "--heartbeat-interval"): NEVER, ("scheduler", "--runtime-connect-deadline"): NEVER,
    ("scheduler", "--checkpoint-interval"): OFF_OR_NEVER, ("scheduler", "--max-jobs-per-user"): OFF_OR_NEVER,
    ("scheduler", "--event-retention-days"): OFF_OR_NEVER,
    ("scheduler", "--checkpoint-wait"): AT_ONCE_OR_NEVER, ("scheduler", "--hang-after"): AT_ONCE_OR_NEVER,
    ("scheduler", "--hang-restart-after"): AT_ONCE_OR_NEVER,
    # Checked against each other at start, naming the flags (test_cli_bad_input.py -k lease_names).
    ("scheduler", "--heartbeat-timeout"): ["1e-9", HUGE], ("scheduler", "--lease"): ["1e-9", HUGE],
    # Ranges checked as the command runs, naming the flag (test_cli_bad_input.py
    # -k "client_flags or times_and_indices", test_cli_build, tls -k days, automl, bench).
    ("tls init", "--days"): WHOLE, ("tls client", "--days"): WHOLE,
    ("get jobs", "--limit"): WHOLE, ("get usage", "--limit"): WHOLE, ("get placements", "--gpu"): WHOLE,
    ("get placements", "--limit"): WHOLE, ("get events", "--after"): WHOLE, ("get events", "--limit"): WHOLE,
    ("get usage", "--since"): SINCE, ("get usage", "--until"): SINCE, ("get placements", "--at"): SINCE,
    ("get placements", "--since"): SINCE, ("get placements", "--until"): SINCE,
    ("get events", "--since"): SINCE, ("get events", "--until"): SINCE,
    ("wait", "--timeout"): SINCE, ("wait", "--reconnect-timeout"): SINCE, ("drain", "--timeout"): SINCE,
    ("top", "--decisions"): SINCE, ("demo", "--timeout"): SINCE, ("automl", "--timeout"): SINCE,
    ("demo", "--steps"): NEVER, ("bench migration", "--repeats"): WHOLE,
    **{("automl", flag): WHOLE for flag in ("--min-steps", "--eta", "--max-steps", "--seed", "--gpus")},
    ("helper", "--gpus"): WHOLE,  # test_cli_bad_input.py -k helper_refuses_at_start
    **{("helper", flag): PLAIN_FLOAT
       for flag in ("--checkpoint-retain", "--sample-interval", "--lease", "--max-transfer-gib")},
    # gandiva sim: its own checks as it starts (tests/scheduler/sim/).
    ("sim", "--jobs"): WHOLE, ("sim", "--seed"): WHOLE, ("sim", "--defrag-free-gpus"): WHOLE,
    ("sim", "--max-jobs-per-gpu"): WHOLE, ("sim", "--first-n"): NEVER,
    **{("sim", flag): FRACTION for flag in (
        "--target-load", "--host-memory-gib", "--quantum", "--slice-growth", "--fifo-after", "--starve-factor",
        "--share-block-after", "--large-block-after", "--job-host-memory-gib", "--spread-factor")},
    **{("sim", flag): AT_ONCE_OR_NEVER for flag in ("--suspend-resume-s", "--migrate-s", "--restart-s")},
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) not in seen:  # an alias
                seen.add(id(child))
                yield from _leaves(child, (*path, name))
    if not subs:
        yield path, parser


def _is_number_flag(action: argparse.Action) -> bool:
    if not action.option_strings or not callable(action.type):
        return False
    for sample in ("1", "60", "1000"):  # one a type with a floor takes
        try:
            return isinstance(action.type(sample), (int, float))
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    return False


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Arguments the command cannot be parsed without (an id, a directory, --server-name)."""
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*", argparse.SUPPRESS) \
                and action.dest != "help":
            argv += ["x"] * (action.nargs if isinstance(action.nargs, int) else 1)
        elif action.option_strings and action.required:
            argv += [action.option_strings[-1], "x"]
    return argv


def test_every_number_flag_refuses_what_cannot_work_naming_itself_or_takes_it_as_listed() -> None:
    root = build_parser()
    taken: dict[tuple[str, str], list[str]] = {}
    walked = 0
    for path, parser in _leaves(root):
        for action in parser._actions:
            if not _is_number_flag(action):
                continue
            flag, walked = max(action.option_strings, key=len), walked + 1
            for value in VALUES:
                err = io.StringIO()
                try:
                    with contextlib.redirect_stderr(err):
                        parsed = root.parse_args([*path, f"{flag}={value}", *_required(parser)])
                except SystemExit as exit_:
                    last = err.getvalue().strip().splitlines()[-1]
                    assert exit_.code == 2 and f"error: argument {flag}: " in last, (path, flag, value, last)
                    assert "Traceback" not in err.getvalue()
                    continue
                got = getattr(parsed, action.dest)
                if path != ("helper",):  # the helper refuses these at its start, naming the flag
                    assert not (isinstance(got, float) and not math.isfinite(got)), (path, flag, value, got)
                taken.setdefault((" ".join(path), flag), []).append(value)
    assert walked >= 60, walked  # the walk found the flags
    assert taken == TAKEN


# gandiva-submit's: each range is checked as it runs, naming the flag (test_cli_bad_input.py,
# test_cli_submit_e2e.py); --reconnect-timeout 0 gives up at once, a huge one never.
TAKEN_BY_SUBMIT = {"--gpus": WHOLE, "--priority": WHOLE, "--steps": NEVER, "--reconnect-timeout": AT_ONCE_OR_NEVER}


def test_every_number_flag_of_gandiva_submit_too() -> None:
    from scheduler.cli.submit import build_parser as submit_parser

    parser = submit_parser()
    taken: dict[str, list[str]] = {}
    for action in parser._actions:
        if not _is_number_flag(action):
            continue
        flag = max(action.option_strings, key=len)
        for value in VALUES:
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    parsed = parser.parse_known_args([f"{flag}={value}"])[0]  # the command follows `--`
            except SystemExit as exit_:
                last = err.getvalue().strip().splitlines()[-1]
                assert exit_.code == 2 and f"error: argument {flag}: " in last, (flag, value, last)
                continue
            got = getattr(parsed, action.dest)
            assert not (isinstance(got, float) and not math.isfinite(got)), (flag, value, got)
            taken.setdefault(flag, []).append(value)
    assert taken == TAKEN_BY_SUBMIT


def test_top_refuses_an_interval_its_sleep_cannot_take() -> None:
    """`gandiva top --interval 1e23` showed one view, then ended in a traceback
    (OverflowError: timestamp out of range for platform time_t) from its first sleep."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["top", "--interval", "1e23"])
    assert exit_.value.code == 2
    assert err.getvalue().splitlines()[-1] == (
        "gandiva top: error: argument --interval: at most 86,400 seconds (a day), got '1e23'; for one view, "
        "give --once")
    assert build_parser().parse_args(["top", "--interval", "86400"]).interval == 86400.0
