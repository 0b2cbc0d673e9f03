"""`gandiva top`: the live dashboard's view in the terminal.

Reads the scheduler's dashboard JSON (``/api/state``, served by
``gandiva scheduler --http-listen``) and redraws: servers and their GPUs (who runs,
who waits for a time slice, who is packed), the jobs with state, mini-batches, rate
and the reason for the scheduler's last decision about them, and the latest decisions.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from scheduler import eta, transport
from scheduler.cli import argtypes, output

TERMINAL = ("SUCCEEDED", "FAILED", "KILLED")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="watch the cluster live in the terminal (servers, GPUs, jobs, decisions)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--http", default=os.environ.get("GANDIVA_HTTP", ""), metavar="HOST:PORT",
                   help="the scheduler's --http-listen address, or the dashboard's URL as a browser shows "
                   "it (http://HOST:PORT/) (default $GANDIVA_HTTP)")
    p.add_argument("--interval", type=_interval, default=2.0,
                   help=f"seconds between refreshes (default 2, at least {MIN_INTERVAL:g}: each refresh reads "
                   f"the whole cluster from the scheduler; at most {MAX_INTERVAL:,.0f}, a day)")
    p.add_argument("--once", action="store_true", help="print one view and exit (e.g. into a file)")
    p.add_argument("--all", action="store_true", help="also list finished jobs")
    p.add_argument("--token", help="an operator's token, for a scheduler with --auth token (default: $GANDIVA_TOKEN)")
    p.add_argument("--decisions", type=argtypes.duration, metavar="SINCE",
                   help="print the scheduler's decisions of the last SINCE (90s, 30m, 1h) and exit: each with its "
                   "reason and, for a change it tries, whether it was kept (a pack trial kept, undone, rejected "
                   "or void; a move moved, not done, aborted or failed), then a count of those")
    p.add_argument("--job", default="", help="with --decisions: that job's only")
    p.set_defaults(func=run)


# Each refresh is a whole /api/state (every unfinished job, ETAs computed): --interval
# 0.0001 polled the scheduler as fast as it answered, a busy loop on both sides.
MIN_INTERVAL = 0.5
MAX_INTERVAL = 86400.0


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    if value < MIN_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"at least {MIN_INTERVAL:g} seconds, got {text!r}: each refresh reads the whole cluster from "
            f"the scheduler (the dashboard polls every 2 s)")
    if value > MAX_INTERVAL:  # 1e23 showed one view, then an OverflowError traceback from its sleep
        raise argparse.ArgumentTypeError(
            f"at most {MAX_INTERVAL:,.0f} seconds (a day), got {text!r}; for one view, give --once")
    return value


def _http_address(text: str) -> str:
    """HOST:PORT of --http (or GANDIVA_HTTP), also given as the dashboard's URL (http://HOST:PORT/).
    That URL was read as a host named "http" ("cannot read http://http://..."), a path as part of
    the address ("Not Found"), a port past 65535 or a blank as a scheduler not running."""
    address = text.strip()
    if address[:7].lower() == "http://":
        address = address[7:]
    address = address.rstrip("/")
    host, sep, port = address.rpartition(":")
    if not (sep and host and address.isascii() and address.isprintable() and " " not in address
            and "/" not in address and port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"--http {text!r}: expected the scheduler's --http-listen address, HOST:PORT (e.g. "
                         "127.0.0.1:9100), or its dashboard's URL, http://HOST:PORT/")
    return address


class NotHttp(ValueError):
    """The address answered, but not in HTTP (a gRPC port, say)."""


class Refused(ValueError):
    """The scheduler wants a token (401) or an operator's (403): its own words."""


class Unhealthy(ValueError):
    """The scheduler answered 503: it is up, its database is not (its own words)."""


class NotState(ValueError):
    """The address answered HTTP, but not with the scheduler's state."""


# What one read of /api/state may take. The scheduler's answer is bounded (the first 1,000
# queued jobs; 408 KiB with 20,000 queued); an address that is not the scheduler's can send
# anything: an endless answer took `top` to 1.4 GB in 40 s, one that trickled a byte a second
# kept it waiting for ever (urllib's timeout is per read), JSON nested 200,000 deep and JSON of
# another shape ended it with a traceback.
MAX_ANSWER_BYTES = 64 << 20
ANSWER_DEADLINE_S = 60.0


def fetch(address: str, token: str = "", path: str = "/api/state") -> dict[str, Any]:
    request = urllib.request.Request(f"http://{address}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    where = f"http://{address}{path.partition('?')[0]}"  # (what the messages name)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return _state(where, _read_bounded(where, r))
    except http.client.HTTPException:  # BadStatusLine, RemoteDisconnected, ...
        raise NotHttp(f"{address} did not answer HTTP; is it the scheduler's --http-listen "
                      "address?") from None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403, 421):  # (421: a loopback dashboard asked by another name)
            said = output.visible(err.read(2048).decode("utf-8", "replace").strip())
            raise Refused(f"{where}: {said}") from None
        if err.code == 503:
            try:
                said = str(json.loads(err.read(8192))["error"])
            except (ValueError, KeyError, TypeError):
                raise err from None
            raise Unhealthy(output.visible(said)) from None
        raise


def _read_bounded(where: str, answer: Any) -> bytes:
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    chunks: list[bytes] = []
    size = 0
    while chunk := answer.read1(1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise NotState(f"{where} answered more than {MAX_ANSWER_BYTES >> 20} MiB; "
                           "is it the scheduler's --http-listen address?")
        if time.monotonic() > deadline:
            raise NotState(f"{where} sent {size:,} bytes in {ANSWER_DEADLINE_S:.0f} s and "
                           "had not finished; is it the scheduler's --http-listen address?")
    return b"".join(chunks)


def _state(where: str, body: bytes) -> dict[str, Any]:
    try:
        state = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise NotState(f"{where} did not answer the scheduler's JSON "
                       f"({type(err).__name__}); is it the scheduler's --http-listen address?") from None
    if not isinstance(state, dict):
        raise NotState(f"{where} answered JSON that is not the scheduler's state; "
                       "is it the scheduler's --http-listen address?")
    return state


def view(state: dict[str, Any], show_all: bool = False, height: int | None = None) -> Group:
    """render() (as many jobs as ``height`` lines hold; all without it), with JSON of another
    shape (an older scheduler, another program) a NotState."""
    try:
        return render(state, show_all, None if height is None else fitting_jobs(state, height))
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:
        raise NotState(f"/api/state answered JSON that is not the scheduler's state ({type(err).__name__}: "
                       f"{output.visible(str(err))[:200]}); is it the scheduler's --http-listen address?") from None


def _why(err: Exception) -> str:
    """The reason of a failed read, without urllib's wrapping (`<urlopen error ...>`)."""
    reason = getattr(err, "reason", None) if isinstance(err, urllib.error.URLError) else None
    return str(getattr(reason, "strerror", None) or reason or err)


def _said(job: dict[str, Any], said: str) -> str:
    """A job's reason cell: a waiting job's place in the queue or next turn first, as the page
    shows it (the scheduler's `wait`, from the policy's state; "" while it does not wait)."""
    wait = job.get("wait") or ""
    if not wait:
        return said
    return f"{wait}. {said}" if job["state"] == "QUEUED" else f"next turn: {wait} ({said})"


def _cells(*values: str) -> list[Text]:
    """Table cells as plain text: a job named `[/x]` is not rich markup (a MarkupError), and
    its control characters are shown escaped."""
    return [Text(output.visible(v)) for v in values]


def fitting_jobs(state: dict[str, Any], height: int) -> int:
    """How many job rows a live view of ``height`` lines has room for (at least 5): the
    header, the servers' table (a row per GPU), the jobs' table frame and the decisions."""
    gpus = sum(len(srv["gpus"]) for srv in state["servers"])
    return max(5, height - gpus - 22 - len(_problems(state)) - len(_slow(state)))


def render(state: dict[str, Any], show_all: bool = False, max_jobs: int | None = None) -> Group:
    """The view; ``max_jobs``: at most that many job rows (the live view: a terminal's
    height), jobs on GPUs first, then the queue, then finished ones, and a line saying how
    many more there are. With 3,000 queued jobs the live view built all 3,000 rows each
    refresh (11 s on a loaded 2-core machine, longer than its 2-s interval) to show 50."""
    names = {j["id"]: j["name"] for j in state["jobs"]}
    active = [j for j in state["jobs"] if show_all or j["state"] not in TERMINAL]
    more = 0
    if max_jobs is not None and len(active) > max_jobs:
        active = sorted(active, key=lambda j: 2 if j["state"] in TERMINAL else j["state"] == "QUEUED")
        more, active = len(active) - max_jobs, active[:max_jobs]
    more += state.get("queued_not_listed", 0)  # the scheduler sends the first 1,000 queued
    shown = f"{len(active)} of {len(active) + more:,}" if more else f"{len(active)}"
    head = Text(f"Gandiva: {len(state['servers'])} servers, {shown} jobs shown, cluster height "
                f"{state['height']}" + (" (overloaded: time-slicing)" if state["overloaded"] else ""),
                style="bold")
    servers = Table(title="servers and GPUs", title_justify="left", expand=False)
    for col in ("server", "height", "host memory", "GPU", "mode", "util", "jobs (dim: waiting its time slice)"):
        servers.add_column(col)
    for srv in state["servers"]:
        for k, g in enumerate(srv["gpus"]):
            on_gpu = Text()
            for e in g["jobs"]:
                on_gpu.append(f"{output.visible(e['name'] or e['id'])} ", style="" if e["state"] == "RUNNING" else "dim")
            servers.add_row(*_cells(_server_label(srv) if k == 0 else "",
                                    str(srv["height"]) if k == 0 else "",
                                    output.host_memory(srv.get("host_memory_used", 0), srv.get("host_memory", 0))
                                    if k == 0 else "", str(g["index"]), g["mode"],
                                    # (a down server's is its last sample from before)
                                    f"{g['utilization']:.0%}" if srv.get("up", True) else "-"), on_gpu)
    jobs = Table(title="jobs", title_justify="left")
    for col in ("job", "name", "state", "GPUs", "where", "mini-batches", "rate/s", "ETA", "last decision"):
        jobs.add_column(col, justify="right" if col in ("mini-batches", "rate/s", "ETA") else "left",
                        no_wrap=col != "last decision", overflow="ellipsis" if col != "last decision" else "fold")
    for j in active:
        d = j["last_decision"]
        # A stopped job has no pace now, nor one started that has timed no mini-batch yet
        # (it read 0.0 here and on the page, "-" in `gandiva get jobs`).
        rate = f"{j['rate']:.1f}" if j["state"] == "RUNNING" and j["rate"] > 0 else "-"
        if j.get("against_alone") is not None:  # (a scheduler older than session 50 sends none)
            rate += f" ({j['against_alone']:.2f}x alone)"
        jobs.add_row(*_cells(j["id"], j["name"], j["state"].lower(), str(j["gpus"]), " ".join(j["placement"]),
                             j.get("progress", "").removeprefix("step ") or str(j["steps"]), rate,
                             eta.short(-1.0 if j.get("eta_s") is None else j["eta_s"], j["steps"],
                                       j.get("total_steps", 0), ended=j["state"] in ("SUCCEEDED", "FAILED", "KILLED")),
                             _said(j, f"{d['kind']}: {d['reason']}" if d else j["message"])))
    rest = Text(f"... and {more:,} more jobs (gandiva get jobs lists them all)\n" if more else "", style="dim")
    latest = Text()
    for d in state["decisions"][-8:]:
        latest.append(output.visible(f"{time.strftime('%H:%M:%S', time.localtime(d['at']))} {d['kind']:<9} "
                                     f"{names.get(d['job'], d['job'])}: {d['reason']}"
                                     + (f" -> {d['outcome']}" if d.get("outcome") else "")) + "\n")
    return Group(head, *_gpu_time(state), *_problems(state), *_slow(state), servers, jobs, rest,
                 Text("latest decisions", style="bold"), latest)


# How the GPUs' time was spent (/api/state's gpu_time), in this order.
GPU_TIME_KINDS = ("training", "packed", "suspended", "moving", "idle")


def gpu_time_line(got: dict[str, Any] | None, now: float) -> str:
    """"GPU time over the last 60m (4.0 GPU-hours seen): training 62%, packed 10%, ...", or ""
    when the scheduler sends none (one older than session 52) or has seen no GPU yet. Also the
    page's line above its GPU timeline (scheduler/observe/static/index.html)."""
    try:
        if not got or not got.get("seen"):
            return ""
        period = output.duration(max(0.0, now - got["since"]))
        parts = ", ".join(f"{k} {got[k] / got['seen']:.0%}" for k in GPU_TIME_KINDS if got.get(k))
        return f"GPU time over the last {period} ({got['seen'] / 3600:.2f} GPU-hours seen): {parts}"
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        return ""  # (an answer of another shape: the rest of the view still shows)


def _gpu_time(state: dict[str, Any]) -> list[Text]:
    said = gpu_time_line(state.get("gpu_time"), state.get("now", 0.0))  # (neither: an older scheduler)
    return [Text(said, style="dim")] if said else []


# What a tried change's outcome counts as, for the summary line.
_KEPT = ("kept", "moved", "grown", "shrunk")


def decisions_view(got: dict[str, Any], since_s: float, names: dict[str, str] | None = None) -> Group:
    """``gandiva top --decisions SINCE``: the decision log of a period, each tried change
    (pack, migrate, grow, shrink) with its outcome, and a line counting them (a move's time
    left out: `moved 2`). ``names``: job id -> name (the jobs /api/state lists)."""
    names = names or {}
    try:
        rows, now = got["decisions"], float(got["now"])
        lines = Text()
        tried: dict[str, list[str]] = {}
        for d in rows:
            outcome = d.get("outcome") or ""
            if d["kind"] in ("pack", "migrate", "grow", "shrink"):
                outcome = outcome or "not known yet"
                tried.setdefault(d["kind"], []).append(outcome.split(" in ")[0])
            who = f"{d['job']} ({names[d['job']]})" if names.get(d["job"]) else d["job"]
            where = f" {','.join(d['gpus'])}" if d["gpus"] else ""
            lines.append(output.visible(f"{time.strftime('%H:%M:%S', time.localtime(d['at']))} {d['kind']:<11} "
                                        f"{who}{where}: {d['reason']}"))
            if outcome:
                lines.append(output.visible(f" -> {outcome}"), style="green" if outcome.startswith(_KEPT) else "yellow")
            lines.append("\n")
        head = Text(f"{len(rows)} decision(s) since {time.strftime('%H:%M:%S', time.localtime(now - since_s))}"
                    + (f" (the scheduler keeps its latest {got['kept']:,}: this period's older ones are gone)"
                       if got.get("incomplete") else ""), style="bold")
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError, OSError) as err:
        # (OverflowError, OSError: a time no clock reads, as `"now": 1e300`)
        raise NotState(f"/api/decisions answered JSON that is not the scheduler's decision log "
                       f"({type(err).__name__}); is it the scheduler's --http-listen address?") from None
    counts = []
    for kind, outcomes in tried.items():
        tally = collections.Counter(sorted(outcomes))  # (in the order of the outcomes' names)
        counts.append(f"{kind} {len(outcomes)}: " + ", ".join(f"{o} {n}" for o, n in tally.items()))
    summary = Text("tried changes: " + ("; ".join(counts) if counts else "none"), style="bold")
    return Group(head, lines, summary)


def _slow(state: dict[str, Any]) -> list[Text]:
    """One line naming the running jobs slower than their own rate alone, slowest first."""
    slow = sorted((j for j in state["jobs"] if j.get("slow")), key=lambda j: j["against_alone"])
    if not slow:
        return []
    return [Text(output.visible("slower than alone: " + ", ".join(
        f"{j['name'] or j['id']} {j['against_alone']:.2f}x ({j['rate']:.1f} vs {j['alone_rate']:.1f}/s)"
        for j in slow)), style="yellow")]


# Problems shown at the top of the live view (the rest: `gandiva get problems`).
PROBLEMS_SHOWN = 5


def _problems(state: dict[str, Any]) -> list[Text]:
    """What needs a person (`gandiva get problems`), one line each, under the header."""
    found = state.get("problems") or []
    lines = [Text(output.visible(f"! {p['kind']} {p['subject'] or ''}: {p['what']}; next: {p['next']}"), style="red")
             for p in found[:PROBLEMS_SHOWN]]
    if len(found) > PROBLEMS_SHOWN:
        lines.append(Text(f"! ... and {len(found) - PROBLEMS_SHOWN} more: gandiva get problems", style="red"))
    return lines


def _server_label(srv: dict) -> str:
    """Its name, with "(down)", "(cordoned)" or "(draining)" (gandiva cordon / drain)."""
    if not srv["up"]:
        return f"{srv['name']} (down)"
    if srv.get("cordoned"):
        return f"{srv['name']} ({'draining' if srv.get('draining') else 'cordoned'})"
    return str(srv["name"])


def run(args: argparse.Namespace) -> int:
    from rich.live import Live

    # On a terminal at its width; piped (--once into a file) one row per line, never cut: at
    # the 80 columns rich assumes for a pipe, the jobs' last-decision column got no room at all.
    console = output.console()
    # Errors: one line on stderr (never wrapped, never mixed into a view piped to a file).
    if not args.http:
        print("gandiva top: no address; start the scheduler with --http-listen HOST:PORT and pass "
              "--http HOST:PORT (or set GANDIVA_HTTP)", file=sys.stderr)
        return 2
    try:
        args.http = _http_address(args.http)
        token = transport.ClientSecurity.from_env(args.token).token
    except (ValueError, transport.SecurityError) as err:
        print(f"gandiva top: {err}", file=sys.stderr)
        return 2
    if args.job and not args.decisions:
        print("gandiva top: --job goes with --decisions SINCE", file=sys.stderr)
        return 2
    path = "/api/state"
    # The dashboard takes ?since= up to 2**53 s (its QUERY_MAX): `--decisions 1e300` was refused
    # there ("cannot read ... (Bad Request)"); a longer period is all the log holds.
    since_s = min(args.decisions or 0.0, 2.0**53)
    if args.decisions:
        path = f"/api/decisions?since={math.ceil(since_s)}" + (
            f"&job={urllib.parse.quote(args.job)}" if args.job else "")
    try:
        state = fetch(args.http, token, path)
        if args.decisions:
            listed = fetch(args.http, token)  # the jobs' names (unfinished, and the latest finished)
            try:
                names = {j["id"]: j["name"] for j in listed["jobs"]}
            except (KeyError, TypeError, AttributeError) as err:
                raise NotState(f"http://{args.http}/api/state answered JSON that is not the scheduler's state "
                               f"({type(err).__name__}); is it the scheduler's --http-listen address?") from None
            try:
                shown = decisions_view(state, since_s, names)
            except NotState as err:  # (its words begin with the path)
                raise NotState(f"http://{args.http}{err}") from None
            console.print(shown)
            return 0
    except (NotHttp, Refused, Unhealthy, NotState) as err:
        print(f"gandiva top: {err}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as err:
        print(f"gandiva top: cannot read http://{args.http}{path.partition('?')[0]} ({_why(err)}); is the scheduler "
              "running with --http-listen on that address?", file=sys.stderr)
        return 1
    try:
        first = view(state, args.all, None if args.once else console.size.height)
    except NotState as err:
        print(f"gandiva top: http://{args.http}{err}", file=sys.stderr)
        return 1
    if args.once:
        console.print(first)
        return 0
    try:
        with Live(first, console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(args.interval)
                try:  # only the rows the terminal has room for
                    live.update(view(fetch(args.http, token), args.all, console.size.height))
                except (Unhealthy, NotState) as err:  # not "cannot reach": something answered
                    live.update(Text(f"{err}; retrying", style="red"))
                except (urllib.error.URLError, OSError, ValueError) as err:
                    live.update(Text(f"cannot reach the scheduler ({err}); retrying", style="red"))
    except KeyboardInterrupt:
        return 0
