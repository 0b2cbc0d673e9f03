"""`gandiva get|describe|kill|suspend|resume|priority|migrate`: the operator's views
and actions on jobs, servers and events, printed as tables or ``-o json|wide``.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler import auth, eta, timeline
from scheduler.alone import SLOW_AGAINST_ALONE, against_alone
from scheduler.cli import output, placements, sharing, usage, wait
from scheduler.cli.argtypes import point_in_time
from scheduler.cli.client import (
    EXIT_ERROR,
    EXIT_OK,
    TERMINAL_STATES,
    Client,
    CliError,
    EventFollower,
    add_security_flags,
    client_from_args,
    event_to_dict,
    job_servers,
    job_to_dict,
    last_output,
    list_all,
    not_a_multi_job,
    run_command,
    server_to_dict,
    state_name,
    state_value,
)
from scheduler.cli.maintenance import describe_server, status_of
from scheduler.validation import MAX_PRIORITY

PROG = "gandiva"


def common_parser() -> argparse.ArgumentParser:
    """The flags every operator subcommand takes: --scheduler, -o, --no-headers, security."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--scheduler", metavar="ADDR", help="scheduler address "
                        "(default: $GANDIVA_SCHEDULER, else 127.0.0.1:50051)")
    common.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table",
                        help="table (default), wide (more columns) or json")
    common.add_argument("--no-headers", action="store_true", help="tables without the header row")
    add_security_flags(common)
    return common


def register(subparsers: Any) -> None:
    """Add the operator subcommands to the `gandiva` parser."""
    common = common_parser()
    _register_get(subparsers, common)
    _register_actions(subparsers, common)


def _register_get(subparsers: Any, common: argparse.ArgumentParser) -> None:
    get = subparsers.add_parser("get", help="list jobs, servers, users, events or problems; usage over a period; "
                                            "who held which GPU when")
    kinds = get.add_subparsers(dest="kind", metavar="jobs|servers|users|usage|placements|events|problems",
                               required=True)
    jobs = kinds.add_parser("jobs", aliases=["job"], parents=[common], help="list jobs")
    jobs.add_argument("ids", nargs="*", metavar="ID", help="only these jobs")
    jobs.add_argument("--state", action="append", default=[], metavar="STATE",
                      help="only jobs in this state (repeatable, or comma-separated), e.g. RUNNING or "
                           "RUNNING,QUEUED")
    jobs.add_argument("--multi-job", default=None, metavar="ID", help="only members of this multi-job")
    jobs.add_argument("--user", default=None, help="only this user's jobs (operators; "
                      "others always see their own)")
    jobs.add_argument("--limit", type=int, default=0,
                      help="at most this many jobs (default: all, fetched page by page)")
    _set(jobs, get_jobs)
    servers = kinds.add_parser("servers", aliases=["server"], parents=[common], help="list servers")
    _set(servers, get_servers)
    users = kinds.add_parser("users", aliases=["user"], parents=[common],
                             help="who uses the GPUs: per user, jobs by state, GPUs held and GPU time")
    users.add_argument("--all", action="store_true",
                       help="also list users whose jobs have all ended (default: only users with a "
                            "job not ended; their finished jobs count in FINISHED and GPU-TIME)")
    _set(users, get_users)
    usage.register(kinds, common, _set)
    placements.register(kinds, common, _set)
    events = kinds.add_parser("events", aliases=["event"], parents=[common], help="list events")
    events.add_argument("--job", default="", metavar="ID", help="only this job's events")
    events.add_argument("--after", type=int, default=0, metavar="EVENT_ID",
                        help="only events after this id")
    events.add_argument("--since", type=point_in_time, default=0.0, metavar="WHEN",
                        help="only events from this time on: how long ago (90s, 30m, 1h, 2d), a time of day "
                             "(03:10: the latest one, today's or yesterday's) or a date and time "
                             "(2026-12-06T03:10), by this machine's clock")
    events.add_argument("--until", type=point_in_time, default=0.0, metavar="WHEN",
                        help="only events before this time (as --since): what happened between 03:10 and "
                             "03:15 last night is --since 03:10 --until 03:15; the database keeps them "
                             "across scheduler restarts")
    events.add_argument("--kind", action="append", default=[], metavar="KIND",
                        help="only events of this kind (repeatable): job.state, server.down, ...; "
                             "'job' or 'server' for all of theirs")
    events.add_argument("--server", default="", metavar="NAME", help="only events about this server "
                        "(its own, and its jobs' state changes there)")
    events.add_argument("--limit", type=int, default=0,
                        help="at most this many events (default: all, fetched page by page)")
    events.add_argument("-w", "--watch", action="store_true",
                        help="keep following new events (reconnects when the scheduler restarts)")
    _set(events, get_events)
    problems = kinds.add_parser(
        "problems", aliases=["problem"], parents=[common],
        help="what needs a person now, each with the command to run next (operators)",
        description="One line per thing that needs a person: servers down or late with their "
        "heartbeats, or refusing launches; jobs stuck migrating, hung, not answering a command, "
        "failing again and again, or waiting past their turn (or first in the queue while a server "
        "has room); packs undone "
        "again and again; failed migrations; the database unreachable or unable to write; "
        "scheduling rounds that stopped. Each says what to run next. Worked out by the scheduler "
        "from what it keeps (the last hour's events for what repeats); the dashboard shows the "
        "same list.")
    _set(problems, get_problems)


def _register_actions(subparsers: Any, common: argparse.ArgumentParser) -> None:
    describe = subparsers.add_parser("describe", help="everything about one job or server")
    what = describe.add_subparsers(dest="kind", metavar="job|server", required=True)
    job = what.add_parser("job", parents=[common], help="spec, placement, history, metrics")
    job.add_argument("id", metavar="ID", help="the job's id (j-..., as gandiva-submit and gandiva get jobs print)")
    _set(job, describe_job)
    server = what.add_parser("server", parents=[common], help="GPUs, jobs, and whether it is cordoned and why")
    server.add_argument("name", metavar="SERVER", help="the server's name (gandiva get servers)")
    _set(server, describe_server)

    wait.register(subparsers, common, _set)
    kill = subparsers.add_parser("kill", parents=[common], help="kill jobs (a multi-job's id: its jobs not ended)")
    kill.add_argument("ids", nargs="+", metavar="ID",
                      help="job ids, or multi-job ids (mj-..., as gandiva-submit --sweep/--array "
                           "prints) for every job of it that has not ended")
    kill.add_argument("--reason", default="", help="recorded in the job's history")
    _set(kill, _action("KillJob", "killed"))
    for name, method, verb in (("suspend", "SuspendJob", "suspended"),
                               ("resume", "ResumeJob", "resumed")):
        action = subparsers.add_parser(name, parents=[common], help=f"{name} a job (operator)")
        action.add_argument("ids", nargs="+", metavar="ID", help="job ids (j-...)")
        action.add_argument("--reason", default="", help="recorded in the job's history")
        _set(action, _action(method, verb))

    priority = subparsers.add_parser("priority", parents=[common], help="change a job's priority")
    priority.add_argument("id", metavar="ID", help="the job's id (j-...)")
    priority.add_argument("priority", type=int, metavar="N", help="0 or more; larger = larger share")
    _set(priority, set_priority)

    migrate = subparsers.add_parser("migrate", parents=[common], help="move a job to a server")
    migrate.add_argument("id", metavar="ID", help="the job's id (j-...); it moves at its next mini-batch boundary")
    migrate.add_argument("--to", required=True, metavar="SERVER", help="destination server name")
    _set(migrate, migrate_job)


def _set(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace, Client], int]) -> None:
    """Bind a command body; it gets a Client and its CliErrors become exit code 2."""

    def func(args: argparse.Namespace) -> int:
        def run() -> int:
            client = client_from_args(args)
            try:
                return body(args, client)
            finally:
                client.close()

        return run_command(PROG, run)

    parser.set_defaults(func=func)


# ETA: done of its total mini-batches and the time left ("34%/12m"; "?" unknown, "-" no total).
JOB_HEADERS = ["ID", "NAME", "STATE", "GPUS", "SERVERS", "STEPS", "RATE", "ETA", "PRIO", "AGE"]
# VS-ALONE: a running job's rate over its rate alone ("0.48x", "0.48x slow" under SLOW_AGAINST_ALONE).
JOB_WIDE_HEADERS = JOB_HEADERS + ["VS-ALONE", "PLACEMENT", "HOST-MEMORY", "GPU-TIME", "MULTI-JOB", "PARAMS", "USER",
                                  "WAIT", "MESSAGE", "COMMAND"]


def job_row(job: common_pb2.Job, wide: bool) -> list[Any]:
    row: list[Any] = [
        job.id, job.spec.name or "-", state_name(job.state), job.spec.gpus,
        ",".join(job_servers(job)) or "-", job.steps,
        output.rate(job.rate) if job.state == common_pb2.JOB_STATE_RUNNING else "-",
        eta.short(job.eta_s, job.steps, job.total_steps, ended=job.state in TERMINAL_STATES), job.spec.priority,
        output.age(job.submitted_at),
    ]
    if wide:
        ratio = against_alone(job.state == common_pb2.JOB_STATE_RUNNING, job.rate, job.alone_rate)
        row += [
            "-" if ratio is None else f"{ratio:.2f}x" + (" slow" if ratio < SLOW_AGAINST_ALONE else ""),
            output.placement(job.placement),
            output.size(job.host_memory_bytes) if job.host_memory_bytes else "-",
            output.duration(job.gpu_seconds),
            job.spec.multi_job_id or "-",
            " ".join(f"{k}={v}" for k, v in sorted(job.spec.params.items())) or "-",
            job.spec.user or "-", job.wait or "-",
            job.message or "-", " ".join(job.spec.command),
        ]
    return row


def print_jobs(args: argparse.Namespace, jobs: list[common_pb2.Job]) -> None:
    if args.output == "json":
        output.print_json([job_to_dict(j) for j in jobs])
        return
    wide = args.output == "wide"
    output.print_table(JOB_WIDE_HEADERS if wide else JOB_HEADERS,
                       (job_row(j, wide) for j in jobs), args.no_headers)


def get_jobs(args: argparse.Namespace, client: Client) -> int:
    if args.ids:
        # Each id on its own, as kill does: one unknown id printed nothing of the others
        # (and, with -o json, no JSON at all).
        jobs, failed = [], 0
        for job_id in args.ids:
            try:
                if job_id.startswith("mj-"):  # a multi-job's id (gandiva-submit prints it): its jobs
                    members = list_all(client, "ListJobs", scheduler_pb2.ListJobsRequest(multi_job_id=job_id), "jobs")
                    if not members:
                        raise CliError(f"not found: multi-job {job_id!r} not found", status=grpc.StatusCode.NOT_FOUND)
                    jobs.extend(members)
                    continue
                jobs.append(client.call("GetJob", scheduler_pb2.GetJobRequest(id=job_id)))
            except CliError as exc:
                if exc.status not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                                      grpc.StatusCode.PERMISSION_DENIED):
                    raise  # the scheduler is not there, or not answering: one line, once
                print(f"{PROG}: error: {output.visible(job_id) or repr(job_id)}: {output.visible_lines(str(exc))}", file=sys.stderr)
                failed += 1
        print_jobs(args, jobs)
        return EXIT_ERROR if failed else EXIT_OK
    else:
        if args.limit < 0:
            raise CliError(f"--limit must be 0 or more, got {args.limit}")
        # `--user "$UNSET"` listed every user's jobs, `--multi-job "$UNSET"` every job: say so
        for flag, value in (("--user", args.user), ("--multi-job", args.multi_job)):
            if value is not None and not value.strip():
                raise CliError(f"{flag} is empty; give a value, or leave {flag} out for all the jobs you may see")
        request = scheduler_pb2.ListJobsRequest(
            # `--state RUNNING,QUEUED` as well as `--state RUNNING --state QUEUED` (the first
            # was "unknown state 'RUNNING,QUEUED'")
            states=[state_value(s) for given in args.state for s in given.split(",")],
            multi_job_id=args.multi_job or "", user=args.user or "",
        )
        jobs = list_all(client, "ListJobs", request, "jobs", args.limit)
        if args.multi_job and not jobs and not args.state:  # was an empty table, exit 0
            raise CliError(f"not found: multi-job {args.multi_job!r} not found")
    print_jobs(args, jobs)
    return EXIT_OK


# STATUS: ready, cordoned (gandiva cordon: no new job goes there) or draining (gandiva drain);
# down (down,cordoned / down,draining) while its helper is silent.
SERVER_HEADERS = ["NAME", "GPUS", "ALLOCATED", "HEIGHT", "AFFINITY", "UP", "JOBS", "HOST-MEMORY",
                  "HEARTBEAT", "STATUS"]
SERVER_WIDE_HEADERS = SERVER_HEADERS + ["ADDRESS", "GPU-UTIL", "GPU-MEMORY"]


def server_row(server: common_pb2.Server, wide: bool) -> list[Any]:
    jobs = sorted({job for gpu in server.gpu_list for job in gpu.jobs})
    row: list[Any] = [
        server.name, server.gpus, server.allocated, server.height, server.affinity or "-",
        "yes" if server.up else "no", len(jobs),
        output.host_memory(server.host_memory_used_bytes, server.host_memory_bytes),
        output.age(server.last_heartbeat),
        status_of(server),
    ]
    if wide:
        row += [
            server.address or "-",
            " ".join(f"{g.utilization:.0%}" for g in server.gpu_list) or "-",
            " ".join(f"{output.size(g.memory_used_bytes)}/{output.size(g.memory_total_bytes)}"
                     for g in server.gpu_list) or "-",
        ]
    return row


def get_servers(args: argparse.Namespace, client: Client) -> int:
    servers = list(client.call("ListServers", scheduler_pb2.ListServersRequest()).servers)
    if args.output == "json":
        output.print_json([server_to_dict(s) for s in servers])
        return EXIT_OK
    wide = args.output == "wide"
    output.print_table(SERVER_WIDE_HEADERS if wide else SERVER_HEADERS,
                       (server_row(s, wide) for s in servers), args.no_headers)
    return EXIT_OK


USER_HEADERS = ["USER", "RUNNING", "SUSPENDED", "QUEUED", "FINISHED", "GPUS-RUNNING", "GPU-TIME"]


def get_users(args: argparse.Namespace, client: Client) -> int:
    """Per user (as the scheduler lists jobs: operators see everyone, others themselves):
    jobs by state, the GPUs their running jobs hold now, and the GPU time all their jobs
    have had (time training x GPUs), most GPU time first."""
    jobs = list_all(client, "ListJobs", scheduler_pb2.ListJobsRequest(), "jobs")
    rows: dict[str, dict[str, Any]] = {}
    for job in jobs:
        state = state_name(job.state)
        row = rows.setdefault(job.spec.user, {"user": job.spec.user, "running": 0, "suspended": 0, "queued": 0,
                                              "migrating": 0, "finished": 0, "gpus_running": 0,
                                              "gpu_seconds": 0.0})
        key = "finished" if job.state in TERMINAL_STATES else state.lower()
        row[key] = row.get(key, 0) + 1
        row["gpus_running"] += job.spec.gpus if state == "RUNNING" else 0
        row["gpu_seconds"] += job.gpu_seconds
    shown = sorted((r for r in rows.values() if args.all or r["finished"] < sum(
        r[k] for k in ("running", "suspended", "queued", "migrating", "finished"))),
        key=lambda r: (-r["gpu_seconds"], r["user"]))
    if args.output == "json":
        output.print_json(shown)
        return EXIT_OK
    output.print_table(USER_HEADERS, ([r["user"] or "-", r["running"] + r["migrating"], r["suspended"], r["queued"],
                                       r["finished"], r["gpus_running"], output.duration(r["gpu_seconds"])]
                                      for r in shown), args.no_headers)
    if (ended := len(rows) - len(shown)) and not args.no_headers:
        # (a header alone read as if no one had used the cluster: after `gandiva demo`, all)
        who, are = ("user", "is") if ended == 1 else ("users", "are")
        print(f"... {ended:,} {who} whose jobs have all ended {are} not listed: --all lists them")
    return EXIT_OK


PROBLEM_HEADERS = ["KIND", "SUBJECT", "SINCE", "WHAT", "NEXT"]


def get_problems(args: argparse.Namespace, client: Client) -> int:
    """What needs a person (ListProblems), as a table, or -o json (a list of objects with
    kind, subject, since, what, next)."""
    got = client.call("ListProblems", scheduler_pb2.ListProblemsRequest())
    rows = [{"kind": p.kind, "subject": p.subject, "since": p.since or None, "what": p.what, "next": p.next}
            for p in got.problems]
    if args.output == "json":
        output.print_json(rows)
        return EXIT_OK
    if not rows:
        print("nothing needs a person now: every server heartbeats, no job is stuck, failing again and "
              "again or waiting past its turn, and the database answers")
        return EXIT_OK
    output.print_table(PROBLEM_HEADERS, ([r["kind"], r["subject"] or "-", output.age(r["since"] or 0, got.at),
                                          r["what"], r["next"]] for r in rows), args.no_headers)
    return EXIT_OK


EVENT_HEADERS = ["ID", "TIME", "KIND", "JOB", "SERVER", "MESSAGE"]


def event_row(event: common_pb2.Event) -> list[Any]:
    return [event.id, output.clock(event.at), event.kind, event.job_id or "-",
            event.server or "-", event.message]


def get_events(args: argparse.Namespace, client: Client) -> int:
    if not 0 <= args.after < 2**63:  # an event id travels as an int64
        raise CliError(f"--after must be an event id, 0 or more (0: from the first), got {args.after}")
    if any(not kind.strip() for kind in args.kind):  # was the scheduler's "invalid: kinds: required"
        raise CliError("--kind is empty; give an event kind such as job.state or server.down, or a "
                       "family: job, server (leave --kind out for all)")
    if args.watch and args.until:
        raise CliError("--until ends a listing and --watch follows new events: give one of them")
    if args.until and args.until <= 0:
        raise CliError("--until reaches back before 1970: no event is that old; give a later time")
    if args.since and args.until and args.until <= args.since:
        raise CliError(f"--until ({output.timestamp(args.until)}) is not after --since "
                       f"({output.timestamp(args.since)}): give a start before the end")
    if args.watch:
        return watch_events(args, client)
    if args.limit < 0:
        raise CliError(f"--limit must be 0 or more, got {args.limit}")
    request = scheduler_pb2.ListEventsRequest(after_id=args.after, job_id=args.job, since=_since(args),
                                              kinds=args.kind, server=args.server, until=args.until)

    def call(method: str, request: Any) -> Any:
        # The scheduler filters by --kind/--server/--until; one from before it did ignores them
        # and sends every event, so they are filtered here too.
        reply = client.call(method, request)
        if args.kind or args.server or args.until:
            wanted = [e for e in reply.events if _kind_wanted(args, e) and not (args.until and e.at >= args.until)]
            del reply.events[:]
            reply.events.extend(wanted)
        return reply

    events = list_all(client, "ListEvents", request, "events", args.limit, call=call)
    if args.output == "json":
        output.print_json([event_to_dict(e) for e in events])
    else:
        output.print_table(EVENT_HEADERS, (event_row(e) for e in events), args.no_headers)
    return EXIT_OK


def _since(args: argparse.Namespace) -> float:
    """--since as the unix time it starts from (0: from the first event). A window reaching
    back past 1970 is the whole history (it was sent as a negative time, and refused)."""
    return max(0.0, args.since) if args.since else 0.0


def _kind_wanted(args: argparse.Namespace, event: common_pb2.Event) -> bool:
    """--kind: the event's kind, or its family (`job` for job.state, job.pack, ...); and
    --server."""
    if args.server and event.server != args.server:
        return False
    return not args.kind or any(event.kind == k or event.kind.startswith(k + ".") for k in args.kind)


def watch_events(args: argparse.Namespace, client: Client) -> int:
    """Past events after --after, then new ones as they come, until interrupted.

    A table cannot be re-laid out while streaming, so rows are tab-separated;
    ``-o json`` prints one object per line.
    """
    # Fail at once with one clear line when the scheduler is not there at all.
    first = client.call("ListEvents", scheduler_pb2.ListEventsRequest(after_id=args.after, job_id=args.job,
                                                                      since=_since(args), limit=1)).events
    after = args.after
    if args.since:  # from the first event of the last DURATION; none yet: only new ones
        after = max(after, first[0].id - 1) if first else -1

    def status(message: str) -> None:
        print(f"{PROG}: {message}", file=sys.stderr, flush=True)

    follower = EventFollower(client, after_id=after, job_id=args.job, on_status=status,
                             kinds=args.kind, server=args.server).start()
    if args.output != "json" and not args.no_headers:
        print("\t".join(EVENT_HEADERS), flush=True)
    try:
        for event in follower:
            if not _kind_wanted(args, event):
                continue
            if args.output == "json":
                output.print_json_line(event_to_dict(event))
            else:
                print("\t".join(output.visible(str(c)) for c in event_row(event)), flush=True)
    finally:
        follower.stop()
    return EXIT_OK  # not reached: the loop ends by an error or Ctrl-C


def _action(method: str, verb: str) -> Callable[[argparse.Namespace, Client], int]:
    return lambda args, client: _act(args, client, method, verb)


def _members(client: Client, ids: list[str]) -> list[str]:
    """The ids to kill: a multi-job's id (`mj-...`, what `gandiva-submit --sweep/--array`
    prints) stands for its members that have not ended; a job id for itself."""
    out: list[str] = []
    for job_id in ids:
        if not job_id.startswith("mj-"):
            out.append(job_id)
            continue
        members = list_all(client, "ListJobs", scheduler_pb2.ListJobsRequest(multi_job_id=job_id), "jobs")
        if not members:
            out.append(job_id)  # the scheduler says "not found", naming it
            continue
        live = [j.id for j in members if j.state not in TERMINAL_STATES]
        if not live:
            print(f"{PROG}: multi-job {job_id}: all {len(members)} jobs have ended already",
                  file=sys.stderr)
        out.extend(live)
    return out


def _act(args: argparse.Namespace, client: Client, method: str, verb: str) -> int:
    """Apply one action to each id; report each failure and go on with the rest."""
    failed = 0
    done: list[common_pb2.Job] = []
    ids = _members(client, args.ids) if method == "KillJob" else args.ids
    for job_id in ids:
        try:
            if method != "KillJob":  # kill takes a multi-job's id for its jobs (_members)
                not_a_multi_job(job_id)
            job = client.call(method, scheduler_pb2.JobActionRequest(id=job_id, reason=args.reason))
        except CliError as exc:
            print(f"{PROG}: error: {output.visible(job_id) or repr(job_id)}: {output.visible_lines(str(exc))}", file=sys.stderr)
            failed += 1
            continue
        done.append(job)
        if args.output != "json":
            try:
                print(f"job {job.id} {verb} (now {state_name(job.state)})")
            except BrokenPipeError:  # `| head -1`: the other ids are still acted on
                output.stdout_gone()
    if args.output == "json":
        output.print_json([job_to_dict(j) for j in done])
    return EXIT_ERROR if failed else EXIT_OK


def _report(args: argparse.Namespace, job: common_pb2.Job, text: str) -> int:
    if args.output == "json":
        output.print_json(job_to_dict(job))
    else:
        print(text)
    return EXIT_OK


def set_priority(args: argparse.Namespace, client: Client) -> int:
    not_a_multi_job(args.id)
    if not 0 <= args.priority <= MAX_PRIORITY:
        raise CliError(f"priority must be from 0 to {MAX_PRIORITY}, got {args.priority}")
    job = client.call("SetPriority", scheduler_pb2.SetPriorityRequest(id=args.id,
                                                                     priority=args.priority))
    return _report(args, job, f"job {job.id} priority {job.spec.priority}")


def migrate_job(args: argparse.Namespace, client: Client) -> int:
    not_a_multi_job(args.id)
    job = client.call("MigrateJob", scheduler_pb2.MigrateJobRequest(id=args.id, to_server=args.to))
    return _report(args, job, f"job {job.id} migrating to {args.to} (now {state_name(job.state)}, "
                              f"on {output.placement(job.placement)})")


# Events that tell of a move; describe lists them apart so a migration stands out.
MIGRATION_MARK = "migrat"
DESCRIBE_EVENTS = 20


_TOTAL_FROM = {"spec": "as given at submission (--steps)", "program": "where its program's StopAtStepHook stops it"}


def _steps(job: common_pb2.Job) -> str:
    """'step 340 / 1,000 (34%; where its program's StopAtStepHook stops it)', or the count."""
    if job.total_steps <= 0:
        return str(job.steps)
    said = eta.progress_text(job.steps, job.total_steps)
    return f"{said[:-1]}; {_TOTAL_FROM.get(job.total_steps_from, job.total_steps_from)})"


def describe_job(args: argparse.Namespace, client: Client) -> int:
    not_a_multi_job(args.id)
    job = client.call("GetJob", scheduler_pb2.GetJobRequest(id=args.id))
    events = list_all(client, "ListEvents", scheduler_pb2.ListEventsRequest(job_id=job.id), "events")
    migrations = [e for e in events if MIGRATION_MARK in e.kind or MIGRATION_MARK in e.message]
    held = _gpus_held(client, job)
    if args.output == "json":
        output.print_json(dict(job_to_dict(job), events=[event_to_dict(e) for e in events],
                               migrations=[event_to_dict(e) for e in migrations], sharing=sharing.sharing(job, events),
                               decisions=sharing.decisions(job, events),
                               gpus_held=[{"server": p.server, "gpu": p.gpu, "start_at": p.start_at,
                                           "end_at": p.end_at or None} for p in held]))
        return EXIT_OK
    spec = job.spec
    since = job.history[-1].at if job.history else job.submitted_at
    fields: list[tuple[str, Any]] = [
        ("Job", job.id), ("Name", spec.name or "-"),
        ("State", f"{state_name(job.state)} (since {output.timestamp(since)})"),
        ("User", spec.user or "-"),
        ("Submitted", f"{output.timestamp(job.submitted_at)} ({output.age(job.submitted_at)} ago)"),
        ("Finished", output.timestamp(job.finished_at)),
        ("Steps", _steps(job)), *([("ETA", eta.eta_text(job.eta_s, job.eta_note))] if job.eta_note else []),
        ("Rate", _rate_now(job)),
        # (not "time running": its Sharing line's "running" leaves out a move's training)
        ("GPU time", f"{output.duration(job.gpu_seconds)} (time training x GPUs: running, and moving while it trained on at its source)"),
        ("Host memory", f"{output.size(job.host_memory_bytes)} (its processes' resident set, last measured; "
                        "held while suspended too)" if job.host_memory_bytes else "not measured"),
        ("Suspendable", "yes" if job.suspendable else f"no ({job.control_note})"),
        ("Migratable", "yes" if job.migratable else
         f"no ({job.control_note})" if job.control_note else "no"),
        ("Exit code", job.exit_code if job.finished_at else "-"), ("Message", job.message or "-"),
    ]
    waiting = _waiting(client, job)
    if waiting:
        fields.insert(fields.index(("Message", job.message or "-")), ("Waiting", waiting))
    if job.wait:  # its place in the queue, or its next turn (the scheduler's, from the policy's state)
        fields.insert(fields.index(("Message", job.message or "-")),
                      ("Queue" if job.state == common_pb2.JOB_STATE_QUEUED else "Next turn", job.wait))
    if spec.grow_shrink:
        fields.insert(-2, ("Grow-shrink", f"off ({job.grow_shrink_note})" if job.grow_shrink_note
                           else "yes (grows onto idle GPUs of its server)"))
    if spec.multi_job_id:
        fields.insert(2, ("Multi-job", f"{spec.multi_job_id} (index {spec.index})"))
    _print_fields(fields)
    print("Spec:")
    _print_fields([
        ("Command", " ".join(output.visible(a) for a in spec.command)), ("Workdir", spec.workdir), ("GPUs", spec.gpus),
        ("Priority", spec.priority), ("Grow-shrink", "yes" if spec.grow_shrink else "no"),
        ("Params", _pairs(spec.params)), ("Env", _pairs(spec.env)),
    ], indent=2)
    print(f"Placement: {output.placement(job.placement)}")
    if held:  # where it ran, from the GPUs' history (since session 49)
        print("GPUs held: " + ", ".join(f"{output.visible(p.server)}/{p.gpu} {output.clock(p.start_at)}-"
                                        f"{output.clock(p.end_at) if p.end_at else 'now'}" for p in held))
    print(f"Metrics: {_pairs(job.metrics) if job.metrics else '-'}")
    summary = sharing.sharing(job, events)
    if summary["state_changes"]:  # none left: its events were pruned (gandiva db prune)
        print(f"Sharing (what time-slicing, packing and moves did to it; from its {summary['state_changes']} "
              "state changes):")
        _print_fields(sharing.lines(summary, job.id), indent=2)
    why = sharing.decisions(job, events)
    if why:  # (since session 52)
        _section("Why it was suspended, moved or queued again (each decision, what followed, its rate before and after)",
                 ["TIME", "DECISION", "WHY", "THEN"], sharing.decision_rows(why))
    if job.state == common_pb2.JOB_STATE_FAILED:
        print(f"Last output (all of it: gandiva logs {job.id}):")
        for line in last_output(client, job) or ["(none)"]:
            print("  " + output.visible(line))
    _section("History", ["TIME", "FROM", "TO", "REASON"], _history(job, events))
    if migrations:
        _section("Migrations", EVENT_HEADERS, [event_row(e) for e in migrations])
    _section(f"Events (last {DESCRIBE_EVENTS})", EVENT_HEADERS,
             [event_row(e) for e in events[-DESCRIBE_EVENTS:]])
    return EXIT_OK


def _gpus_held(client: Client, job: common_pb2.Job) -> list[scheduler_pb2.PlacementSpan]:
    """Each GPU the job held and when (ListPlacements); none from a scheduler older than
    session 49, which does not know the call (describe says the rest)."""
    try:
        return list(client.call("ListPlacements", scheduler_pb2.ListPlacementsRequest(
            since=max(job.submitted_at, 1.0), job_id=job.id)).placements)
    except CliError:
        return []


def _history(job: common_pb2.Job, events: list[common_pb2.Event]) -> list[list[Any]]:
    """The job's state changes (each suspend or move with the rate it ran at) and, in time
    order among them, the verdicts of its packing trials (kept, undone, void, with the rates
    judged by): one timeline of what was decided about it and what it changed. The verdicts
    were only among the last 20 events, which a job time-sliced for a while pushed out."""
    return [[output.timestamp(x.at), state_name(x.from_state) or "-", state_name(x.to_state), x.reason or "-"]
            if kind == "state" else [output.timestamp(x.at), "-", "(verdict)", x.message]
            for kind, x in timeline.merged(job.history, events)]


def _rate_now(job: common_pb2.Job) -> str:
    """Its rate while running; for a job not running now, its last one said as such."""
    if job.rate <= 0:
        return "-"
    if job.state == common_pb2.JOB_STATE_RUNNING:
        ratio = against_alone(True, job.rate, job.alone_rate)
        alone = (f" ({ratio:.2f}x its rate alone, {output.rate(job.alone_rate)}: measured while the one job "
                 "running on its GPUs)") if ratio is not None else ""
        return f"{output.rate(job.rate)} mini-batches/s{alone}"
    return f"- ({output.rate(job.rate)} mini-batches/s when it last ran)"


def _waiting(client: Client, job: common_pb2.Job) -> str:
    """Why a suspended job is not running now: held by an operator, or waiting for its
    turn on its GPUs, and who runs there meanwhile ("" for a job in another state)."""
    if job.state != common_pb2.JOB_STATE_SUSPENDED:
        return ""
    if job.held:
        return f"held by an operator: it stays suspended until `gandiva resume {job.id}`"
    gpus = {(ref.server, ref.index) for ref in job.placement}
    servers = client.call("ListServers", scheduler_pb2.ListServersRequest()).servers
    others = sorted({other for s in servers for g in s.gpu_list if (s.name, g.index) in gpus
                     for other in g.jobs if other != job.id})
    running, hidden = [], 0
    for other in others:
        if other.startswith(auth.HIDDEN_JOB):  # another user's, listed without its id
            hidden += 1
            continue
        try:
            peer = client.call("GetJob", scheduler_pb2.GetJobRequest(id=other))
        except CliError as exc:  # ended meanwhile, or another user's job (--auth token)
            hidden += exc.status == grpc.StatusCode.PERMISSION_DENIED
            continue
        if peer.state == common_pb2.JOB_STATE_RUNNING:
            running.append(f"{peer.spec.name or '-'} ({peer.id})")
    where = output.placement(job.placement)
    now = f"running there now: {', '.join(running)}" if running else "nothing runs there at this moment"
    if hidden:  # not "nothing runs there": the caller may not see whether another user's job runs
        now = (f"running there now: {', '.join(running)}; " if running else "") + \
            f"{hidden} of them another user's (not shown to you)"
    return f"its turn on {where}, time-slicing with {len(others)} other job(s); {now}"


def _print_fields(fields: list[tuple[str, Any]], indent: int = 0) -> None:
    width = max(len(name) for name, _ in fields) + 2
    for name, value in fields:
        # Lines are the caller's (a map's pairs); control characters within are shown escaped.
        lines = [output.visible(line) for line in str(value).split("\n")]
        print(" " * indent + f"{name + ':':<{width}}{lines[0]}")
        for line in lines[1:]:
            print(" " * (indent + width) + line)


def _pairs(mapping: Any) -> str:
    """A map as KEY=VALUE lines, sorted; '-' when empty."""
    return "\n".join(f"{output.visible(k)}={output.visible(str(v))}" for k, v in sorted(mapping.items())) or "-"


def _section(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    print(f"{title}:")
    if not rows:
        print("  (none)")
        return
    buffer = io.StringIO()
    output.print_table(headers, rows, stream=buffer)
    for line in buffer.getvalue().splitlines():
        print("  " + line)
