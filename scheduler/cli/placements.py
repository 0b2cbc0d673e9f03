"""`gandiva get placements`: who held which GPU when (the ``ListPlacements`` call;
docs/observability.md, "Who was on a GPU when")."""

from __future__ import annotations

import argparse
import time
from typing import Any

from protos.gandiva.v1 import scheduler_pb2
from scheduler.cli import output
from scheduler.cli.argtypes import point_in_time
from scheduler.cli.client import EXIT_OK, Client, CliError

DESCRIPTION = """\
Which job held which GPU when, from the GPUs' history the scheduler keeps in its database
(across its restarts; placements from the upgrade to 0010_gpu_holds, session 49, on).

--at WHEN lists the jobs on the GPUs at that instant, each with what it did then:
  running     it ran there
  suspended   it waited there for its time slice (a time-slice partner ran), or an operator held it
  migrating   it was being moved away from there
--since/--until list every placement that overlapped the period (default: the last hour).
One line per job and GPU:

  SERVER GPU  the GPU
  JOB NAME USER
  FROM UNTIL  when the job was placed there and when it left it (now: it holds it still)
  HELD        for how long (until now, for one it holds still)

A packed or time-sliced GPU has several jobs at once. A user's token sees its own jobs by
name, others' as hidden-N (the GPU still shows as held).

WHEN is how long ago (90s, 30m, 12h, 7d), a time of day (03:12: the latest one) or a date with
an optional time of day, by this machine's clock unless it names its zone: 2026-11-30,
2026-11-30T03:12, 2026-11-30T03:12Z.

  gandiva get placements --at 03:12 --server node-b --gpu 3     # who was on GPU 3 of node-b at 03:12?
  gandiva get placements --job j-8d0de09391 --since 7d            # where did my job run this week?
  gandiva get placements --since 2026-12-06T03:00 --until 2026-12-06T04:00 -o json
"""

HEADERS = ["SERVER", "GPU", "JOB", "NAME", "USER", "FROM", "UNTIL", "HELD"]
HOUR = 3600.0


def register(kinds: Any, common: argparse.ArgumentParser, set_handler: Any) -> None:
    cmd = kinds.add_parser("placements", aliases=["placement"], parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           help="who held which GPU when: at an instant (--at) or over a period",
                           description=DESCRIPTION)
    cmd.add_argument("--at", type=point_in_time, default=None, metavar="WHEN",
                     help="the jobs on the GPUs at this instant, with what each did then")
    cmd.add_argument("--since", type=point_in_time, default=None, metavar="WHEN",
                     help="the period's start (default: 1h, the last hour)")
    cmd.add_argument("--until", type=point_in_time, default=None, metavar="WHEN",
                     help="the period's end (default: now)")
    cmd.add_argument("--server", default="", metavar="NAME", help="only this server's GPUs")
    cmd.add_argument("--gpu", type=int, default=-1, metavar="N", help="only this GPU index (0, 1, ...)")
    cmd.add_argument("--job", default="", metavar="ID", help="only this job's GPUs")
    cmd.add_argument("--limit", type=int, default=0, metavar="N",
                     help="at most this many, earliest first (default 1000, at most 10000)")
    set_handler(cmd, get_placements)


def _period(args: argparse.Namespace) -> tuple[float, float]:
    if args.at is not None:
        if args.since is not None or args.until is not None:
            raise CliError("--at names one instant; give it alone, or --since/--until for a period")
        if args.at <= 0:
            raise CliError(f"--at {output.timestamp(args.at)} is before 1970; give a later time")
        if args.at > time.time():
            raise CliError(f"--at {output.timestamp(args.at)} is in the future; the GPUs' history holds only "
                           "what has happened (now: leave --at out, or gandiva get servers)")
        return args.at, args.at
    since = args.since if args.since is not None else time.time() - HOUR
    if since > time.time():
        raise CliError(f"--since {output.timestamp(since)} is in the future; give a start before now")
    since = max(since, 1.0)  # a window reaching back past 1970: the whole history
    if args.until is not None and args.until <= since:
        raise CliError(f"--until ({output.timestamp(args.until)}) is not after --since ({output.timestamp(since)}): "
                       "give a start before the end")
    return since, args.until or 0.0


def get_placements(args: argparse.Namespace, client: Client) -> int:
    if not -1 <= args.gpu < 2**31:  # (-1: left out) an index travels as an int32
        raise CliError(f"--gpu must be a GPU index, 0 to {2**31 - 1}, got {args.gpu}")
    if not 0 <= args.limit <= 10000:
        raise CliError(f"--limit must be 0 (the default: 1000) to 10000, got {args.limit}")
    since, until = _period(args)
    got = client.call("ListPlacements", scheduler_pb2.ListPlacementsRequest(
        since=since, until=until, server=args.server, gpu=args.gpu if args.gpu >= 0 else None, job_id=args.job,
        limit=args.limit))
    at = args.at is not None
    if args.output == "json":
        output.print_json(_as_json(got, at))
        return EXIT_OK
    print(_heading(got, at))
    headers = [*HEADERS, "STATE"] if at else HEADERS
    output.print_table(headers, (_row(p, at) for p in got.placements), args.no_headers)
    if got.more:
        print(f"... and more (the first {len(got.placements):,} by their start are listed: --limit N lists up to "
              "10,000, as many as fit an answer of 2 MiB; --server, --gpu, --job or a shorter period narrow it)")
    return EXIT_OK


def _heading(got: scheduler_pb2.ListPlacementsResponse, at: bool) -> str:
    line = (f"at {output.timestamp(got.since)}" if at else
            f"from {output.timestamp(got.since)} to {output.timestamp(got.until)} "
            f"({output.duration(got.until - got.since)})")
    if not got.kept_since:
        line += "; no placement is recorded yet (the GPUs' history begins with the first placement)"
    elif got.kept_since > got.since:
        line += (f"; the GPUs' history begins at {output.timestamp(got.kept_since)} (the upgrade to "
                 "0010_gpu_holds, or `gandiva db prune --jobs`): nothing is known before it")
    if not got.placements:
        line += "; no job held a GPU " + ("then" if at else "in that period") + " (of those asked)"
    return line


def _row(p: scheduler_pb2.PlacementSpan, at: bool) -> list[Any]:
    held = (p.end_at or time.time()) - p.start_at
    row: list[Any] = [output.visible(p.server), p.gpu, p.job_id, output.visible(p.name) or "-", p.user or "-",
                      output.clock(p.start_at), output.clock(p.end_at) if p.end_at else "now", output.duration(held)]
    return [*row, p.state_at or "-"] if at else row


_FIELDS = ("job_id", "name", "user", "server", "gpu", "start_at", "end_at")


def _as_json(got: scheduler_pb2.ListPlacementsResponse, at: bool) -> dict[str, Any]:
    rows = []
    for p in got.placements:
        row: dict[str, Any] = {name: getattr(p, name) for name in _FIELDS}
        row["end_at"] = p.end_at or None  # null: held now
        if at:
            row["state_at"] = p.state_at
        rows.append(row)
    return {"at" if at else "since": got.since, **({} if at else {"until": got.until}),
            "kept_since": got.kept_since or None, "placements": rows, "more": got.more}
