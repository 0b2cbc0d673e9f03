"""`gandiva get usage`: who had the cluster's GPUs over a period, and how long their jobs
waited (the ``GetUsage`` call; docs/observability.md, "Accounting")."""

from __future__ import annotations

import argparse
import time
from typing import Any

from protos.gandiva.v1 import scheduler_pb2
from scheduler.cli import output
from scheduler.cli.argtypes import point_in_time
from scheduler.cli.client import EXIT_OK, Client, CliError

DESCRIPTION = """\
Accounting over a period (default: the last 7 days), from the state changes the scheduler
records for every job. Per user, most GPU time first, and a TOTAL line:

  JOBS       jobs alive at some time in the period
  GPU-HOURS  time RUNNING x the GPUs each job asked for (as GPU-TIME of `get users`)
  HELD-H     GPU-hours from the GPUs each job really held while running: a grown job's extra
             GPUs count, a GPU two packed jobs ran on at once counts half to each (recorded
             since session 49: 0 for earlier times)
  QUEUED     job-time spent in the queue (two jobs queued for an hour: 2h00m)
  SUSPENDED  job-time suspended: waiting for a time slice, or held by an operator
  STARTED    jobs first placed in the period; WAIT-AVG / WAIT-MAX: from their submission to
             that first start (a wait that began before the period counts whole)
  WAITING    jobs still in the queue at the period's end that never started, and the longest
             such wait so far (WAIT-NOW)
  ENDED      jobs that succeeded, failed or were killed in the period

--by job lists each job instead (most GPU time first). A user's token sees its own jobs only.
Without --user, a last line says what the cluster had: the GPUs of its servers up over the
period (GPU-hours), and how much of it had a job running ("busy"), as a fraction.
Jobs deleted by `gandiva db prune --jobs` are not counted: the line above the table says
when the database's history begins if the period starts before it.

WHEN is how long ago (90s, 30m, 12h, 7d), a time of day (08:00: the latest one) or a date with
an optional time of day, by this machine's clock unless it names its zone: 2026-11-30,
2026-11-30T08:00, 2026-11-30T08:00Z.

  gandiva get usage --since 7d
  gandiva get usage --since 2026-11-30 --until 2026-12-07 -o json
  gandiva get usage --since 1d --by job --user alice
"""

USER_HEADERS = ["USER", "JOBS", "GPU-HOURS", "HELD-H", "QUEUED", "SUSPENDED", "STARTED", "WAIT-AVG", "WAIT-MAX",
                "WAITING", "WAIT-NOW", "ENDED"]
JOB_HEADERS = ["JOB", "NAME", "USER", "GPUS", "STATE", "GPU-HOURS", "HELD-H", "QUEUED", "SUSPENDED", "WAIT-START"]
WEEK = 7 * 86400.0


def register(kinds: Any, common: argparse.ArgumentParser, set_handler: Any) -> None:
    usage = kinds.add_parser("usage", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
                             help="accounting over a period: GPU-hours, time queued and waits per user or job",
                             description=DESCRIPTION)
    usage.add_argument("--since", type=point_in_time, default=None, metavar="WHEN",
                       help="the period's start (default: 7d, the last 7 days)")
    usage.add_argument("--until", type=point_in_time, default=None, metavar="WHEN",
                       help="the period's end (default: now)")
    usage.add_argument("--user", default=None, help="only this user's jobs (operators; others always see their own)")
    usage.add_argument("--by", choices=["user", "job"], default="user",
                       help="one row per user (default) or per job")
    usage.add_argument("--limit", type=int, default=0,
                       help="--by job: at most this many jobs (default 1000, at most 10000; the rest are counted)")
    set_handler(usage, get_usage)


def get_usage(args: argparse.Namespace, client: Client) -> int:
    if args.user is not None and not args.user:
        raise CliError("--user is empty; give a user's name, or leave --user out for every user you may see")
    if not 0 <= args.limit <= 10000:  # (past 2^31 it was a traceback: the field is an int32)
        raise CliError(f"--limit must be 0 (the default: 1000 jobs) to 10000, got {args.limit}")
    since = args.since if args.since is not None else time.time() - WEEK
    # A window reaching back past 1970 counts the whole history (it was sent as a negative time
    # and refused with it, a number the user never typed).
    since = max(since, 1.0)
    if args.until is not None and args.until <= since:
        raise CliError(f"--until ({output.timestamp(args.until)}) is not after --since ({output.timestamp(since)}): "
                       "give a start before the end")
    got = client.call("GetUsage", scheduler_pb2.GetUsageRequest(
        since=since, until=args.until or 0.0, user=args.user or "", by_job=args.by == "job", limit=args.limit))
    if args.output == "json":
        output.print_json(_as_json(got, args.by == "job"))
        return EXIT_OK
    print(_period(got))
    if args.by == "job":
        output.print_table(JOB_HEADERS, (_job_row(j) for j in got.jobs), args.no_headers)
        if got.jobs_not_listed:
            print(f"... and {got.jobs_not_listed:,} more jobs (--limit N lists up to 10,000, as many as fit an "
                  "answer of 2 MiB; --user NAME or a shorter period narrows it)")
        return EXIT_OK
    rows = [_user_row(u.user or "-", u) for u in got.users]
    if len(got.users) > 1:
        rows.append(_user_row("TOTAL", got.total))
    output.print_table(USER_HEADERS, rows, args.no_headers)
    if got.users_not_listed:
        print(f"... and {got.users_not_listed:,} more users, of less GPU time (TOTAL counts them; --user NAME "
              "shows one)")
    if not args.user and got.capacity_gpu_seconds:
        print(_cluster_line(got))
    return EXIT_OK


def _cluster_line(got: scheduler_pb2.GetUsageResponse) -> str:
    busy = got.busy_gpu_seconds / got.capacity_gpu_seconds
    line = (f"cluster: {_hours(got.capacity_gpu_seconds)} GPU-hours of servers up, {_hours(got.busy_gpu_seconds)} "
            f"busy ({busy:.1%}: a job running on the GPU)")
    if got.capacity_kept_since > got.since:
        line += (f"; the servers' history begins at {output.timestamp(got.capacity_kept_since)} (the upgrade to "
                 "0011_server_spans): their time before is not counted")
    return line


def _period(got: scheduler_pb2.GetUsageResponse) -> str:
    line = (f"from {output.timestamp(got.since)} to {output.timestamp(got.until)} "
            f"({output.duration(got.until - got.since)})")
    if got.oldest_kept and got.oldest_kept > got.since:
        line += (f"; the database holds no job submitted before {output.timestamp(got.oldest_kept)} "
                 "(the cluster's start, or `gandiva db prune --jobs`)")
    elif not got.oldest_kept:
        line += "; the database holds no job"
    return line


def _hours(seconds: float) -> str:
    """GPU-hours: 2 decimals under 10 (a demo's minute-long jobs read 0.0 with one)."""
    hours = seconds / 3600
    return f"{hours:,.2f}" if hours < 10 else f"{hours:,.1f}"


def _span(seconds: float, count: int = 1) -> str:
    return output.duration(seconds) if count else "-"


def _user_row(label: str, u: scheduler_pb2.Usage) -> list[Any]:
    return [label, u.jobs, _hours(u.gpu_seconds), _hours(u.held_gpu_seconds), _span(u.queued_seconds), _span(u.suspended_seconds), u.started,
            _span(u.wait_seconds / u.started if u.started else 0, u.started), _span(u.wait_max_seconds, u.started),
            u.waiting, _span(u.waiting_max_seconds, u.waiting), u.ended]


def _job_row(j: scheduler_pb2.Usage) -> list[Any]:
    if j.started:
        wait = output.duration(j.wait_seconds)
    elif j.waiting:
        wait = f"{output.duration(j.waiting_max_seconds)}+"  # still waiting
    else:
        wait = "-"  # started before the period
    return [j.job_id, output.visible(j.name), j.user or "-", j.gpus, j.state, _hours(j.gpu_seconds),
            _hours(j.held_gpu_seconds), _span(j.queued_seconds), _span(j.suspended_seconds), wait]


_USER_FIELDS = ("user", "jobs", "gpu_seconds", "held_gpu_seconds", "queued_seconds", "suspended_seconds", "migrating_seconds", "started",
                "wait_seconds", "wait_max_seconds", "waiting", "waiting_max_seconds", "ended")
_JOB_FIELDS = ("job_id", "name", "user", "gpus", "state", "gpu_seconds", "held_gpu_seconds", "queued_seconds", "suspended_seconds",
               "migrating_seconds", "submitted_at", "started_at", "started", "wait_seconds", "waiting",
               "waiting_max_seconds", "ended")


def _pick(message: scheduler_pb2.Usage, fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(message, name) for name in fields}


def _as_json(got: scheduler_pb2.GetUsageResponse, by_job: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"since": got.since, "until": got.until, "oldest_kept": got.oldest_kept or None,
                           "users": [_pick(u, _USER_FIELDS) for u in got.users],
                           "users_not_listed": got.users_not_listed,
                           "total": {k: v for k, v in _pick(got.total, _USER_FIELDS).items() if k != "user"}}
    # The cluster's GPU-hours (servers up) and those busy; null for one user's report.
    out["cluster"] = {"capacity_gpu_seconds": got.capacity_gpu_seconds, "busy_gpu_seconds": got.busy_gpu_seconds,
                      "busy_fraction": got.busy_gpu_seconds / got.capacity_gpu_seconds,
                      "kept_since": got.capacity_kept_since or None} if got.capacity_gpu_seconds else None
    if by_job:
        out["jobs"] = [_pick(j, _JOB_FIELDS) for j in got.jobs]
        out["jobs_not_listed"] = got.jobs_not_listed
    return out
