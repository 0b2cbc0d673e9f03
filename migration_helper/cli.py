"""`gandiva helper` (the daemon on each GPU server) and `gandiva logs JOB [-f]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from migration_helper.config import ConfigError, HelperConfig, default_log_dir
from migration_protocol.host_memory import parse_size
from scheduler.config import scheduler_address

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    helper = subparsers.add_parser(
        "helper",
        help="run the Migration Helper daemon on this server",
        description="Registers this server and its GPUs with the scheduler, runs the jobs placed "
        "here under the tf_runtime shim, pre-warms migrations and receives checkpoints.",
    )
    helper.add_argument("--server-name", required=True, help="this server's name in the cluster")
    helper.add_argument("--gpus", type=int, default=None,
                        help="virtual GPUs where there is no NVIDIA driver (default 4)")
    helper.add_argument("--virtual", action="store_true",
                        help="use virtual GPUs even where NVML finds real ones")
    helper.add_argument("--ramdisk", type=Path, default=None,
                        help="checkpoint directory in RAM (default /dev/shm/gandiva-NAME)")
    helper.add_argument("--shared-root", type=Path, default=None,
                        help="where the peers' ramdisks are mounted, as ROOT/PEER-NAME (NFS-style)")
    helper.add_argument("--checkpoint-retain", type=float, default=600.0, metavar="SECONDS",
                        help="how long a checkpoint nobody needs stays in the ramdisk (default 600: "
                        "a migration may fall back on it); a checkpoint the scheduler still names "
                        "as a job's restore point (a parked or re-queued job) stays while it does")
    helper.add_argument("--listen", default="127.0.0.1:0",
                        help="address of this helper's agent service for peers (default 127.0.0.1:0)")
    helper.add_argument("--scheduler", default=None, help="scheduler address (or GANDIVA_SCHEDULER)")
    helper.add_argument("--log-dir", type=Path, default=None,
                        help="job logs directory (default $GANDIVA_HOME/logs)")
    helper.add_argument("--sample-interval", type=float, default=1.0,
                        help="seconds between GPU samples (default 1)")
    helper.add_argument("--log-format", default="text", choices=("text", "json"),
                        help="text (default) or json: one object per line, with job_id and "
                        "command_id on every line about a job or a command")
    helper.add_argument("--http-listen", default="", metavar="HOST:PORT",
                        help="serve Prometheus /metrics (GPU utilization and memory, jobs) here; "
                        "port 0 picks a free one (off by default)")
    helper.add_argument("--http-allow-host", action="append", default=[], metavar="NAME",
                        help="also answer /metrics requests that come through a loopback address "
                        "naming this host (repeatable; a proxy on this machine passing its users' "
                        "Host). Others get 421, against DNS rebinding; given, requests on network "
                        "addresses are held to these names, its own and its addresses too")
    helper.add_argument("--host-memory", default=None, metavar="SIZE",
                        help="host memory this server's jobs may hold together, running and "
                        "suspended (a suspended job keeps its process), e.g. 64GiB, 512MiB or "
                        "bytes; 0 reports none and the scheduler does not check it here. Default: "
                        "this machine's MemTotal, or the memory.max of this helper's cgroup when "
                        "lower. Several helpers on one machine each claim the whole machine "
                        "unless each is given its share here")
    helper.add_argument("--lease", type=float, default=None,
                        help="freeze this server's jobs after this many seconds without an answered "
                        "heartbeat (default: the scheduler's lease, sent at registration; a value "
                        "here can only shorten it, to two of the scheduler's heartbeats at least)")
    sec = helper.add_argument_group(
        "security", "The helper's token comes from `gandiva token create SERVER --helper`; each job "
        "it launches gets a token good for that job only. An agent on a non-loopback address "
        "needs --tls-cert/--tls-key and --tls-client-ca (only cluster members connect), or --insecure.")
    sec.add_argument("--token", help="this helper's token (default: $GANDIVA_TOKEN)")
    sec.add_argument("--tls-ca", metavar="FILE",
                     help="CA that signed the scheduler's and peers' certificates (default: $GANDIVA_TLS_CA)")
    sec.add_argument("--tls-cert", metavar="FILE",
                     help="this server's certificate: served on the agent port and presented to "
                     "the scheduler and peers")
    sec.add_argument("--tls-key", metavar="FILE", help="its private key")
    sec.add_argument("--tls-client-ca", metavar="FILE",
                     help="the agent accepts only clients with a certificate from this CA (mTLS)")
    sec.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback agent address without TLS (not recommended)")
    sec.add_argument("--max-transfer-gib", type=float, default=64.0,
                     help="largest checkpoint a peer may stream in (default 64 GiB)")
    helper.set_defaults(func=run_helper)

    logs = subparsers.add_parser(
        "logs", help="print (or follow) a job's output",
        description="Print (or follow) a job's output. By default through the scheduler, from the "
        "server the job runs or ran on last: only the job's owner and operators may read it "
        "(with --auth token). With --local or --log-dir, read this server's log file directly "
        "(an operator on the GPU server).")
    logs.add_argument("job", help="job id")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    logs.add_argument("--local", action="store_true",
                      help="read this server's log file instead of asking the scheduler")
    logs.add_argument("--log-dir", type=Path, default=None,
                      help="with --local: job logs directory (default $GANDIVA_HOME/logs); implies --local")
    logs.add_argument("--raw", action="store_true",
                      help="on a terminal too, print the output byte for byte (by default a terminal "
                      "gets its colours and line ends, and every other control character escaped)")
    logs.add_argument("--scheduler", metavar="ADDR",
                      help="scheduler address (default: $GANDIVA_SCHEDULER, else 127.0.0.1:50051)")
    from scheduler.cli.client import add_security_flags

    add_security_flags(logs)
    logs.set_defaults(func=run_logs)


def run_helper(args: argparse.Namespace) -> int:
    from scheduler.transport import ClientSecurity, SecurityError, ServerTls

    try:
        host_memory = None if args.host_memory is None else parse_size(args.host_memory)
    except ValueError as exc:
        print(f"gandiva helper: --host-memory: {exc}", file=sys.stderr)
        return 2
    gib = args.max_transfer_gib
    if math.isnan(gib) or gib == -math.inf:  # as bytes they read "0 (...)" or "-9.3e-10 (... -1)"
        print(f"gandiva helper: --max-transfer-gib {gib:g}: must be a positive number of GiB; it caps the "
              "checkpoint a peer may stream in", file=sys.stderr)
        return 2
    try:
        security = ClientSecurity.from_env(args.token, args.tls_ca, args.tls_cert, args.tls_key)
        tls = ServerTls.from_flags(args.tls_cert, args.tls_key, args.tls_client_ca)
        config = HelperConfig(
            server_name=args.server_name,
            scheduler=scheduler_address(args.scheduler),
            listen=args.listen,
            gpus=args.gpus,
            ramdisk=args.ramdisk,
            shared_root=args.shared_root,
            log_dir=args.log_dir,
            checkpoint_retain_s=args.checkpoint_retain,
            sample_interval_s=args.sample_interval,
            report_interval_s=max(5.0, args.sample_interval),
            lease_s=args.lease,
            security=security,
            tls=tls,
            insecure=args.insecure,
            # NaN and negative sizes fail in HelperConfig, which names the flag.
            max_transfer_bytes=_gib_to_bytes(args.max_transfer_gib),
            host_memory_bytes=host_memory,
            virtual=args.virtual,
        )
    except (ConfigError, SecurityError) as exc:
        print(f"gandiva helper: {exc}", file=sys.stderr)
        return 2
    from scheduler.observe.logs import setup_logging

    setup_logging("INFO", args.log_format)
    _hide_from_jobs(bool(args.token))
    # (--virtual goes in the config: it used to be set in this process's environment, which
    # a helper run in a test's process, refused at its start, left to every later test.)
    from scheduler.cli.serve import run_loop

    try:
        run_loop(_serve(config, args.http_listen, tuple(args.http_allow_host)))
    except (SecurityError, OSError, ValueError) as exc:
        print(f"gandiva helper: {exc}", file=sys.stderr)
        return 2
    return 0


def _hide_from_jobs(token_flag: bool) -> None:
    """The jobs run as this helper's user: without this they could read its token from
    /proc/PID/environ (or its memory) and act as this server towards the scheduler -
    register another agent address and be sent other servers' checkpoints. A process
    that is not dumpable keeps /proc/PID/environ, mem and ptrace to root."""
    import ctypes
    import logging

    log = logging.getLogger("migration_helper")
    if token_flag:
        log.warning("--token on the command line can be read by every user of this machine "
                    "(ps, /proc/PID/cmdline); give it in GANDIVA_TOKEN instead")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("could not hide this helper's memory and environment from its jobs: %s", exc)


PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def _gib_to_bytes(gib: float) -> int:
    """GiB as bytes; NaN or infinity as 0 or -1 (refused by HelperConfig, which names the flag)."""
    if math.isnan(gib):
        return 0
    if math.isinf(gib):
        return -1 if gib < 0 else 1 << 62
    return int(gib * (1 << 30))


async def _serve(config: HelperConfig, http_listen: str = "", allow_hosts: tuple[str, ...] = ()) -> None:
    from migration_helper.daemon import HelperDaemon
    from migration_helper.metrics import HelperMetrics
    from scheduler.observe.http import HttpServer

    daemon = HelperDaemon(config)
    # Any Host on its network addresses unless names are given (a Prometheus may scrape it by any name).
    http = (HttpServer(http_listen, HelperMetrics(daemon).routes(), allow_hosts=allow_hosts, any_host=not allow_hosts)
            if http_listen else None)
    await daemon.start()
    if http is not None:
        print(f"helper {config.server_name} metrics on http://{await http.start()}/metrics", flush=True)
    # One line on stdout that scripts (and the benchmark) wait for.
    print(f"helper {config.server_name} listening on {daemon.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: stopping jobs")
    if http is not None:
        await http.stop()
    await daemon.stop()


def run_logs(args: argparse.Namespace) -> int:
    if not args.local and args.log_dir is None:
        from scheduler.cli.client import client_from_args, run_command

        return run_command("gandiva logs", lambda: _remote_logs(args, client_from_args(args)))
    from scheduler.validation import MAX_ID

    log_dir = (args.log_dir or default_log_dir()).expanduser()
    path = log_dir / f"{args.job}.log"
    if len(args.job.encode()) > MAX_ID:  # a file name too long for the file system: it was a traceback
        print(f"gandiva logs: {args.job[:40]!r}... is not a job id ({len(args.job.encode()):,} bytes; an id has at "
              f"most {MAX_ID}, such as j-8d0de09391)", file=sys.stderr)
        return 2
    if "/" in args.job or not path.is_file():
        print(f"gandiva logs: no output for job {args.job!r} under {log_dir} "
              "(logs stay on the server that ran the job)", file=sys.stderr)
        return 1
    from scheduler.cli.output import JobOutput, visible

    ends = _ProcessEnds(args.job)
    out = JobOutput(args.raw)
    try:
        with open(path, "rb") as f:
            while True:
                data = f.read(1 << 16)
                if data:
                    out.write(data)
                    ends.feed(data)
                    continue
                if not args.follow:
                    return 0
                if os.fstat(f.fileno()).st_size < f.tell():  # truncated (logrotate's copytruncate)
                    print(f"gandiva logs: {path} was truncated; reading it from its start", file=sys.stderr)
                    f.seek(0)
                    continue
                if ends.all_ended():
                    # Every process of the job that wrote here has ended (the helper writes
                    # a line after each one's output): nothing more comes.
                    print(f"gandiva logs: job {args.job}'s process on this server ended ({visible(ends.last)}); "
                          f"`gandiva logs {args.job} -f` follows the job wherever it runs", file=sys.stderr)
                    return 0
                time.sleep(0.2)
    except KeyboardInterrupt:
        return 0
    finally:
        out.close()


class _ProcessEnds:
    """Counts, from a job's log as it is read, the processes started there (the helper's
    `=== gandiva: job J incarnation I on ...` line) and ended (`=== gandiva: end of job J
    incarnation I: REASON ...`). A log written before the end lines existed never ends."""

    START = re.compile(rb"=== gandiva: job (\S+) incarnation \S+ on ")
    END = re.compile(rb"=== gandiva: end of job (\S+) incarnation \S+: (.*?)(?: at \d{4}-\d\d-\d\d [\d:]+)?$")

    def __init__(self, job: str) -> None:
        self.job = job.encode()
        self.running = 0
        self.ended = 0
        self.last = ""
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        self._partial = self._partial[-4096:]  # a marker line is short; output lines may not be
        for line in lines:
            if b"=== gandiva: " not in line:
                continue
            if (m := self.START.search(line)) and m[1] == self.job:
                self.running += 1
            elif (m := self.END.search(line)) and m[1] == self.job:
                self.running = max(self.running - 1, 0)
                self.ended += 1
                self.last = m[2].decode(errors="replace").strip()

    def all_ended(self) -> bool:
        return self.ended > 0 and self.running == 0


def _remote_logs(args: argparse.Namespace, client: Any) -> int:
    """Page through the job's output with ReadJobLog (the scheduler checks who may).

    With -f, until the job has finished: once it is seen finished, what is left of
    the output is read and printed, then the command ends (as `kubectl logs -f`).
    A job that has not run on any server yet has no output: said on stderr; -f waits
    for it to start (or to end without running).
    """
    from protos.gandiva.v1 import common_pb2, scheduler_pb2
    from scheduler.cli.client import TERMINAL_STATES, not_a_multi_job
    from scheduler.cli.output import JobOutput

    not_a_multi_job(args.job)
    offset = 0
    finished = False
    said_waiting = False
    out = JobOutput(args.raw)
    try:
        while True:
            got = client.call("ReadJobLog", scheduler_pb2.ReadJobLogRequest(id=args.job, offset=offset))
            if got.data:
                out.write(got.data)
                offset = got.next_offset
                continue
            # `finished` was seen before this read found nothing more: all is printed.
            if finished or (not args.follow and got.server):
                return 0
            job = client.call("GetJob", scheduler_pb2.GetJobRequest(id=args.job))
            state = common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
            if not got.server and job.state in TERMINAL_STATES:
                print(f"gandiva logs: job {args.job} ended ({state}) without running on any server: "
                      "it has no output", file=sys.stderr)
                return 0
            if not got.server and not said_waiting:
                said_waiting = True
                if not args.follow:
                    print(f"gandiva logs: job {args.job} has no output yet: it has not run on any server "
                          f"({state}); `gandiva logs {args.job} -f` waits for it", file=sys.stderr)
                    return 0
                print(f"gandiva logs: job {args.job} has not run on any server yet ({state}); "
                      "waiting for its output", file=sys.stderr)
            finished = job.state in TERMINAL_STATES
            if not finished:
                time.sleep(0.5)
    finally:
        out.close()
        client.close()
