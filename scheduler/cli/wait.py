"""Following submitted jobs to their end for `gandiva-submit`: state changes and
progress (mini-batches, rate) as they happen, through scheduler restarts, and the
exit code that mirrors the outcome.

Two sources feed it: the WatchEvents stream wakes it up and tells of things
that are not state changes (priority, migration, packing); GetJob / ListJobs
polls are the truth for states and progress, so a missed event loses nothing.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler import eta
from scheduler.cli import output
from scheduler.cli.argtypes import duration
from scheduler.cli.client import (
    EXIT_INTERRUPTED,
    TERMINAL_STATES,
    Client,
    CliError,
    EventFollower,
    job_to_dict,
    last_output,
    list_all,
    state_name,
)

log = logging.getLogger(__name__)

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_KILLED = 3
EXIT_TIMEOUT = 124  # `gandiva wait --timeout` passed first (as timeout(1) exits)
# Kinds the poll already reports as state changes; printing them too would double lines.
STATE_EVENT_KINDS = frozenset({"job.state", "job.submitted"})
POLL_INTERVAL_S = 1.0
# Without a terminal there is no live line; a progress line this often instead.
PIPE_PROGRESS_EVERY_S = 30.0
# A failed job's last lines are printed at the end; for this many failed members at most.
SHOW_OUTPUT_OF_FAILED = 3


def outcome_code(states: Sequence[int]) -> int:
    """The worst outcome wins: any failed -> 1, else any killed -> 3, else 0."""
    if common_pb2.JOB_STATE_FAILED in states:
        return EXIT_FAILED
    if common_pb2.JOB_STATE_KILLED in states:
        return EXIT_KILLED
    return EXIT_SUCCEEDED


class Follower:
    """Polls the submitted jobs and prints what changed until all of them end."""

    def __init__(self, client: Client, ids: Sequence[str], multi_id: str,
                 give_up_after: float, until_running: bool = False, deadline: float = math.inf) -> None:
        self.client = client
        self.ids = list(ids)
        self.multi_id = multi_id
        self.give_up_after = give_up_after
        # `gandiva wait --until running`: done once every job has started (or ended);
        # ``deadline`` (monotonic): `--timeout`.
        self.until_running = until_running
        self.deadline = deadline
        self.last: list[common_pb2.Job] = []  # the jobs as last polled
        self.console = output.console()
        self.states: dict[str, int] = {}
        self.seen_history: dict[str, int] = {}
        self.outage = False
        self.last_event_id = 0
        self.last_pipe_progress = time.monotonic()
        self.live: Live | None = None

    def say(self, text: str) -> None:
        """A line above the live progress line (or plain, when piped)."""
        target: Console = self.live.console if self.live else self.console
        target.print(Text(output.visible(text)), soft_wrap=True)
        if not self.live:
            self.console.file.flush()

    def _on_retry(self, reason: str) -> None:
        if not self.outage:
            self.outage = True
            # Not reaching it at all, or it answered that something behind it is down.
            what = (f"lost the scheduler at {self.client.address}" if reason.startswith("cannot")
                    else reason.removesuffix("; try again shortly"))
            self.say(f"{what}; retrying for up to {self.give_up_after:.0f}s")

    def _retrying(self, method: str, request: Any) -> Any:
        return self.client.call_retrying(method, request, self.give_up_after, self._on_retry)

    def poll(self) -> list[common_pb2.Job]:
        if self.multi_id:
            request = scheduler_pb2.ListJobsRequest(multi_job_id=self.multi_id)
            jobs = list_all(self.client, "ListJobs", request, "jobs", call=self._retrying)
        else:  # one job, or the few `gandiva wait` names: each with its history
            jobs = [self.client.call_retrying("GetJob", scheduler_pb2.GetJobRequest(id=job_id), self.give_up_after,
                                              self._on_retry) for job_id in self.ids]
        if self.outage:
            self.outage = False
            self.say(f"reconnected to the scheduler at {self.client.address}")
        return jobs

    def report_changes(self, jobs: Sequence[common_pb2.Job]) -> None:
        for job in jobs:
            if job.history:  # GetJob carries the transitions with their reasons
                for t in job.history[self.seen_history.get(job.id, 0):]:
                    self.say(f"{output.clock(t.at)}  {job.id}  {state_name(t.to_state)}"
                             + (f"  ({t.reason})" if t.reason else ""))
                self.seen_history[job.id] = len(job.history)
            elif self.states.get(job.id) != job.state:
                self.say(f"{output.clock(job.updated_at)}  {job.id}  {state_name(job.state)}"
                         + (f"  ({job.message})" if job.message else ""))
            self.states[job.id] = job.state

    def report_event(self, event: common_pb2.Event) -> None:
        if event.id <= self.last_event_id:
            return  # already shown (the stream and the catch-up can overlap)
        self.last_event_id = event.id
        if event.kind in STATE_EVENT_KINDS:
            return
        if event.job_id and event.job_id not in self.ids:
            return
        where = f"  on {event.server}" if event.server else ""
        self.say(f"{output.clock(event.at)}  {event.job_id or '-'}  {event.kind}: "
                 f"{event.message}{where}")

    def progress(self, jobs: Sequence[common_pb2.Job]) -> str:
        if len(jobs) == 1:
            job = jobs[0]
            if job.state == common_pb2.JOB_STATE_QUEUED and job.message:
                # Why it waits ("needs 4 GPUs, the cluster's up servers have 0"): the line
                # said only "QUEUED ... on -", however long, whatever the reason.
                # Its place in the queue after it (s46), from the scheduler.
                return f"{job.spec.name} {job.id}  QUEUED: {job.message}" + (f"; {job.wait}" if job.wait else "")
            done = f"steps {job.steps}"
            if job.total_steps > 0:  # its progress and ETA (scheduler/eta.py)
                done = (f"{eta.progress_text(job.steps, job.total_steps)}  ETA "
                        f"{eta.about(job.eta_s) if job.eta_s >= 0 else 'unknown'}")
            return (f"{job.spec.name} {job.id}  {state_name(job.state)}  {done}  "
                    f"rate {output.rate(job.rate)}/s  on {output.placement(job.placement)}"
                    + (f"  next turn: {job.wait}" if job.wait and job.state == common_pb2.JOB_STATE_SUSPENDED else ""))
        counts: dict[str, int] = {}
        for job in jobs:
            counts[state_name(job.state)] = counts.get(state_name(job.state), 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        total_rate = sum(j.rate for j in jobs if j.state == common_pb2.JOB_STATE_RUNNING)
        return (f"{len(jobs)} jobs: {summary}  steps {sum(j.steps for j in jobs)}  "
                f"rate {output.rate(total_rate)}/s")

    def show_progress(self, jobs: Sequence[common_pb2.Job]) -> None:
        line = self.progress(jobs)
        if self.live:
            self.live.update(Text(line))
        elif time.monotonic() - self.last_pipe_progress >= PIPE_PROGRESS_EVERY_S:
            self.last_pipe_progress = time.monotonic()
            self.say(line)

    def done(self, jobs: Sequence[common_pb2.Job]) -> bool:
        if self.until_running:
            return bool(jobs) and all(j.state != common_pb2.JOB_STATE_QUEUED for j in jobs)
        return bool(jobs) and all(j.state in TERMINAL_STATES for j in jobs)

    def run(self) -> int:
        single = "" if self.multi_id or len(self.ids) > 1 else self.ids[0]
        self.last_event_id = self._stream_start()
        events = EventFollower(self.client, after_id=self.last_event_id, job_id=single,
                               give_up_after=self.give_up_after).start()
        live_cm: Any = (Live(Text(""), console=self.console, transient=True,
                             refresh_per_second=4) if self.console.is_terminal else nullcontext())
        try:
            with live_cm as live:
                self.live = live
                while True:
                    jobs = self.last = self.poll()
                    if self.done(jobs):
                        self.catch_up(events, single)
                        self.report_changes(jobs)
                        break
                    self.report_changes(jobs)
                    if time.monotonic() >= self.deadline:
                        self.live = None
                        return self.timed_out(jobs)
                    self.show_progress(jobs)
                    if events.error is not None:
                        log.debug("event stream gave up: %s", events.error)
                    for event in events.drain(timeout=POLL_INTERVAL_S):
                        self.report_event(event)
                self.live = None
        except KeyboardInterrupt:
            self.live = None
            print(f"stopped waiting; the job(s) keep running. Follow with `gandiva get jobs "
                  f"{' '.join(self.ids) if not self.multi_id else '--multi-job ' + self.multi_id}`"
                  f", stop with `gandiva kill {' '.join(self.ids)}`", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            events.stop()
        return self.finish(jobs)

    def catch_up(self, events: EventFollower, single: str) -> None:
        """Show the events the stream has not delivered yet, once the jobs have ended,
        so the last ones (a priority change just before a kill) are not lost."""
        for event in events.drain(timeout=0):
            self.report_event(event)
        request = scheduler_pb2.ListEventsRequest(after_id=max(self.last_event_id, 0),
                                                  job_id=single)
        for event in list_all(self.client, "ListEvents", request, "events", call=self._retrying):
            self.report_event(event)

    def _stream_start(self) -> int:
        """Where the event stream starts: a single job's is filtered to it, so from
        the beginning; a multi-job's covers all jobs, so from its first member's
        submission, which keeps a reconnect from skipping anything."""
        if not self.multi_id:
            return 0
        request = scheduler_pb2.ListEventsRequest(job_id=self.ids[0], limit=1)
        first = self.client.call("ListEvents", request).events
        return first[0].id - 1 if first else -1

    def timed_out(self, jobs: Sequence[common_pb2.Job]) -> int:
        for job in jobs:
            if not self.done([job]):
                self.say(f"still waiting at --timeout: {self.progress([job])}")
        return EXIT_TIMEOUT

    def finish(self, jobs: Sequence[common_pb2.Job]) -> int:
        if self.until_running:
            return self.started(jobs)
        failed = 0
        for job in jobs:
            succeeded = job.state == common_pb2.JOB_STATE_SUCCEEDED
            if job.state == common_pb2.JOB_STATE_FAILED:
                # What its program said (a traceback, "no such script"): the exit code alone
                # left the user to find `gandiva logs`.
                failed += 1
                lines = last_output(self.client, job) if failed <= SHOW_OUTPUT_OF_FAILED else []
                if lines and not lines[0].startswith("(its log cannot be read now"):
                    # (none, or none to read: a launch that failed before the program ran
                    # says why in its message, on the line below)
                    self.say(f"{job.id} ({job.spec.name}): its last output (all of it: gandiva logs {job.id}):")
                    for line in lines:
                        self.say("  " + line)
                elif failed == SHOW_OUTPUT_OF_FAILED + 1:
                    self.say("(the output of the other failed jobs: gandiva describe job ID, gandiva logs ID)")
            message = f": {job.message}" if job.message and not succeeded else ""
            # The scheduler's message often names the exit code already.
            shown = job.exit_code and f"exit code {job.exit_code}" not in job.message
            detail = f", exit code {job.exit_code}" if shown else ""
            self.say(f"job {job.id} ({job.spec.name}) {state_name(job.state)} after {job.steps} "
                     f"mini-batches{detail}{message}")
        return outcome_code([j.state for j in jobs])


    def started(self, jobs: Sequence[common_pb2.Job]) -> int:
        """`--until running`: 0 once each has started; a job that ended without ever running
        (killed in the queue, failed at its launch) gives its outcome's code."""
        never = [j for j in jobs if j.state in TERMINAL_STATES and
                 not any(t.to_state == common_pb2.JOB_STATE_RUNNING for t in j.history)]
        for job in jobs:
            if job in never:
                self.say(f"job {job.id} ({job.spec.name}) {state_name(job.state)} without ever running"
                         + (f": {job.message}" if job.message else ""))
            else:
                self.say(f"job {job.id} ({job.spec.name}) has started: {state_name(job.state)} "
                         f"on {output.placement(job.placement)}")
        return outcome_code([j.state for j in never])


def follow(client: Client, ids: Sequence[str], multi_id: str, give_up_after: float) -> int:
    """Wait for the jobs to end, showing progress; the exit code mirrors their outcome."""
    return Follower(client, ids, multi_id, give_up_after).run()


WAIT_DESCRIPTION = """\
Block until jobs start running or end, printing each state change with its reason as it
happens (and those before: the job's history so far), as gandiva-submit does while it waits.
For a script, or a person who submitted with --no-wait:

  gandiva wait j-8d0de09391                       # until it ends; the exit code is its outcome
  gandiva wait j-8d0de09391 --until running && notify-send "my job started"
  gandiva wait mj-1a2b3c4d5e --timeout 2h         # every job of a multi-job

Exit codes: 0 succeeded (--until running: every job has started); 1 failed; 3 killed (the
worst of several wins; --until running: a job that ended without ever running); 2 an unknown
id or bad input; 4 the scheduler unreachable for longer than --reconnect-timeout; 124 --timeout
passed first (the jobs still waiting are named); 130 interrupted. Waiting changes no job.
"""


def register(subparsers: Any, common: Any, set_handler: Any) -> None:
    """`gandiva wait ID... [--until running|done] [--timeout DURATION]`."""
    cmd = subparsers.add_parser("wait", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
                                help="block until jobs start running or end, printing why each state changed",
                                description=WAIT_DESCRIPTION)
    cmd.add_argument("ids", nargs="+", metavar="ID", help="jobs, or one multi-job (mj-...)")
    cmd.add_argument("--until", choices=["running", "done"], default="done",
                     help="done (default): until every job has ended; running: until every job has started")
    cmd.add_argument("--timeout", type=duration, default=None, metavar="DURATION",
                     help="give up after this long (90s, 30m, 2h): exit 124")
    cmd.add_argument("--reconnect-timeout", type=duration, default=600.0, metavar="DURATION",
                     help="how long to keep retrying a scheduler that went away (default 600s): exit 4")
    set_handler(cmd, wait_command)


MAX_WAITED = 100  # jobs one `gandiva wait` names (each is asked for every second)


def wait_command(args: Any, client: Client) -> int:
    ids = list(dict.fromkeys(args.ids))
    multi = [i for i in ids if i.startswith("mj-")]
    if multi and len(ids) > 1:
        raise CliError("give one multi-job's id (mj-...) alone, or job ids (j-...): not both")
    if len(ids) > MAX_WAITED:
        raise CliError(f"{len(ids)} jobs; at most {MAX_WAITED} at once (a multi-job's id covers all its jobs)")
    if multi:
        request = scheduler_pb2.ListJobsRequest(multi_job_id=multi[0], limit=1)
        if not client.call("ListJobs", request).jobs:
            raise CliError(f"no multi-job {multi[0]} (or it has no job you may see)")
    deadline = time.monotonic() + args.timeout if args.timeout else math.inf
    follower = Follower(client, [] if multi else ids, multi[0] if multi else "", args.reconnect_timeout,
                        until_running=args.until == "running", deadline=deadline)
    if multi:
        follower.ids = [j.id for j in follower.poll()]
    if args.output != "json":
        return follower.run()
    # -o json: the lines said while waiting go to stderr; stdout gets the jobs as they were
    # at the end, as `gandiva get jobs -o json` prints them (a list: jq '.[].state').
    follower.console = output.console(sys.stderr)
    code = follower.run()
    output.print_json([job_to_dict(j) for j in follower.last])
    return code
