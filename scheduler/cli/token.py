"""`gandiva token create|list|revoke`: the credentials the scheduler accepts with
`--auth token`. Run on the scheduler's host against its database; a token is
printed once and only its hash is stored."""

from __future__ import annotations

import argparse
import os
import sys
import time

from scheduler.cli.argtypes import db_flag_on_actions
from scheduler.config import default_db_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="create, list or revoke access tokens (administrator)",
                       description="Manage the tokens a scheduler started with --auth token "
                       "accepts. Runs against the scheduler's database directly.")
    p.add_argument("--db", default=os.environ.get("GANDIVA_DB"),
                   help="database URL (default $GANDIVA_DB, else the embedded SQLite file)")
    actions = p.add_subparsers(dest="token_action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create", help="make a token for NAME and print it (once)",
        description="A user token by default: it sees and acts on NAME's own jobs only. "
        "--operator: on all jobs. --helper: for the Migration Helper of server NAME "
        "(it can act only as that server, and hands each job it launches a token "
        "scoped to that job).")
    create.add_argument("name", metavar="NAME", help="user name, or the server name for --helper")
    role = create.add_mutually_exclusive_group()
    role.add_argument("--operator", action="store_true", help="may see and act on every job")
    role.add_argument("--helper", action="store_true", help="a server's Migration Helper")
    actions.add_parser("list", help="list token names, roles and states (never the tokens)")
    revoke = actions.add_parser("revoke", help="revoke NAME's token (takes effect within seconds)")
    revoke.add_argument("name", metavar="NAME", help="whose token (as `gandiva token list` shows)")
    db_flag_on_actions(actions, "database URL (default $GANDIVA_DB, else the embedded SQLite file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scheduler import auth
    from scheduler.cli.db import CommandFailed, run_on_db
    from scheduler.state import migrate
    from scheduler.state.db import make_sessionmaker

    async def go(engine) -> str:  # type: ignore[no-untyped-def]
        await migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        async with sessions() as s, s.begin():
            if args.token_action == "create":
                role = "operator" if args.operator else "helper" if args.helper else "user"
                token = await auth.create_token(s, args.name, role)
                print(f"token for {role} {args.name} (shown once; store it safely):",
                      file=sys.stderr)
                # Shown before it is committed: output that cannot be written (`> file` on a
                # full disk, a closed pipe) stored a token nobody had seen, and the rerun
                # said "already has a token; revoke it first" (the error blamed --db).
                try:
                    print(token, flush=True)
                except OSError as err:
                    raise CommandFailed(
                        f"cannot write the token to standard output ({err.strerror or err}): no token was "
                        "created; run the command again with its output going where it can be "
                        "written") from None
                return ""
            if args.token_action == "revoke":
                await auth.revoke_token(s, args.name)
                return f"revoked the token of {args.name}"
            rows = await auth.list_tokens(s)
        lines = [f"{'NAME':<24} {'ROLE':<9} {'CREATED':<20} STATE"]
        for r in rows:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))
            state = "revoked " + time.strftime("%Y-%m-%d %H:%M", time.localtime(r.revoked_at)) \
                if r.revoked_at else "active"
            lines.append(f"{r.name:<24} {r.role:<9} {created:<20} {state}")
        return "\n".join(lines)

    # `create` may make the database (tokens before the scheduler's first start); `list` and
    # `revoke` of a missing file say so instead of creating an empty one.
    return run_on_db("gandiva token", args.db or default_db_url(), go, create=args.token_action == "create")
