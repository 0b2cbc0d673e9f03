"""The job processes of one helper and the helper commands that act on them
(launch, pre-warm, activate, stop, transfer a checkpoint)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path

import grpc

from migration_helper.agent import TransferTooSlow, send_checkpoint
from migration_helper.files import open_regular, read_regular
from migration_helper.launch_rule import isolated_launch, job_environment, shim_command
from migration_helper.process import OWNER_ENV, JobProcess, ProcessExited
from migration_helper.ramdisk import CheckpointError, CheckpointMissing, safe_name
from protos.gandiva.v1 import helper_pb2
from scheduler.auth import runtime_token
from scheduler.transport import ClientSecurity
from tf_runtime.checkpoint import FORMAT, MANIFEST, check_manifest, parse_manifest
from tf_runtime.checkpoint import CheckpointError as TornCheckpoint
from tf_runtime.lease import LEASE_ENV

log = logging.getLogger(__name__)

Result = helper_pb2.HelperCommandResult
# The most of a job's log one read_log command returns.
MAX_LOG_READ = 1 << 20
# The most of a checkpoint's gandiva.json read before a restore (the shim's lists its files and
# variables' names: kilobytes); a job may put a link to a huge file there, read on the event loop.
MAX_MANIFEST_BYTES = 16 << 20

# The checkpoint path each command may name: confined (in `handle`) to the helper's roots.
_PATH_FIELDS = {"launch": "restore_checkpoint", "activate": "restore_checkpoint",
                "transfer": "checkpoint_path"}


class CommandFailed(Exception):
    """A command that could not be carried out; becomes ok=false with this message.
    ``server_fault``: for a reason of this server's, not the job's."""

    def __init__(self, message: str, exit_code: int = 0, server_fault: bool = False,
                 transfer_fault: helper_pb2.TransferFault.ValueType = helper_pb2.TRANSFER_FAULT_UNSPECIFIED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.server_fault = server_fault
        self.transfer_fault = transfer_fault


class JobTable:
    """Processes keyed by (job id, incarnation): during a migration within one server,
    or a restart at the source, two incarnations of a job may briefly coexist."""

    def __init__(
        self,
        *,
        server: str,
        scheduler: str,
        log_dir: Path,
        on_exit: Callable[[JobProcess], None],
        stop_grace_s: float = 10.0,
        prewarm_timeout_s: float = 600.0,
        first_step_timeout_s: float = 600.0,
        security: ClientSecurity | None = None,
        roots: Sequence[Path] = (),
        peer_check: Callable[[str], Awaitable[str]] | None = None,
        owner: str = "",
        lease_ran_out: Callable[[], bool] = lambda: False,
        lease_file: str = "",
    ) -> None:
        # Whether the helper's lease has run out (asked as each process starts or is
        # activated: one that would train then starts frozen, see HelperDaemon).
        self.lease_ran_out = lease_ran_out
        # Where the helper writes its lease's end, for each job's shim to read (LEASE_ENV).
        self.lease_file = lease_file
        # Marks every launch (process.OWNER_ENV): a restarted helper finds what it left.
        self.owner = owner
        # The helper's credentials: each launch gets a runtime token derived from them.
        self.security = security or ClientSecurity()
        # Why an address is not a registered helper's agent ("" when it is); None: no check.
        self.peer_check = peer_check
        # Checkpoint paths a command names must lie under one of these (empty: anywhere).
        self.roots = [r.resolve() for r in roots]
        self.server = server
        self.scheduler = scheduler
        self.log_dir = log_dir
        self._on_exit = on_exit
        self.stop_grace_s = stop_grace_s
        self.prewarm_timeout_s = prewarm_timeout_s
        self.first_step_timeout_s = first_step_timeout_s
        self.processes: dict[tuple[str, str], JobProcess] = {}

    def running_jobs(self) -> list[str]:
        return sorted({p.job_id for p in self.processes.values() if p.alive})

    def running_pairs(self) -> list[tuple[str, str]]:
        """(job id, incarnation) of every live process: what heartbeats report."""
        return sorted(key for key, p in self.processes.items() if p.alive)

    def freeze_all(self) -> None:
        """Freeze every live process (lease ran out); those frozen already stay so."""
        for p in self.processes.values():
            p.freeze()

    def any_frozen(self) -> bool:
        return any(p.frozen for p in self.processes.values())

    def thaw_all(self, only: Collection[tuple[str, str]] | None = None) -> None:
        """Thaw the frozen processes (only these (job id, incarnation) pairs, if given)."""
        for key, p in self.processes.items():
            if only is None or key in only:
                p.thaw()

    def fence(self, job_id: str, incarnation: str) -> None:
        """Kill that launch at once: the scheduler does not expect it (anymore)."""
        proc = self.processes.get((job_id, incarnation))
        if proc is not None and (proc.alive or proc.in_grace):
            log.warning("job %s/%s is stale (the scheduler does not expect it here): killing it",
                        job_id, incarnation)
            proc.kill_now()

    def log_path(self, job_id: str) -> Path:
        return self.log_dir / f"{safe_name(job_id, 'job_id')}.log"

    def _exited(self, proc: JobProcess) -> None:
        self.processes.pop((proc.job_id, proc.incarnation), None)
        self._on_exit(proc)

    async def handle(self, cmd: helper_pb2.HelperCommand) -> Result:
        """Carry out one command; failures come back as ok=false, never as exceptions."""
        kind = cmd.WhichOneof("body")
        started = time.monotonic()
        try:
            if kind in _PATH_FIELDS:
                self._confine(cmd, kind)
            if kind == "launch":
                result = await self.launch(cmd.launch)
            elif kind == "activate":
                result = await self.activate(cmd.activate)
            elif kind == "stop":
                result = await self.stop(cmd.stop)
            elif kind == "transfer":
                result = await self.transfer(cmd.transfer)
            elif kind == "read_log":
                result = self.read_log(cmd.read_log)
            else:
                raise CommandFailed(f"command {cmd.command_id}: no body (unknown command kind?)")
            result.ok = True
        except CommandFailed as exc:
            result = Result(ok=False, message=str(exc), exit_code=exc.exit_code, server_fault=exc.server_fault,
                            transfer_fault=exc.transfer_fault)
        except (CheckpointError, ValueError, OSError) as exc:
            result = Result(ok=False, message=f"{kind}: {exc}")
        except Exception as exc:  # a bug or a peer failure; the scheduler must still hear back
            log.exception("command %s (%s) failed", cmd.command_id, kind)
            result = Result(ok=False, message=f"{kind}: {exc.__class__.__name__}: {exc}")
        result.server = self.server
        result.command_id = cmd.command_id
        result.durations_s["command"] = time.monotonic() - started
        return result

    async def launch(self, req: helper_pb2.LaunchJob) -> Result:
        if not req.job_id or not req.incarnation:
            raise CommandFailed("launch: job_id and incarnation are required")
        existing = self.processes.get((req.job_id, req.incarnation))
        if existing is not None and existing.alive:
            # A command re-sent after a reconnect must not start the job twice.
            return Result(message=f"already running as pid {existing.pid}")
        argv = shim_command(list(req.spec.command))
        env = job_environment(
            os.environ,
            dict(req.spec.env),
            job_id=req.job_id,
            incarnation=req.incarnation,
            scheduler=self.scheduler,
            server=self.server,
            gpu_indices=list(req.gpu_indices),
            restore_checkpoint=req.restore_checkpoint,
        )
        argv, env = isolated_launch(argv, env)  # python -E / -I
        if req.warm and req.warm_signature:
            env["GANDIVA_WARM_SIGNATURE"] = req.warm_signature
        if req.warm and req.source_towers > 0:
            env["GANDIVA_SOURCE_TOWERS"] = str(req.source_towers)
        env.update(self.runtime_credentials(req.job_id, req.incarnation))
        if self.owner:
            env[OWNER_ENV] = self.owner
        if self.lease_file:
            env[LEASE_ENV] = self.lease_file
        if req.restore_checkpoint:
            _check_restore("launch", req.restore_checkpoint, self.server)
        workdir = req.spec.workdir or os.getcwd()
        if not os.path.isdir(workdir):
            raise CommandFailed(f"launch: workdir {workdir!r} does not exist on {self.server}")
        program = argv[0] if os.sep not in argv[0] else os.path.join(workdir, argv[0])
        if shutil.which(program, path=env.get("PATH")) is None:
            raise CommandFailed(f"launch: program {argv[0]!r} not found or not executable on {self.server}")
        proc = JobProcess(
            job_id=req.job_id,
            incarnation=req.incarnation,
            argv=argv,
            workdir=workdir,
            env=env,
            gpu_indices=tuple(req.gpu_indices),
            log_path=self.log_path(req.job_id),
            warm=req.warm,
        )
        t0 = time.monotonic()
        try:
            await proc.start(self._exited)
        except OSError as exc:
            # The program was found and is executable (above): what failed is this server's
            # (its job log not writable, its disk full; no process could be made). Not the
            # job's fault: the scheduler places it elsewhere instead of failing it.
            raise CommandFailed(f"launch: {self.server} could not start it: {exc}",
                                server_fault=exc.errno != errno.ENOEXEC) from exc
        self.processes[(req.job_id, req.incarnation)] = proc
        if self.lease_ran_out():
            proc.freeze()  # as every other job here; thawed if a heartbeat answer vouches for it
        result = Result(message=f"pid {proc.pid}")
        if req.warm:
            await self._wait(proc, "warm_ready", self.prewarm_timeout_s)
            result.durations_s["prewarm"] = time.monotonic() - t0
        elif req.wait_first_step:
            restored = None
            if req.restore_checkpoint:
                restored = await self._wait(proc, "restored", self.first_step_timeout_s)
                result.durations_s["restore"] = float(restored.get("restore_s", 0.0))
                result.step = int(restored.get("step", 0))
            done = await self._wait(proc, "first_step_done", self.first_step_timeout_s)
            result.durations_s["startup"] = _at(proc, "session_ready", t0)
            result.durations_s["first_step_total"] = done["received_at"] - t0
            if restored is None:
                result.step = int(done.get("step", 0))
        return result

    async def activate(self, req: helper_pb2.ActivateJob) -> Result:
        proc = self.processes.get((req.job_id, req.incarnation))
        if proc is None or not proc.alive:
            raise CommandFailed(f"activate: no live pre-warmed process for {req.job_id}/{req.incarnation}")
        if not proc.warm or proc.activated:
            raise CommandFailed(f"activate: {req.job_id}/{req.incarnation} is not waiting warm")
        if req.restore_checkpoint:
            _check_restore("activate", req.restore_checkpoint, self.server)
        mark = len(proc.events)
        t0 = time.monotonic()
        proc.activated = True
        if self.lease_ran_out():
            proc.freeze()  # it reads the activation once a heartbeat answer thaws it
        proc.send({"cmd": "activate", "restore_checkpoint": req.restore_checkpoint})
        result = Result()
        if req.restore_checkpoint:
            restored = await self._wait(proc, "restored", self.first_step_timeout_s, mark)
            result.durations_s["restore"] = float(restored.get("restore_s", 0.0))
            result.step = int(restored.get("step", 0))
        done = await self._wait(proc, "first_step_done", self.first_step_timeout_s, mark)
        total = done["received_at"] - t0
        result.durations_s["activate"] = total
        result.durations_s["first_step"] = max(0.0, total - result.durations_s["restore"])
        if not req.restore_checkpoint:
            result.step = int(done.get("step", 0))
        return result

    async def stop(self, req: helper_pb2.StopJob) -> Result:
        targets = [
            p for (job, inc), p in self.processes.items()
            if job == req.job_id and (not req.incarnation or inc == req.incarnation)
        ]
        if not targets:
            return Result(message="not running here")
        codes = [await p.stop(self.stop_grace_s) for p in targets]
        return Result(message=f"stopped ({req.reason or 'no reason given'})", exit_code=codes[-1])

    async def transfer(self, req: helper_pb2.TransferCheckpoint) -> Result:
        if not req.dest_address:
            raise CommandFailed("transfer: dest_address is required")
        # A checkpoint is the job's data: it goes only to a helper the scheduler registered.
        refusal = await self.peer_check(req.dest_address) if self.peer_check is not None else ""
        if refusal:
            raise CommandFailed(f"transfer: {refusal}")
        t0 = time.monotonic()
        try:
            sent = await send_checkpoint(
                req.dest_address, Path(req.checkpoint_path), req.job_id, req.checkpoint_name or None,
                security=self.security, ticket=req.ticket,
            )
        except CheckpointMissing as exc:  # asking this helper again cannot help
            raise CommandFailed(f"transfer: {exc}", transfer_fault=helper_pb2.TRANSFER_FAULT_CHECKPOINT_MISSING) from None
        except TransferTooSlow as exc:  # the link's fault, counted as the destination's (as a timeout)
            raise CommandFailed(f"transfer: could not send the checkpoint to the helper at {req.dest_address}: "
                                f"{exc}", transfer_fault=helper_pb2.TRANSFER_FAULT_DEST_REFUSED) from None
        except grpc.aio.AioRpcError as exc:  # the peer unreachable, refusing, or timed out
            # One line naming the peer, not the error's multi-line repr (it lands in the job's history).
            # The destination's refusal, not the checkpoint's fault: the scheduler reads the
            # field, never the words (scheduler/engine/live.py transfer_fault).
            details = " ".join((exc.details() or "").split())
            raise CommandFailed(f"transfer: could not send the checkpoint to the helper at {req.dest_address}: "
                                f"{exc.code().name}: {details}",
                                transfer_fault=helper_pb2.TRANSFER_FAULT_DEST_REFUSED) from None
        result = Result(checkpoint_path=sent.path, message=f"{sent.bytes} bytes")
        result.durations_s["transfer"] = time.monotonic() - t0
        return result

    def read_log(self, req: helper_pb2.ReadLog) -> Result:
        """Up to 1 MiB of the job's output from ``offset`` (the scheduler has checked
        that the caller may read it)."""
        path = self.log_path(req.job_id)
        if req.offset < 0:
            raise CommandFailed(f"read_log: offset {req.offset} is negative")
        try:
            # Not open(): a named pipe the job put in its log's place (the job runs as the
            # helper's user) waited for a writer for ever, on the event loop that heartbeats
            # and runs every command (open_regular: only a regular file, never waiting).
            with open_regular(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = os.pread(f.fileno(), req.max_bytes if 0 < req.max_bytes < MAX_LOG_READ else MAX_LOG_READ,
                                min(req.offset, size))
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise CommandFailed(f"no output of job {req.job_id} on server {self.server}") from None
            raise CommandFailed(f"the output of job {req.job_id} on server {self.server} cannot be read: "
                                f"{exc.strerror}") from None
        return Result(data=data, log_size=size)

    def runtime_credentials(self, job_id: str, incarnation: str) -> dict[str, str]:
        """What the job's runtime needs to reach the scheduler: a token good for this
        job and launch only (never the helper's own), and the CA to trust, by absolute
        path (the job runs in its own workdir). A scheduler with mutual TLS admits only
        cluster certificates, so the client certificate goes along too: the job runs as
        the helper's user and could read those files anyway; what it may do is still
        bounded by its token."""
        sec = self.security
        return replace(sec, token=runtime_token(sec.token, job_id, incarnation) if sec.token else "",
                       tls_ca=_absolute(sec.tls_ca), tls_cert=_absolute(sec.tls_cert),
                       tls_key=_absolute(sec.tls_key)).env()

    def _confine(self, cmd: helper_pb2.HelperCommand, kind: str) -> None:
        """Replace the checkpoint path the command names by its real path, which must lie
        under the ramdisk or shared root; else CommandFailed."""
        body, name = getattr(cmd, kind), _PATH_FIELDS[kind]
        path = getattr(body, name)
        if not path or not self.roots:
            return
        real = Path(path).resolve()
        if not any(real == r or r in real.parents for r in self.roots):
            raise CommandFailed(f"{kind}: {name} {path!r} is outside this helper's ramdisk and shared root")
        setattr(body, name, str(real))

    async def _wait(self, proc: JobProcess, kind: str, timeout_s: float, after: int = 0) -> dict:
        try:
            return await proc.wait_event(kind, timeout_s, after)
        except ProcessExited as exc:
            raise CommandFailed(f"{proc.job_id}: {exc}; see {proc.log_path}", exc.code) from exc
        except TimeoutError as exc:
            await proc.stop(self.stop_grace_s)
            raise CommandFailed(f"{proc.job_id}: {exc}; stopped it") from exc

    async def stop_all(self) -> None:
        for proc in list(self.processes.values()):
            await proc.stop(self.stop_grace_s)


def _absolute(path: str) -> str:
    """A path as the helper reads it (`~` expanded, as scheduler.transport does), made absolute."""
    return str(Path(path).expanduser().resolve()) if path else ""


def _at(proc: JobProcess, kind: str, t0: float) -> float:
    event = proc.last_event(kind)
    return float(event["received_at"] - t0) if event else 0.0


def _check_restore(what: str, path: str, server: str) -> None:
    """CommandFailed unless ``path`` is a whole checkpoint here: gone (a reboot wiped the
    ramdisk), or cut short (a checkpoint root on a disk whose unsynced writes a power cut
    lost). The scheduler then starts the job from step 0, saying so. Before, a cut one was
    launched, its shim refused it (exit status 2, "unreadable gandiva.json") and the job
    FAILED (tests/multihost/test_host_reboot.py, `full`)."""
    if not os.path.isdir(path):
        raise CommandFailed(f"{what}: checkpoint {path} not found on {server}")
    try:
        # Read as a regular file only, and bounded: the job writes its checkpoint directory
        # (any job of this server may write any other's), and a named pipe put there held
        # this event loop in open() for ever; what it holds is checked before it is used.
        manifest = parse_manifest(read_regular(Path(path, MANIFEST), MAX_MANIFEST_BYTES,
                                               f"{MAX_MANIFEST_BYTES >> 20} MiB"))
        if isinstance(manifest, dict) and manifest.get("format") == FORMAT:  # the shim's: each file's size
            check_manifest(path, manifest)
    except FileNotFoundError:
        return  # none: not the shim's (a program's own runtime); its program judges it
    except (OSError, ValueError) as exc:
        raise CommandFailed(f"{what}: checkpoint {path}: unreadable {MANIFEST} ({exc}) (on {server}: cut short "
                            "or damaged)") from None
    except TornCheckpoint as exc:
        raise CommandFailed(f"{what}: {exc} (on {server}: cut short or damaged)") from None
