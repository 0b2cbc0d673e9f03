"""`gandiva scheduler`: start the central scheduling service."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from scheduler.cli.argtypes import (
    at_least_seconds,
    non_negative_seconds,
    positive_seconds,
    retention_days,
)
from scheduler.config import DEFAULT_LISTEN, default_db_url

T = TypeVar("T")

# scheduler.core.Settings field -> the flag that sets it (errors name the flag).
SETTINGS_FLAGS = {
    "down_after_s": "--heartbeat-timeout", "heartbeat_interval_s": "--heartbeat-interval",
    "lease_s": "--lease", "checkpoint_interval_s": "--checkpoint-interval",
    "runtime_connect_deadline_s": "--runtime-connect-deadline", "checkpoint_wait_s": "--checkpoint-wait",
    "hang_after_s": "--hang-after", "hang_restart_after_s": "--hang-restart-after",
    "max_jobs_per_user": "--max-jobs-per-user",
}


def _job_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0 (0: no limit)")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scheduler",
        help="run the central scheduler service",
        description="Run the central scheduler: gRPC API (Scheduler, Runtime, Helper services, "
        "health, reflection), cluster state in SQL, and the scheduling policy.",
    )
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"host:port to listen on (default {DEFAULT_LISTEN}; port 0 picks a free one)")
    p.add_argument(
        "--db",
        default=os.environ.get("GANDIVA_DB"),
        help="database URL: sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PW@HOST/DB "
        "(default $GANDIVA_DB, else an SQLite file under $GANDIVA_HOME, default ~/.gandiva)",
    )
    p.add_argument("--policy", default="gandiva", help="scheduling policy: gandiva (default), fifo, yarn-cs, tiresias, yarn-cs-local")
    # Floors (as `gandiva helper --sample-interval`'s): 1e-9 was taken by each, and the
    # scheduler then suspended and resumed time-sliced jobs every round, ran its rounds back
    # to back (a core), had every helper heartbeat flat out, or checkpointed every running
    # job at each mini-batch.
    p.add_argument("--quantum", type=at_least_seconds(1.0, "a time slice shorter than a suspend and resume take"), default=60.0, help="time slice in seconds at priority 1 (default 60)")
    p.add_argument("--tick", type=at_least_seconds(0.01, "rounds back to back, a core busy"), default=1.0, help="seconds between scheduling rounds (default 1)")
    p.add_argument("--heartbeat-timeout", type=positive_seconds, default=10.0, help="mark a server down, and re-place its jobs, after this many seconds without a heartbeat (default 10)")
    p.add_argument("--heartbeat-interval", type=at_least_seconds(0.05, "every helper heartbeats flat out"),
                   default=2.0, help="seconds between a helper's heartbeats (default 2)")
    p.add_argument("--lease", type=positive_seconds, default=None, help="a helper freezes its jobs after this many seconds without an answered heartbeat; at least 1 s shorter than --heartbeat-timeout so the two never overlap (default 60%% of it)")
    p.add_argument("--checkpoint-interval", type=at_least_seconds(1.0, "each running job checkpoints at "
                                                                       "every mini-batch", zero_ok=True), default=300.0, help="seconds between periodic checkpoints of each running migratable job (default 300; 0: none): a job whose server is lost resumes from its last one")
    p.add_argument("--max-jobs-per-user", type=_job_count, default=1000, metavar="N",
                   help="a user may have at most N jobs not yet ended (queued, running or suspended); "
                   "a submission past it is refused (RESOURCE_EXHAUSTED) until some end. Operators are "
                   "not limited; without --auth token each user name a client gives counts on its own "
                   "(default 1000; 0: no limit)")
    p.add_argument("--checkpoint-wait", type=non_negative_seconds, default=60.0, metavar="S",
                   help="a queued job whose checkpoint is in the ramdisk of a server that is down waits up "
                   "to S seconds after that server's last heartbeat for it to come back, then starts "
                   "again from step 0 elsewhere (default 60; 0: no wait)")
    p.add_argument("--runtime-connect-deadline", type=at_least_seconds(
                       1.0, "every job is marked not suspendable before its python has started"), default=120.0, metavar="S",
                   help="a launched job none of whose processes connects the Gandiva runtime (tf_runtime) "
                   "within S seconds is marked not suspendable and not migratable: it is never "
                   "time-sliced, packed or migrated and keeps its GPUs to its end (default 120; "
                   "raise it for jobs that prepare data for long before importing TensorFlow)")
    p.add_argument("--hang-after", type=non_negative_seconds, default=600.0, metavar="S",
                   help="a running job none of whose mini-batches ends for S seconds, or 20 times its own "
                   "mini-batch time if longer, is flagged hung (describe, events, gandiva_jobs_hung); "
                   "never during its start-up and first mini-batch, nor while its shim is in a run that "
                   "is not a training step, such as an evaluation (default 600; 0: never)")
    p.add_argument("--hang-restart-after", type=non_negative_seconds, default=600.0, metavar="S",
                   help="a job flagged hung that is still hung S seconds later is stopped and re-queued "
                   "to resume from its last checkpoint; its third hang fails it (default 600; 0: only "
                   "flag hung jobs)")
    p.add_argument("--also-listen", action="append", default=[], metavar="ADDRESS", help="serve on this address too (repeatable), e.g. unix:/run/gandiva.sock for operator tools on this host")
    p.add_argument("--port-file", help="write the bound host:port to this file once listening")
    sec = p.add_argument_group(
        "security", "Listening on anything but loopback needs --tls-cert/--tls-key and --auth token "
        "(or --insecure). Make certificates with `gandiva tls init`, tokens with `gandiva token create`.")
    sec.add_argument("--auth", choices=["none", "token"], default="none",
                     help="token: every call must carry a token (--token / GANDIVA_TOKEN); "
                     "none (default): trust every caller")
    sec.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM)")
    sec.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    sec.add_argument("--tls-client-ca", metavar="FILE",
                     help="require client certificates signed by this CA (mutual TLS)")
    sec.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback address without TLS and tokens (not recommended)")
    p.add_argument("--event-retention-days", type=retention_days, default=0.0, metavar="DAYS",
                   help="delete events of jobs finished more than DAYS ago, hourly (default 0: keep; "
                   "else at least 1 hour, 0.042)")
    p.add_argument("--http-listen", default="", metavar="HOST:PORT",
                   help="serve Prometheus /metrics and the live dashboard (/) on this address; "
                   "port 0 picks a free one (off by default)")
    p.add_argument("--http-port-file", help="write the bound HTTP host:port to this file once listening")
    p.add_argument("--http-allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests naming this host (repeatable): a proxy on this machine that "
                   "passes its users' Host (nginx proxy_set_header Host $host), or, for a dashboard on a "
                   "network address without --auth token (where it is required), each name its users type. "
                   "Others get 421, against DNS rebinding; addresses and this machine's names are always answered")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="set one policy knob (repeatable), e.g. pack_trial_s=20 grow_idle_s=10 "
                   "host_memory_use=0.8 job_host_memory_bytes=2GiB (sizes: bytes or K/M/G/T units); "
                   "the knobs are the fields of scheduler.policy.types.PolicyConfig (docs/policy.md), "
                   "with its defaults")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    p.add_argument("--log-format", default="text", choices=("text", "json"),
                   help="text (default) or json: one object per line, with job_id and command_id "
                   "on every line about a job or a command")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scheduler.policy.types import PolicyConfig

    # The policy's options first, before the server's imports: a typo fails in a blink.
    try:
        for which, address in (("--listen", args.listen), *(("--also-listen", a) for a in args.also_listen)):
            _check_listen(which, address)
        config = PolicyConfig(quantum_s=args.quantum, **policy_options(args.policy_option))
        if args.http_listen and "/" in args.http_listen:  # http://HOST:PORT was taken for a host "http://HOST"
            raise ValueError(f"--http-listen {args.http_listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9100 "
                             "(no http://, no path; port 0 picks one)")
        if args.http_listen:  # before the database is made or migrated
            from scheduler.observe.http import (
                allowed_host_names,
                check_dashboard_exposure,
                split_listen,
            )

            split_listen(args.http_listen)
            allowed_host_names(args.http_allow_host)
            check_dashboard_exposure(args.http_listen, args.auth == "token", args.http_allow_host, args.insecure)
    except ValueError as err:
        print(f"gandiva scheduler: {err}", file=sys.stderr)
        return 2
    from scheduler.core import Settings
    from scheduler.errors import InvalidArgument
    from scheduler.observe.logs import setup_logging
    from scheduler.server import SchedulerServer, serve
    from scheduler.state.owner import DatabaseHeld
    from scheduler.transport import SecurityError, ServerTls

    try:
        setup_logging(args.log_level, args.log_format)
        server = SchedulerServer(
            db_url=args.db or default_db_url(),
            listen=args.listen,
            policy=args.policy,
            settings=Settings(down_after_s=args.heartbeat_timeout, heartbeat_interval_s=args.heartbeat_interval, lease_s=args.lease,
                              checkpoint_interval_s=args.checkpoint_interval,
                              runtime_connect_deadline_s=args.runtime_connect_deadline,
                              checkpoint_wait_s=args.checkpoint_wait, hang_after_s=args.hang_after,
                              hang_restart_after_s=args.hang_restart_after,
                              max_jobs_per_user=args.max_jobs_per_user),
            policy_config=config,
            tick_s=args.tick,
            also_listen=tuple(args.also_listen),
            auth=args.auth,
            tls=ServerTls.from_flags(args.tls_cert, args.tls_key, args.tls_client_ca),
            insecure=args.insecure,
            event_retention_days=args.event_retention_days,
            http_listen=args.http_listen,
            http_allow_hosts=tuple(args.http_allow_host),
        )
        run_loop(serve(server, args.port_file, args.http_port_file))
    except InvalidArgument as err:
        # A Settings field named by its flag, the way the operator gave it.
        flag = SETTINGS_FLAGS.get(err.field)
        said = f"{flag}: {err.message}" if flag else str(err)
        if err.field == "lease_s" and args.lease is None:
            said = _derived_lease_refused(args.heartbeat_timeout, args.heartbeat_interval)
        print(f"gandiva scheduler: {said}", file=sys.stderr)
        return 2
    except (ValueError, OSError, SecurityError, DatabaseHeld) as err:
        print(f"gandiva scheduler: {err}", file=sys.stderr)
        return 2
    return 0


def _check_listen(flag: str, address: str) -> None:
    """ValueError for an address to serve on that names none: empty, or unix: without a path (each
    was "refusing to listen on  without --tls-cert/--tls-key ...", or served nothing there)."""
    if not address.strip() or (address.startswith("unix:") and not address[5:].lstrip("/")):
        raise ValueError(f"{flag} {address!r}: no address; give HOST:PORT (e.g. {DEFAULT_LISTEN}) or "
                         "unix:PATH (e.g. unix:/run/gandiva.sock)")


def _derived_lease_refused(timeout: float, interval: float) -> str:
    """Why a lease derived from --heartbeat-timeout (none given) cannot work, naming the two
    flags given and what would: `--heartbeat-timeout 1e-9` was "--lease: a lease of -1s is
    shorter than two heartbeats", of a flag not given and a lease below zero."""
    from scheduler.core import LEASE_MARGIN_S, Settings

    share = Settings(down_after_s=600.0).lease / 600.0  # of a timeout long enough for it (60%)
    least = max(2 * interval / share, 2 * interval + LEASE_MARGIN_S)
    most = min(share * timeout, timeout - LEASE_MARGIN_S) / 2
    fix = f"give a --heartbeat-timeout of at least {_said_so_it_works(least, lambda t: (t, interval), up=True)} s"
    if most >= 0.05:  # --heartbeat-interval's floor
        fix += f" or a --heartbeat-interval of at most {_said_so_it_works(most, lambda i: (timeout, i), up=False)} s"
    return (f"--heartbeat-timeout {timeout:g} s with --heartbeat-interval {interval:g} s: the helpers' lease "
            f"({share:.0%} of the timeout, no --lease given) would be shorter than two heartbeats, and they "
            f"would freeze their jobs after one late heartbeat; {fix}")


def _said_so_it_works(value: float, flags: Callable[[float], tuple[float, float]], up: bool) -> str:
    """`value` in 3 significant digits, rounded up (`up`) or down to one that, given as
    (timeout, interval) = flags(it), works: "at least 3.33 s" at --heartbeat-interval 1
    (3.333...) was refused when given, as was "at most 2.5 s" at 2.5 (2.4995)."""
    from scheduler.core import Settings
    from scheduler.errors import InvalidArgument

    text = f"{value:.3g}"
    for _ in range(10):
        shown = float(text)
        try:
            timeout, interval = flags(shown)
            Settings(down_after_s=timeout, heartbeat_interval_s=interval)
            return text
        except InvalidArgument:
            unit = 10.0 ** (math.floor(math.log10(shown)) - 2)  # the last digit shown
            text = f"{shown + unit if up else shown - unit:.3g}"
    return f"{value:.3g}"


def policy_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> PolicyConfig keyword arguments, each converted to the
    field's type; a ValueError naming the bad option otherwise."""
    import dataclasses

    from migration_protocol.host_memory import parse_size
    from scheduler.policy.types import PolicyConfig

    fields = {f.name: f for f in dataclasses.fields(PolicyConfig) if f.name != "quantum_s"}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--policy-option {pair!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(fields))}")
        default = fields[key].default
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1")
            elif isinstance(default, int) and key.endswith("_bytes"):
                out[key] = parse_size(raw)  # 4GiB, 512MiB or bytes
            elif isinstance(default, int):
                out[key] = int(raw)
            elif isinstance(default, float) or default is None:
                out[key] = None if raw.lower() == "none" else float(raw)
            else:
                raise ValueError(raw)
        except ValueError as err:
            if key.endswith("_bytes"):
                raise ValueError(f"--policy-option {pair!r}: {err}") from None
            kind = type(default).__name__ if default is not None else "number or none"
            raise ValueError(f"--policy-option {pair!r}: {raw!r} is not a {kind}") from None
        # Every number of the policy is a time, a count, a factor or a share: `nan`, `inf` and
        # negatives parsed as floats and started a scheduler with them (a NaN compares false
        # with anything: pack_trial_s=nan never ended a packing trial), where `gandiva sim`'s
        # flags for the same rules refuse them.
        value = out[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value < math.inf:
            off = " (none turns it off)" if default is None else ""
            raise ValueError(f"--policy-option {pair!r}: must be a finite number, not negative{off}")
    for key, flag in (("gather_large", "gather-large"), ("probe_large", "probe-large")):
        if out.get(key):
            # Its jobs are larger than a server, and the live scheduler launches no job over
            # several servers yet: it would empty or hold servers for a launch then refused.
            raise ValueError(f"--policy-option {key}=true: the live scheduler does not launch jobs over "
                             f"several servers yet, so the servers it takes could not be used; it is a "
                             f"simulator rule for now (gandiva sim --{flag})")
    return out


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run an entry point's coroutine on uvloop where available (it is not built for
    every platform), else on asyncio's loop; set up in entry points only."""
    import asyncio

    from scheduler.loops import new_event_loop

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
