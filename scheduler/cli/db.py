"""`gandiva db upgrade|current|downgrade`: manage the schema of the state database."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from scheduler.cli.argtypes import db_flag_on_actions, non_negative_days
from scheduler.cli.client import EXIT_INTERRUPTED
from scheduler.config import default_db_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="upgrade, inspect or downgrade the state database schema")
    p.add_argument("--db", default=os.environ.get("GANDIVA_DB"), help="database URL (default: the embedded SQLite file)")
    actions = p.add_subparsers(dest="db_action", metavar="ACTION", required=True)
    up = actions.add_parser("upgrade", help="migrate to the newest schema (or REVISION)")
    up.add_argument("revision", nargs="?", default="head", metavar="REVISION", help="revision to migrate to (default: head, the newest)")
    actions.add_parser("current", help="print the schema revision in the database")
    down = actions.add_parser("downgrade", help="migrate down to REVISION (e.g. base)")
    down.add_argument("revision", metavar="REVISION",
                      help="revision to migrate down to (base: before the first); an unknown one is refused with the list")
    prune = actions.add_parser(
        "prune", help="delete events of jobs that finished more than DAYS ago",
        description="Delete the events of jobs that finished more than --older-than DAYS ago, "
        "and server events older than that; with --jobs, those finished jobs too. Unfinished "
        "jobs are never touched. Safe while the scheduler runs.")
    prune.add_argument("--older-than", type=non_negative_days, required=True, metavar="DAYS",
                       help="age in days (fractions allowed)")
    prune.add_argument("--jobs", action="store_true", help="also delete the finished jobs themselves")
    db_flag_on_actions(actions, "database URL (default: $GANDIVA_DB, else the embedded SQLite file)")
    p.set_defaults(func=run)


class CommandFailed(Exception):
    """The command could not do its work; nothing was changed. Said as it is, exit 2."""


class SchedulerRunning(Exception):
    """A scheduler holds the database: a downgrade under it would break it."""


def run(args: argparse.Namespace) -> int:
    from scheduler.state import migrate

    url = args.db or default_db_url()

    async def go(engine) -> str:  # type: ignore[no-untyped-def]
        if args.db_action == "prune":
            return await _prune(engine, args)
        if args.db_action == "upgrade":
            await migrate.upgrade(engine, args.revision)
        elif args.db_action == "downgrade":
            # Under a running scheduler it dropped the columns that scheduler reads: every call
            # then answered "its database is unreachable (no such column: jobs.total_steps)".
            # The scheduler's own lock: held here, no scheduler starts mid-downgrade either.
            from scheduler.state.owner import DatabaseHeld, SchedulerLock

            lock = SchedulerLock(url, "gandiva db downgrade", url)
            try:
                await lock.acquire()
            except DatabaseHeld as held:
                holder = str(held).split("(", 1)[-1].split(")", 1)[0]
                raise SchedulerRunning(f"a scheduler is running on this database ({holder}): stop it first; a "
                                       "downgrade under it drops what it reads and writes. Nothing was changed") from None
            try:
                await migrate.downgrade(engine, args.revision)
            finally:
                await lock.release()
        return (await migrate.current(engine)) or "base (empty)"

    async def revision(engine) -> str:  # type: ignore[no-untyped-def]
        at = (await migrate.current(engine)) or "base (empty)"
        return (f"the database is at revision {at} (an upgrade or downgrade is one transaction: "
                "what was not committed was rolled back); run the command again to finish")

    return run_on_db("gandiva db", url, go, create=args.db_action == "upgrade",
                     after_interrupt=revision if args.db_action in ("upgrade", "downgrade") else None)


def run_on_db(prog: str, url: str, work: Callable[[Any], Awaitable[str]], create: bool,
              after_interrupt: Callable[[Any], Awaitable[str]] | None = None) -> int:
    """Print what ``work(engine)`` returns; every failure is one line on stderr naming --db
    (exit 2). ``create``: the command may create a missing SQLite file; others refuse one,
    so a mistyped path does not leave an empty database behind. Ctrl-C: one line (exit
    130), with what ``after_interrupt(engine)`` says of the database then."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.errors import GandivaError, InvalidArgument
    from scheduler.server import _db_trouble, _redact, check_db_url
    from scheduler.state import migrate
    from scheduler.state.db import make_engine

    async def go(work: Callable[[Any], Awaitable[str]]) -> str:
        engine = make_engine(url)
        try:
            return await work(engine)
        except Exception as err:
            # Ctrl-C cancels this task (asyncio.run); the rollback on the way out may fail in
            # its own words ("Can't reconnect until invalid transaction is rolled back"), which
            # was printed instead of the interrupt.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from err
            raise
        finally:
            await engine.dispose()

    try:
        check_db_url(url)
    except ValueError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    try:
        missing = None if create else _missing_sqlite_file(url)
        if missing is not None:
            print(f"{prog}: no database at {missing} (nothing was created); check --db or "
                  "GANDIVA_DB/GANDIVA_HOME, or create it with `gandiva db upgrade`", file=sys.stderr)
            return 2
        said = asyncio.run(go(work))
        if said:  # "": the work printed what it had to itself
            print(said)
    except KeyboardInterrupt:
        said = ""
        if after_interrupt is not None:
            try:
                said = f"; {asyncio.run(go(after_interrupt))}"
            except (Exception, KeyboardInterrupt):  # noqa: BLE001 - what it says is a bonus
                said = ""
        print(f"{prog}: interrupted{said}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except GandivaError as err:
        # make_engine names the field `db`: say it as the flag.
        text = f"--{err}" if isinstance(err, InvalidArgument) and err.field == "db" else str(err)
        print(f"{prog}: {text}", file=sys.stderr)
        return 2
    except SchedulerRunning as err:
        print(f"{prog}: --db {_redact(url)}: {err}", file=sys.stderr)
        return 2
    except CommandFailed as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except migrate.Refused as err:  # before CommandError: say which gandiva to use, or why
        print(f"{prog}: --db {_redact(url)}: {err}", file=sys.stderr)
        return 2
    except CommandError as err:  # a revision that is not there, or not reachable from here
        print(f"{prog}: {err}; revisions: base, {', '.join(_revisions())} (head)", file=sys.stderr)
        return 2
    except (OSError, SQLAlchemyError) as err:  # not a database, cannot be opened, not reachable
        print(f"{prog}: --db {_redact(url)}: {_db_trouble(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - any failure: one line for the operator, exit 1
        print(f"{prog}: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}",
              file=sys.stderr)
        return 1
    return 0


def _missing_sqlite_file(url: str) -> str | None:
    """The path of an SQLite database file that does not exist, else None."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)  # checked by check_db_url
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return None if os.path.exists(parsed.database) else parsed.database


def _revisions() -> list[str]:
    """The schema revisions, oldest first."""
    from alembic.script import ScriptDirectory

    from scheduler.state import migrate

    script = ScriptDirectory.from_config(migrate.alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


async def _prune(engine, args: argparse.Namespace) -> str:  # type: ignore[no-untyped-def]
    from scheduler.core import SchedulerCore
    from scheduler.errors import InvalidArgument
    from scheduler.state import migrate, prune

    if not args.older_than >= 0:
        raise InvalidArgument("--older-than", f"{args.older_than}: give 0 or more days")
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    try:
        done = await prune.prune(core, args.older_than * 86400.0, jobs=args.jobs)
    finally:
        await core.dispose()
    return f"deleted {done.events} events and {done.jobs} jobs"
