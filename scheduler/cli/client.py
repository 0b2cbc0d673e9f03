"""What every Gandiva client command shares: the channel to the scheduler, turning
gRPC errors into one clear line and an exit code, retrying through a scheduler
restart, and converting API messages to the plain dicts that ``-o json`` prints.

Exit codes used by all client commands (documented in docs/cli.md):
0 success, 2 invalid input / unknown id / scheduler unreachable, 4 gave up waiting
for a scheduler that went away, 130 interrupted.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler import transport
from scheduler.cli import output
from scheduler.config import scheduler_address
from scheduler.errors import BUSY_METADATA

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 2
# A waiting client gave up on a scheduler that stayed away too long.
EXIT_LOST = 4
EXIT_INTERRUPTED = 130

# A unary call should never hang a terminal: the scheduler answers in milliseconds.
CALL_TIMEOUT_S = 15.0
# Except where it waits for the job: a suspend or resume is applied at the job's next
# mini-batch boundary, and the scheduler waits up to its command timeout (60 s) for it.
ACTION_TIMEOUT_S = 75.0
ACTION_METHODS = frozenset({"SuspendJob", "ResumeJob"})
# And where it waits for a runtime: a migration of a job whose runtime is reconnecting (its
# stream dropped, the scheduler restarted) waits up to the scheduler's OPERATOR_CONNECT_WAIT_S
# (10 s) for it before it begins; the answer then takes what any answer takes. With 15 s in
# all, a runtime back at 9 s left a loaded scheduler 6 s to answer, not 15.
CONNECT_WAIT_S = {"MigrateJob": 10.0}
# One action on a job runs at a time; a second is refused FAILED_PRECONDITION "job ... has a
# command in progress; try again shortly" (a periodic checkpoint, every few seconds, or
# another client's action). These are asked again for up to BUSY_WAIT_S before that is said.
BUSY_METHODS = frozenset({"SuspendJob", "ResumeJob", "MigrateJob"})
BUSY_WAIT_S = 30.0
# grpc's own reconnect back-off grows to 120 s by default; a client waiting on a
# restarting scheduler should notice it is back within a couple of seconds.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

T = TypeVar("T")


class CliError(Exception):
    """A failure the user must fix or know about; printed as one line, exit code 2."""

    def __init__(self, message: str, code: int = EXIT_ERROR, status: grpc.StatusCode | None = None,
                 answer_lost: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the gRPC status it came from, if any
        # Set (to what went wrong) when the request may have been done and only its answer
        # was lost: the scheduler stopped answering after the request went out.
        self.answer_lost = answer_lost


def add_security_flags(parser: Any) -> None:
    """--token and the TLS flags every client command takes."""
    parser.add_argument("--token", help="access token (default: $GANDIVA_TOKEN)")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="CA certificate to trust the scheduler by (default: $GANDIVA_TLS_CA)")
    parser.add_argument("--tls-cert", metavar="FILE",
                        help="client certificate, for mutual TLS (default: $GANDIVA_TLS_CERT)")
    parser.add_argument("--tls-key", metavar="FILE", help="its key (default: $GANDIVA_TLS_KEY)")


def client_from_args(args: Any) -> Client:
    try:
        security = transport.ClientSecurity.from_env(
            args.token, args.tls_ca, args.tls_cert, args.tls_key)
    except transport.SecurityError as exc:
        raise CliError(str(exc)) from None
    return Client(args.scheduler, security)


def list_all(client: Client, method: str, request: Any, field: str, limit: int = 0,
             call: Callable[[str, Any], Any] | None = None) -> list[Any]:
    """Every item of a paged listing (at most ``limit`` when positive), page by page.
    ``call``: how to make each call (default ``client.call``)."""
    out: list[Any] = []
    request.page_token = ""
    call = call or client.call
    while True:
        if limit:
            request.limit = min(limit - len(out), 1000)
        reply = call(method, request)
        out.extend(getattr(reply, field))
        if not reply.next_page_token or (limit and len(out) >= limit):
            return out[:limit] if limit else out
        request.page_token = reply.next_page_token


class Client:
    """A Scheduler stub bound to one address, with errors mapped to CliError."""

    def __init__(self, flag: str | None = None, security: transport.ClientSecurity | None = None) -> None:
        if flag is not None and not flag.strip():  # `--scheduler "$UNSET"` silently meant the default
            raise CliError("--scheduler is empty; give HOST:PORT (or leave it out for GANDIVA_SCHEDULER, "
                           f"else {scheduler_address()})")
        self.address = scheduler_address(flag)
        if self.address.startswith("unix:") and not self.address[5:].lstrip("/"):
            # gRPC said "unavailable: empty address list; try again shortly", as of a scheduler restarting.
            raise CliError(f"scheduler address {self.address}: no socket path; give unix:PATH, e.g. "
                           "unix:/run/gandiva.sock (the scheduler's --also-listen)")
        port = self.address.rpartition(":")[2]
        if port.isascii() and port.isdigit() and int(port) > 65535:  # gRPC would wrap it around
            raise CliError(f"scheduler address {self.address}: port {int(port)} is out of range "
                           "(0-65535)")
        if ":" in self.address and not self.address.startswith("unix:") and "/" not in self.address \
                and not (port.isascii() and port.isdigit()):
            # gRPC said only "cannot reach the scheduler at host:abc (host:abc)".
            raise CliError(f"scheduler address {self.address}: port {port!r} is not a number; give HOST:PORT, "
                           "e.g. 127.0.0.1:50051")
        try:
            security = security or transport.ClientSecurity.from_env()
            self.tls = bool(security.tls_ca)
            self.client_cert = bool(security.tls_cert)
            self.channel = transport.channel(self.address, security, CHANNEL_OPTIONS)
        except transport.SecurityError as exc:
            raise CliError(str(exc)) from None
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """Call one unary RPC by name; any gRPC error becomes a CliError. The timeout is
        CALL_TIMEOUT_S (plus CONNECT_WAIT_S for a call that may wait for a runtime), or
        ACTION_TIMEOUT_S for a call that waits for the job."""
        if timeout is None:
            timeout = ACTION_TIMEOUT_S if method in ACTION_METHODS else \
                CALL_TIMEOUT_S + CONNECT_WAIT_S.get(method, 0.0)
        def attempt() -> Any:
            return getattr(self.stub, method)(request, timeout=timeout)

        try:
            if method not in BUSY_METHODS:
                return attempt()
            # `gandiva suspend` during a periodic checkpoint exited 2 "try again shortly":
            # the user had to retry by hand what the client can.
            told: list[bool] = []

            def waiting(exc: grpc.RpcError) -> None:
                if not told:
                    told.append(True)
                    print(f"{_details(exc)}: asking again for up to {BUSY_WAIT_S:g}s", file=sys.stderr)

            return with_backoff(attempt, BUSY_WAIT_S, grpc.RpcError, is_busy, waiting)
        except grpc.RpcError as exc:
            status = exc.code() if hasattr(exc, "code") else None
            if status in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE) and \
                    not _never_sent(exc) and method in ANSWER_MAY_BE_LOST:
                # The request may have reached the scheduler and been done; only the answer is lost.
                why = describe_rpc_error(exc, self.address, self.tls, self.client_cert)
                raise CliError(f"{why}; {ANSWER_MAY_BE_LOST[method]}", status=status, answer_lost=why) from None
            raise CliError(describe_rpc_error(exc, self.address, self.tls, self.client_cert), status=status) from None

    def call_retrying(
        self,
        method: str,
        request: Any,
        give_up_after: float,
        on_retry: Callable[[str], None] | None = None,
    ) -> Any:
        """Like call(), but waits through UNAVAILABLE (a restarting scheduler) with
        back-off for up to ``give_up_after`` seconds before raising CliError."""
        def attempt() -> Any:
            return getattr(self.stub, method)(request, timeout=CALL_TIMEOUT_S)

        try:
            return with_backoff(attempt, give_up_after, grpc.RpcError, is_transient,
                                on_retry and (lambda exc: on_retry(describe_rpc_error(exc, self.address, self.tls, self.client_cert))))
        except grpc.RpcError as exc:
            raise CliError(describe_rpc_error(exc, self.address, self.tls, self.client_cert)) from None


E = TypeVar("E", bound=BaseException)


def with_backoff(
    attempt: Callable[[], T],
    give_up_after: float,
    catch: type[E],
    retry: Callable[[E], bool],
    on_retry: Callable[[E], None] | None = None,
) -> T:
    """``attempt()`` again, 0.25 s later and then twice as long each time (at most 5 s),
    while it raises ``catch`` that ``retry`` says is worth another try, for up to
    ``give_up_after`` seconds; then the last error is raised."""
    deadline = time.monotonic() + give_up_after
    delay = 0.25
    while True:
        try:
            return attempt()
        except catch as exc:
            if not retry(exc) or time.monotonic() + delay > deadline:
                raise
            if on_retry:
                on_retry(exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# What a caller cannot tell when the scheduler stopped answering after the request went out.
ANSWER_MAY_BE_LOST = {
    "SubmitJob": "the job may have been submitted all the same: look for it with `gandiva get jobs` "
                 "before submitting again",
    "SubmitMultiJob": "the jobs may have been submitted all the same: look for them with `gandiva get jobs` "
                      "before submitting again",
}


def _never_sent(exc: grpc.RpcError) -> bool:
    """The call failed before the scheduler could have read it (nothing listens there, the
    name does not resolve): what it asked for certainly was not done."""
    details = _details(exc).lower()
    return any(m in details for m in ("connection refused", "failed to connect", "dns resolution failed",
                                      "errors resolving", "lookup", "connections to all backends failing"))


def _details(exc: grpc.RpcError) -> str:
    return (exc.details() if hasattr(exc, "details") else None) or str(exc)


def is_busy(exc: grpc.RpcError) -> bool:
    """The job has another command in progress: worth asking again shortly. Told by the
    refusal's trailing metadata (BUSY_METADATA); before, by its English words, which a
    rewording would have silently turned into no retry. The words are still taken from a
    scheduler older than the metadata."""
    code = exc.code() if hasattr(exc, "code") else None
    if code != grpc.StatusCode.FAILED_PRECONDITION:
        return False
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    if any(tuple(item) == BUSY_METADATA for item in trailing or ()):
        return True
    return "has a command in progress" in _details(exc)


def is_transient(exc: grpc.RpcError) -> bool:
    """Errors worth waiting out: the scheduler is restarting or briefly overloaded."""
    code = exc.code() if hasattr(exc, "code") else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def describe_rpc_error(exc: grpc.RpcError, address: str, tls: bool | None = None,
                       client_cert: bool = False) -> str:
    """One line a person can act on, naming the address when the scheduler is not there.
    ``tls``: whether the call went over TLS (None: not known); ``client_cert``: with a
    client certificate."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    up = "the scheduler is up; "
    if code == grpc.StatusCode.UNAVAILABLE and details.startswith(up):
        # Its database is down (since when, and why): the scheduler's own words, in one line.
        return f"the scheduler at {address} is up; {_first_line(details[len(up):])}"
    if code == grpc.StatusCode.UNAVAILABLE and not _is_connection_failure(details):
        # The scheduler itself answered: something behind it (its database) is down.
        return f"the scheduler at {address} is unavailable: {_first_line(details)}; try again shortly"
    if code == grpc.StatusCode.UNAVAILABLE:
        wrong = _wrong_door(details, address, tls, client_cert)
        if wrong:
            return wrong
        return (
            f"cannot reach the scheduler at {address} ({_connect_reason(details)}); "
            "start it with `gandiva scheduler` or point to it with --scheduler ADDR "
            "or GANDIVA_SCHEDULER"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the scheduler at {address} did not answer in time; is it overloaded or stuck?"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"not signed in to the scheduler at {address}: {details}"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:  # gRPC's own size check
        return f"too large: {_first_line(details)} (the scheduler takes requests up to 16 MiB)"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # --max-jobs-per-user, open watches: says what to do
        return f"refused: {details}"
    if code in _PREFIXES:
        return f"{_PREFIXES[code]}: {details}"
    if code == grpc.StatusCode.UNIMPLEMENTED:  # was "answered UNIMPLEMENTED: Method not found!"
        return (f"{address} does not know this call: it is not a Gandiva scheduler (a helper's --listen "
                "address?) or a scheduler older than this gandiva; check --scheduler ADDR (or "
                "GANDIVA_SCHEDULER), or upgrade the scheduler")
    name = code.name if code is not None else "ERROR"
    return f"the scheduler at {address} answered {name}: {_first_line(details)}"


# Answers whose details already say what is wrong: one word of context before them.
_PREFIXES = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.NOT_FOUND: "not found",
    grpc.StatusCode.FAILED_PRECONDITION: "not possible now",
    grpc.StatusCode.PERMISSION_DENIED: "not allowed",
    # a --request-id sent again with another body (was "the scheduler at ADDR answered ALREADY_EXISTS: ...")
    grpc.StatusCode.ALREADY_EXISTS: "refused",
}

# How grpc words a failure to reach the server at all (as opposed to an
# UNAVAILABLE the scheduler sent, e.g. while its database is down).
_CONNECTION_MARKERS = (
    "failed to connect", "connection refused", "dns resolution failed", "socket closed",
    "connection reset", "connections to all backends failing", "goaway", "end of tcp stream",
    "errors resolving", "lookup", "timeout occurred",
)


def _wrong_door(details: str, address: str, tls: bool | None, client_cert: bool) -> str:
    """Something answers at the address, but not as this client spoke to it: TLS to a
    plaintext scheduler or the reverse, a CA that does not sign its certificate, the
    dashboard's HTTP port. Each was "cannot reach the scheduler (OK|Socket closed);
    start it with `gandiva scheduler`" while it ran. "" when none of these."""
    lowered = details.lower()
    if "handshake failed" in lowered:
        if "wrong_version_number" in lowered:
            return (f"the scheduler at {address} does not speak TLS (it runs without --tls-cert): "
                    "leave out --tls-ca (and GANDIVA_TLS_CA), or check the address")
        reason = next((part.strip() for part in reversed(details.split(":"))
                       if part.strip() and part.strip() != "OK"), "")
        return (f"TLS with the scheduler at {address} failed ({reason}): give --tls-ca (or "
                "GANDIVA_TLS_CA) the ca.pem that `gandiva tls init` wrote with its server.pem, and an "
                "address its certificate names (gandiva tls init --host); with mutual TLS also "
                "--tls-cert and --tls-key")
    if "http1.x server" in lowered or "expected settings frame" in lowered:
        return (f"{address} answers HTTP/1 (the scheduler's --http-listen dashboard?), not gRPC: "
                "give the scheduler's --listen address (default port 50051)")
    if "socket closed" in lowered and tls is False:
        return (f"the scheduler at {address} closed the connection at once: if it runs with TLS "
                "(--tls-cert), pass --tls-ca FILE or set GANDIVA_TLS_CA (its ca.pem); else it is "
                "stopping, try again")
    if "socket closed" in lowered and tls and not client_cert:
        return (f"the scheduler at {address} closed the connection at once: if it asks for client "
                "certificates (--tls-client-ca), pass --tls-cert and --tls-key (or GANDIVA_TLS_CERT, "
                "GANDIVA_TLS_KEY: a pair from gandiva tls init --client NAME); else it is stopping, try again")
    return ""


def _is_connection_failure(details: str) -> bool:
    lowered = details.lower()
    return any(marker in lowered for marker in _CONNECTION_MARKERS)


def _connect_reason(details: str) -> str:
    """The useful tail of grpc's connect error: "Connection refused", "Domain name not found"."""
    return _first_line(details).rsplit(": ", 1)[-1].strip(" []") or "unreachable"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def run_command(prog: str, body: Callable[[], int]) -> int:
    """Run a command body, printing a CliError as ``prog: error: ...`` on stderr."""
    try:
        return body()
    except CliError as exc:
        # Escaped: the scheduler's words may quote a job's own (`gandiva migrate` gave a
        # runtime's reason with its escapes raw to the operator's terminal).
        print(f"{prog}: error: {output.visible_lines(str(exc))}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


class EventFollower:
    """Follows WatchEvents in a background thread and hands events over a queue.

    When the stream breaks (the scheduler restarted), it re-opens it after a
    back-off, resuming after the last event id it saw, so no event is lost or
    repeated. Non-transient errors and giving up are reported as a CliError
    through ``error``.
    """

    def __init__(
        self,
        client: Client,
        after_id: int = 0,
        job_id: str = "",
        give_up_after: float = 600.0,
        on_status: Callable[[str], None] | None = None,
        kinds: Sequence[str] = (),
        server: str = "",
    ) -> None:
        self.client = client
        self.last_id = after_id
        self.job_id = job_id
        self.kinds, self.server = list(kinds), server
        self.give_up_after = give_up_after
        self.on_status = on_status
        self.events: queue.Queue[common_pb2.Event] = queue.Queue()
        self.error: CliError | None = None
        self._stop = threading.Event()
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name="gandiva-watch", daemon=True)

    def start(self) -> EventFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()

    def _run(self) -> None:
        # Back-off between attempts that brought no event, so a scheduler that
        # accepts connections but fails the stream (database down) is not hammered.
        delay = 0.0
        while not self._stop.is_set():
            request = scheduler_pb2.WatchEventsRequest(after_id=self.last_id, job_id=self.job_id,
                                                       kinds=self.kinds, server=self.server)
            try:
                self._call = self.client.stub.WatchEvents(request)
                for event in self._call:
                    delay = 0.0
                    self.last_id = max(self.last_id, event.id)
                    self.events.put(event)
                # A clean end means the scheduler is shutting down: wait for the next one.
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                if not is_transient(exc) and exc.code() != grpc.StatusCode.CANCELLED:
                    self.error = CliError(describe_rpc_error(exc, self.client.address, self.client.tls,
                                                                self.client.client_cert))
                    return
            if self._stop.wait(delay):
                return
            delay = min(max(delay * 2, 0.25), 5.0)
            if self._ready_within(0.2):
                continue  # still connected: the stream failed for another reason; retry
            self._status(f"lost the event stream from {self.client.address}; reconnecting")
            if not self._wait_until_ready():
                return
            self._status(f"reconnected to the scheduler at {self.client.address}")

    def _wait_until_ready(self) -> bool:
        """Block until the channel connects again; False when stopped or given up."""
        deadline = time.monotonic() + self.give_up_after
        while not self._stop.is_set():
            if self._ready_within(1.0):
                return True
            if time.monotonic() > deadline:
                self.error = CliError(
                    f"gave up: the scheduler at {self.client.address} has been unreachable "
                    f"for {self.give_up_after:.0f}s",
                    code=EXIT_LOST,
                )
                return False
        return False

    def _ready_within(self, seconds: float) -> bool:
        future = grpc.channel_ready_future(self.client.channel)
        try:
            future.result(timeout=seconds)
            return True
        except grpc.FutureTimeoutError:
            future.cancel()
            return False

    def _status(self, message: str) -> None:
        if self.on_status:
            self.on_status(message)

    def drain(self, timeout: float) -> list[common_pb2.Event]:
        """Events received so far, waiting up to ``timeout`` seconds for the first one."""
        out: list[common_pb2.Event] = []
        try:
            out.append(self.events.get(timeout=timeout))
            while True:
                out.append(self.events.get_nowait())
        except queue.Empty:
            pass
        return out

    def __iter__(self) -> Iterator[common_pb2.Event]:
        """Events forever (for ``get events --watch``), raising the follower's error."""
        while True:
            if self.error is not None:
                raise self.error
            yield from self.drain(timeout=0.5)


def state_name(state: int) -> str:
    """JOB_STATE_RUNNING -> RUNNING (what people and -o json see); '' when unset."""
    if state == common_pb2.JOB_STATE_UNSPECIFIED:
        return ""
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def state_value(name: str) -> common_pb2.JobState.ValueType:
    """RUNNING / running / JOB_STATE_RUNNING -> the enum value; CliError when unknown."""
    key = name.strip().upper()
    if not key.startswith("JOB_STATE_"):
        key = "JOB_STATE_" + key
    try:
        return common_pb2.JobState.Value(key)
    except ValueError:
        known = ", ".join(state_name(v) for v in common_pb2.JobState.values() if v)
        raise CliError(f"--state: unknown state {name!r} (one of {known})") from None


TERMINAL_STATES = frozenset(
    {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED}
)


def job_servers(job: common_pb2.Job) -> list[str]:
    """The names of the servers a job is placed on, in placement order, each once."""
    return list(dict.fromkeys(ref.server for ref in job.placement))


def spec_to_dict(spec: common_pb2.JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": spec.name,
        "command": list(spec.command),
        "workdir": spec.workdir,
        "env": dict(sorted(spec.env.items())),
        "gpus": spec.gpus,
        "priority": spec.priority,
        "grow_shrink": spec.grow_shrink,
        "user": spec.user,
    }
    if spec.steps:
        out["steps"] = spec.steps
    if spec.multi_job_id or spec.params or spec.index:
        out.update(
            multi_job_id=spec.multi_job_id, index=spec.index, params=dict(sorted(spec.params.items()))
        )
    return out


def job_to_dict(job: common_pb2.Job) -> dict[str, Any]:
    """A job as ``-o json`` prints it: the fields scripts rely on first."""
    spec = job.spec
    return {
        "id": job.id,
        "name": spec.name,
        "state": state_name(job.state),
        "gpus": spec.gpus,
        "servers": job_servers(job),
        "steps": job.steps,
        "total_steps": job.total_steps,
        "total_steps_from": job.total_steps_from,
        "eta_s": job.eta_s if job.eta_s >= 0 else None,
        "eta_note": job.eta_note,
        "wait": job.wait,
        "rate": job.rate,
        "alone_rate": job.alone_rate or None,  # its rate alone on its GPUs, where measured
        "priority": spec.priority,
        "placement": [{"server": ref.server, "gpu": ref.index} for ref in job.placement],
        "user": spec.user,
        "multi_job_id": spec.multi_job_id,
        "index": spec.index,
        "params": dict(sorted(spec.params.items())),
        "command": list(spec.command),
        "workdir": spec.workdir,
        "env": dict(sorted(spec.env.items())),
        "grow_shrink": spec.grow_shrink,
        "migratable": job.migratable,
        "suspendable": job.suspendable,
        "control_note": job.control_note,
        "grow_shrink_note": job.grow_shrink_note,
        "host_memory_bytes": job.host_memory_bytes,
        "gpu_seconds": job.gpu_seconds,
        "held": job.held,
        "message": job.message,
        "exit_code": job.exit_code,
        "metrics": dict(sorted(job.metrics.items())),
        "submitted_at": job.submitted_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
        "history": [
            {
                "from": state_name(t.from_state),
                "to": state_name(t.to_state),
                "at": t.at,
                "reason": t.reason,
            }
            for t in job.history
        ],
    }


def _fields(message: Any, names: str) -> dict[str, Any]:
    """Scalar fields of a message by name, as they are."""
    return {name: getattr(message, name) for name in names.split()}


def server_to_dict(server: common_pb2.Server) -> dict[str, Any]:
    """A server as ``-o json`` prints it: name, gpus, height, affinity, up first."""
    out = _fields(server, "name gpus height affinity up allocated address last_heartbeat ramdisk "
                  "host_memory_bytes host_memory_used_bytes host_memory_use cordoned cordoned_at cordon_reason draining")
    out["gpu_list"] = [
        dict(_fields(g, "index uuid model memory_total_bytes memory_used_bytes utilization"),
             jobs=list(g.jobs))
        for g in server.gpu_list
    ]
    out["checkpoints_for"] = list(server.checkpoints_for)
    return out


def event_to_dict(event: common_pb2.Event) -> dict[str, Any]:
    return _fields(event, "id at kind job_id server message")


LAST_OUTPUT_LINES = 10
LAST_OUTPUT_BYTES = 8 << 10


def last_output(client: Client, job: common_pb2.Job) -> list[str]:
    """The last lines the job printed (its error, for a failed job), without the lines
    Gandiva adds to the log; one line saying why when the log cannot be read."""
    try:
        size = client.call("ReadJobLog", scheduler_pb2.ReadJobLogRequest(id=job.id, max_bytes=1)).size
        offset = max(0, size - LAST_OUTPUT_BYTES)
        data = client.call("ReadJobLog", scheduler_pb2.ReadJobLogRequest(
            id=job.id, offset=offset, max_bytes=LAST_OUTPUT_BYTES)).data
    except CliError as exc:
        return [f"(its log cannot be read now: {exc})"]
    lines = data.decode("utf-8", "replace").splitlines()[1 if offset else 0:]  # from a whole line on
    lines = [line for line in lines if line.strip() and not line.startswith("=== gandiva: ")]
    return lines[-LAST_OUTPUT_LINES:]


def not_a_multi_job(job_id: str) -> None:
    """A multi-job's id where one job's is needed: it was "not found: job 'mj-...' not found",
    of an id gandiva-submit had just printed."""
    if job_id.startswith("mj-"):
        raise CliError(f"{job_id} is a multi-job: name one of its jobs (gandiva get jobs {job_id} lists them; "
                       f"gandiva kill {job_id} kills them all)")
