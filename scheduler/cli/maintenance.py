"""`gandiva cordon|uncordon|drain SERVER` and `gandiva describe server`: taking a server
out for maintenance and putting it back (operators; docs/cli.md "Maintenance")."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.cli import output
from scheduler.cli.argtypes import duration
from scheduler.cli.client import EXIT_OK, Client, CliError, list_all, server_to_dict, state_name

PROG = "gandiva"
# `drain --wait` gave up: jobs still run on the server (each named on stderr).
EXIT_NOT_DRAINED = 1
POLL_S = 1.0


def register(subparsers: Any) -> None:
    """Add cordon, uncordon and drain to the `gandiva` parser (describe server: ops.py)."""
    from scheduler.cli.ops import _set, common_parser

    common = common_parser()
    cordon = subparsers.add_parser("cordon", parents=[common],
                                   help="no new job goes to a server; its jobs keep running (operator)")
    cordon.add_argument("server", metavar="SERVER", help="the server's name (gandiva get servers)")
    cordon.add_argument("--reason", default="", help="why, shown by get servers and describe server")
    _set(cordon, lambda args, client: _mark(args, client, "CordonServer", "cordoned"))
    uncordon = subparsers.add_parser("uncordon", parents=[common],
                                     help="a cordoned or drained server takes jobs again (operator)")
    uncordon.add_argument("server", metavar="SERVER", help="the server's name")
    uncordon.add_argument("--reason", default="", help="recorded in its event")
    _set(uncordon, lambda args, client: _mark(args, client, "UncordonServer", "uncordoned"))
    drain = subparsers.add_parser("drain", parents=[common],
                                  help="cordon a server and move its jobs off at mini-batch boundaries (operator)")
    drain.add_argument("server", metavar="SERVER", help="the server's name")
    drain.add_argument("--reason", default="", help="why, shown by get servers and describe server")
    drain.add_argument("--wait", action="store_true",
                       help="return once no job is placed on it, with a line per job saying where it went "
                            f"(exit {EXIT_NOT_DRAINED} if --timeout passes first)")
    drain.add_argument("--timeout", type=duration, default=600.0, metavar="DURATION",
                       help="how long --wait waits, e.g. 90s, 10m (default 10m); the drain itself goes on")
    _set(drain, drain_server)


def status_of(server: common_pb2.Server) -> str:
    """The server's scheduling status, as get servers' STATUS column shows it: ready, cordoned or
    draining, and down first while its helper is silent (a down server read "ready": the one
    column an operator scans for trouble)."""
    status = "draining" if server.draining else "cordoned" if server.cordoned else "ready"
    if server.up:
        return status
    return "down" if status == "ready" else f"down,{status}"


def _mark(args: argparse.Namespace, client: Client, method: str, verb: str) -> int:
    server = client.call(method, scheduler_pb2.CordonServerRequest(server=args.server, reason=args.reason))
    if args.output == "json":
        output.print_json(server_to_dict(server))
    else:
        jobs = sorted({j for g in server.gpu_list for j in g.jobs})
        keep = f"; {len(jobs)} job(s) keep running there (gandiva drain {server.name} moves them off)" \
            if jobs and server.cordoned else ""
        if server.draining:
            keep = (f"; it is being drained still (its jobs are moved off): gandiva uncordon {server.name}, then "
                    "cordon, to stop the drain and keep it cordoned")
        print(f"server {server.name} {verb}{keep}")
    return EXIT_OK


def _jobs_on(server: common_pb2.Server) -> set[str]:
    return {j for g in server.gpu_list for j in g.jobs}


def _where(job: common_pb2.Job, name: str) -> str:
    """Where a job that left ``name`` went, for people."""
    state = state_name(job.state)
    servers = sorted({g.server for g in job.placement})
    if state in ("SUCCEEDED", "FAILED", "KILLED"):
        return f"ended {state}"
    if state == "QUEUED":
        return (f"checkpointed at step {job.steps} and queued; its checkpoint is off {name} (the scheduler resumes "
                "it from that checkpoint where it places it next)")
    return f"{state.lower()} on {output.placement(job.placement)}" if servers else state.lower()


def drain_server(args: argparse.Namespace, client: Client) -> int:
    name = args.server
    answer = client.call("DrainServer", scheduler_pb2.CordonServerRequest(server=name, reason=args.reason))
    if args.output == "json" and not args.wait:
        output.print_json({"server": server_to_dict(answer.server),
                           "jobs": [{"job_id": j.job_id, "action": j.action, "note": j.note} for j in answer.jobs]})
        return EXIT_OK
    print(f"server {name} cordoned and draining: {len(answer.jobs)} job(s) on it", flush=True)
    for j in answer.jobs:
        print(f"  {j.job_id}: {j.action} ({j.note})", flush=True)
    if not args.wait:
        print(f"follow it: gandiva drain {name} --wait, or gandiva get events --server {name} -w")
        return EXIT_OK
    return _wait_drained(client, name, args.timeout, {j.job_id for j in answer.jobs})


def _wait_drained(client: Client, name: str, timeout: float, seen: set[str]) -> int:
    """Follow the drain until ``name`` is drained, saying where each job that was on it
    (``seen``: those the drain's answer named, then any found there) went. A job gone before
    the first look (its park quick) was said nothing of before."""
    deadline = time.monotonic() + timeout
    said: dict[str, str] = {}
    while True:
        servers = client.call("ListServers", scheduler_pb2.ListServersRequest()).servers
        server = next((s for s in servers if s.name == name), None)
        if server is None:
            raise CliError(f"server {name!r} is no longer registered")
        # A job leaves once it is placed elsewhere, or queued with its checkpoint moved off.
        there = _jobs_on(server) | set(server.checkpoints_for)
        seen |= there
        for job_id in sorted(seen - there):
            if job_id not in said:
                job = client.call("GetJob", scheduler_pb2.GetJobRequest(id=job_id))
                said[job_id] = _where(job, name)
                print(f"  {job_id}: {said[job_id]}", flush=True)
        if not there:
            print(f"server {name} drained: no job is placed on it and no job's checkpoint is left on it "
                  f"({len(said)} moved off); "
                  f"it stays cordoned until gandiva uncordon {name}")
            return EXIT_OK
        if time.monotonic() >= deadline:
            print(f"{PROG}: drain {name}: {len(there)} job(s) still on it after {timeout:.0f}s: "
                  f"{', '.join(sorted(there))} (the drain goes on; see gandiva get events --server {name} "
                  "--kind job.drain)", file=sys.stderr)
            return EXIT_NOT_DRAINED
        time.sleep(POLL_S)


def describe_server(args: argparse.Namespace, client: Client) -> int:
    servers = client.call("ListServers", scheduler_pb2.ListServersRequest()).servers
    server = next((s for s in servers if s.name == args.name), None)
    if server is None:
        raise CliError(f"not found: server {args.name!r}; the registered servers are: "
                       f"{', '.join(s.name for s in servers) or 'none'}")
    if args.output == "json":
        output.print_json(server_to_dict(server))
        return EXIT_OK
    fields: list[tuple[str, Any]] = [
        ("Name", server.name), ("Address", server.address or "-"),
        ("Up", "yes" if server.up else _down(client, server.name)),
        ("Status", status_of(server)),
    ]
    if server.cordoned:
        fields += [("Cordoned", f"{output.age(server.cordoned_at)} ago"),
                   ("Reason", server.cordon_reason or "-")]
    if server.checkpoints_for:
        fields += [("Checkpoints", f"of queued jobs {' '.join(server.checkpoints_for)} (being moved off)")]
    fields += [("GPUs", f"{server.gpus} ({server.allocated} allocated, height {server.height})"),
               ("Host memory", output.host_memory(server.host_memory_used_bytes, server.host_memory_bytes)),
               ("Heartbeat", f"{output.age(server.last_heartbeat)} ago")]
    for label, value in fields:
        print(f"{label + ':':<13} {value}")
    print("GPUs:")
    for g in server.gpu_list:
        # A down server's utilization is its last sample from before: not shown as now.
        util = f"{g.utilization:.0%}" if server.up else "-"
        print(f"  {g.index}  {g.model or '-'}  {util}  jobs: {' '.join(g.jobs) or '-'}")
    return EXIT_OK


def _down(client: Client, name: str) -> str:
    """Since when a server is down, why, and what brings it back. Before, `describe server`
    said only "Up: no", beside "Status: ready" and its GPUs' last utilization."""
    downs = list_all(client, "ListEvents", scheduler_pb2.ListEventsRequest(server=name, kinds=["server.down"]),
                     "events")
    since = f" since {output.timestamp(downs[-1].at)} ({downs[-1].message})" if downs else ""
    return (f"no: down{since}; the jobs it ran went back to the queue (`gandiva get events --server {name}`). "
            "It is up again once its helper heartbeats: restart `gandiva helper` there if it stopped")
