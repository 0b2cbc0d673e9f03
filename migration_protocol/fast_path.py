"""Checkpoint-aware fast migration of a TensorFlow job between two servers (brief §2.2).

``migrate(plan, ports)`` runs the fast path and its fault handling:

1. pre-warm: the destination helper starts the job's program in warm mode (graph
   rebuilt, session created) and reports when it holds before the first step;
2. checkpoint: the source shim is told STOP_FOR_MIGRATION at its next boundary,
   writing one replica's training state straight into the destination's ramdisk
   through the shared mount when the source has one, else into the source's own
   ramdisk, which its helper then streams to the destination (TransferCheckpoint);
3. activate: the warm process restores the checkpoint and runs its first step.

Faults: a destination that fails or times out while pre-warming leaves the job
running at the source untouched; one that fails during restore is stopped and the
job restarts at the source from the checkpoint (the step is the checkpoint's, so no
step is lost); once the checkpoint is complete the source process is gone by design
(it exits with status 75) and the destination goes on whatever happens to it.

The scheduler supplies ``MigrationPorts`` (its helper command streams and runtime
streams); tests and the benchmark supply their own.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import posixpath
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2
from tf_runtime import EXIT_TOWERS_CHANGED  # the shim's exit code (no TensorFlow import)

log = logging.getLogger(__name__)

# Stops of pre-warmed destinations left running in the background (kept referenced).
_CLEANUPS: set[asyncio.Task] = set()
# The longest a phase a helper or a job's runtime reports can have taken (a day); longer,
# negative, NaN or infinite is no measurement: a job's own process sends its save and
# boundary-wait times, and a NaN it sent made the operators' migration histogram's sum NaN
# for good (/metrics) and its event read "save nans".
MAX_PHASE_S = 86_400.0


class MigrationPorts(Protocol):
    """What migrate() needs from the scheduler. Each call may raise TimeoutError (no
    answer in time) or any other exception (server down, stream gone): migrate treats
    both as that step having failed."""

    async def helper_command(
        self, server: str, command: helper_pb2.HelperCommand, timeout_s: float
    ) -> helper_pb2.HelperCommandResult:
        """Send a command to a server's helper and wait for its result."""
        ...

    async def runtime_command(
        self, job_id: str, incarnation: str, command: runtime_pb2.RuntimeCommand, timeout_s: float
    ) -> runtime_pb2.CommandAck:
        """Send a command to the job's shim (that incarnation) and wait for its ack."""
        ...

    async def record_phase(self, job_id: str, phase: str, seconds: float, detail: str) -> None:
        """Record one phase of a migration (an event the operator sees in describe job)."""
        ...


@dataclass(frozen=True)
class Endpoint:
    """A server as seen by migration: what its helper registered."""

    name: str
    address: str          # its HelperAgent host:port
    ramdisk: str          # its ramdisk directory, on itself
    shared_root: str = "" # where it sees its peers' ramdisks, as ROOT/PEER-NAME


@dataclass(frozen=True)
class MigrationPlan:
    job_id: str
    spec: common_pb2.JobSpec
    source: Endpoint
    source_incarnation: str
    source_gpus: tuple[int, ...]
    dest: Endpoint
    dest_gpus: tuple[int, ...]
    dest_incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # The incarnation used if the job has to restart at the source from the checkpoint.
    fallback_incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # None: through the shared mount when the source has one; False: always stream.
    use_shared_mount: bool | None = None
    # The source's first training run (TrainSignature JSON), rehearsed by the warm process.
    warm_signature: str = ""
    # Tower copies in the source's graph (0: unknown): a warm process with another number
    # refuses before holding, and the source is never stopped (one tower per device).
    source_towers: int = 0


@dataclass(frozen=True)
class MigrationTimeouts:
    prewarm_s: float = 300.0   # import TF, rebuild the graph, create the session
    checkpoint_s: float = 120.0  # reach a boundary and save
    # The source helper's own limit on the checkpoint's stream (migration_helper.agent.
    # send_checkpoint's 300 s). Its answer, which says whose fault a stream that ran out of
    # time is (the destination's: TRANSFER_FAULT_DEST_REFUSED), is waited for up to
    # answer_s more: a scheduler that gave up at the same moment counted a fetch over a slow
    # link an ordinary failure, three of them a restart from step 0.
    transfer_s: float = 300.0
    answer_s: float = 30.0
    activate_s: float = 120.0  # restore and run the first step
    cleanup_s: float = 30.0
    restart_s: float = 60.0


class Outcome(enum.Enum):
    MIGRATED = "migrated"                        # runs at the destination
    STAYED = "stayed_at_source"                  # never stopped at the source
    RESTARTED_AT_SOURCE = "restarted_at_source"  # restarted there from the checkpoint
    FAILED = "failed"                            # no process runs it; see reason and checkpoint


@dataclass
class MigrationResult:
    outcome: Outcome
    server: str                 # where the job runs now ("" when FAILED)
    incarnation: str            # the process that runs it now
    step: int = -1              # the checkpoint's global step (-1: no checkpoint was taken)
    checkpoint_path: str = ""   # the checkpoint, on `server` (or the source when FAILED)
    reason: str = ""
    durations_s: dict[str, float] = field(default_factory=dict)
    # A failed transfer: why, as its holder's helper said (helper_pb2.TransferFault; 0: none,
    # or a helper older than the field).
    transfer_fault: int = 0
    # The pre-warmed destination's program refused to restore a checkpoint of another tower
    # count (it builds one tower per device; its process exited EXIT_TOWERS_CHANGED). Its
    # runtime says so too, but that message can come after the helper's answer has ended the
    # migration, when the copy is stale and its messages are not heeded.
    towers_refused: bool = False


class _StepFailed(Exception):
    def __init__(self, message: str, fault: int = 0, exit_code: int = 0) -> None:
        super().__init__(message)
        self.fault = fault  # the failed result's transfer_fault
        self.exit_code = exit_code  # the failed result's exit code (a launch's process)


def checkpoint_paths(plan: MigrationPlan, name: str) -> tuple[str, str | None]:
    """(where the source shim writes, where the destination reads it or None when the
    checkpoint has to be streamed)."""
    if plan.source.name == plan.dest.name:
        # Within one server (grow, shrink, a move between its GPUs): the checkpoint
        # stays in the server's ramdisk; streaming it to itself would collide with itself.
        here = posixpath.join(plan.source.ramdisk, plan.job_id, name)
        return here, here
    shared = plan.use_shared_mount
    if shared is None:
        shared = bool(plan.source.shared_root)
    if shared:
        if not plan.source.shared_root:
            raise ValueError(f"source {plan.source.name} has no shared_root; cannot use a shared mount")
        src = posixpath.join(plan.source.shared_root, plan.dest.name, plan.job_id, name)
        return src, posixpath.join(plan.dest.ramdisk, plan.job_id, name)
    return posixpath.join(plan.source.ramdisk, plan.job_id, name), None


def checkpoint_home(source: Endpoint, dest: Endpoint, path: str) -> tuple[str, str]:
    """(the server whose ramdisk holds ``path``, a checkpoint the source of a migration to
    ``dest`` wrote, and its path there). Through a shared mount the source writes into the
    destination's ramdisk (as SHARED-ROOT/DEST/JOB/NAME, ``checkpoint_paths``), and it stays
    there if the migration fails; otherwise it is the source's."""
    root = source.shared_root.rstrip("/")
    if root and source.name != dest.name and dest.ramdisk:
        prefix = posixpath.join(root, dest.name) + "/"
        if path.startswith(prefix):
            return dest.name, posixpath.join(dest.ramdisk, path[len(prefix):])
    return source.name, path


async def migrate(
    plan: MigrationPlan, ports: MigrationPorts, timeouts: MigrationTimeouts | None = None
) -> MigrationResult:
    """Move the job from plan.source to plan.dest by the fast path; see the module docstring."""
    return await _Migration(plan, ports, timeouts or MigrationTimeouts()).run()


class _Migration:
    def __init__(self, plan: MigrationPlan, ports: MigrationPorts, timeouts: MigrationTimeouts) -> None:
        self.plan, self.ports, self.t = plan, ports, timeouts
        self.durations: dict[str, float] = {}
        self.transfer_fault = 0
        self.towers_refused = False

    def _reported(self, durations: Mapping[str, float], phase: str, default: float | None) -> float | None:
        """The time ``durations`` (a helper's or a runtime's answer) gives ``phase``, or
        ``default`` when it gives none that a measurement can be (MAX_PHASE_S)."""
        if phase not in durations:
            return default
        seconds = durations[phase]
        if math.isfinite(seconds) and 0.0 <= seconds <= MAX_PHASE_S:
            return seconds
        log.warning("migration of %s: %s reported as %r s, not a duration; %s", self.plan.job_id, phase,
                    seconds, "left out" if default is None else "the scheduler's own measure taken")
        return default

    async def _phase(self, phase: str, seconds: float, detail: str = "") -> None:
        self.durations[phase] = seconds
        try:
            await self.ports.record_phase(self.plan.job_id, phase, seconds, detail)
        except Exception:  # a lost event must not undo a migration
            log.warning("could not record phase %s of %s", phase, self.plan.job_id, exc_info=True)

    async def _helper(self, server: str, timeout_s: float, **body: object) -> helper_pb2.HelperCommandResult:
        cmd = helper_pb2.HelperCommand(command_id=uuid.uuid4().hex, **body)  # type: ignore[arg-type]
        try:
            result = await self.ports.helper_command(server, cmd, timeout_s)
        except TimeoutError as exc:
            raise _StepFailed(f"{server}: no answer to {cmd.WhichOneof('body')} within {timeout_s:.0f} s") from exc
        except Exception as exc:
            raise _StepFailed(f"{server}: {cmd.WhichOneof('body')} failed: {exc}") from exc
        if not result.ok:
            raise _StepFailed(f"{server}: {cmd.WhichOneof('body')} failed: {result.message}", result.transfer_fault,
                              result.exit_code)
        return result

    async def _stop_dest(self, why: str) -> None:
        p = self.plan
        try:
            await self._helper(p.dest.name, self.t.cleanup_s, stop=helper_pb2.StopJob(
                job_id=p.job_id, incarnation=p.dest_incarnation, reason=why))
        except _StepFailed as exc:  # a dead destination has nothing left to stop
            log.info("stopping the destination of %s: %s", p.job_id, exc)

    async def run(self) -> MigrationResult:
        p = self.plan
        t0 = time.monotonic()
        try:
            warm = await self._helper(p.dest.name, self.t.prewarm_s, launch=helper_pb2.LaunchJob(
                job_id=p.job_id, incarnation=p.dest_incarnation, spec=p.spec,
                gpu_indices=list(p.dest_gpus), warm=True, warm_signature=p.warm_signature,
                source_towers=p.source_towers))
        except _StepFailed as exc:
            self.towers_refused = exc.exit_code == EXIT_TOWERS_CHANGED
            await self._stop_dest("pre-warm failed")
            return await self._stayed(f"pre-warm at {p.dest.name} failed: {exc}")
        await self._phase("prewarm", self._reported(warm.durations_s, "prewarm", time.monotonic() - t0) or 0.0,
                          p.dest.name)

        name = f"migrate-{p.dest_incarnation}"
        src_dir, dest_dir = checkpoint_paths(p, name)
        t_stop = time.monotonic()
        try:
            ack = await self.ports.runtime_command(p.job_id, p.source_incarnation, runtime_pb2.RuntimeCommand(
                command_id=uuid.uuid4().hex, kind=runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION,
                checkpoint_dir=src_dir, reason=f"migrating to {p.dest.name}"), self.t.checkpoint_s)
        except Exception as exc:  # any failure here means: no confirmed checkpoint
            log.warning("stop-for-migration of %s failed", p.job_id, exc_info=True)
            await self._stop_dest("source did not checkpoint")
            return self._result(Outcome.FAILED, "", "", reason=(
                f"the source shim did not confirm its checkpoint ({exc.__class__.__name__}: {exc}); "
                "its process exit decides what happens next"))
        if not ack.ok:
            await self._stop_dest("source refused")
            return await self._stayed(f"the source shim refused: {ack.message}")
        saved = ack.checkpoint_path or src_dir
        for phase in ("wait_boundary", "save"):
            seconds = self._reported(ack.durations_s, phase, None)
            if seconds is not None:
                await self._phase(phase, seconds)
        # Optional port: a scheduler keeps the confirmed checkpoint in its durable record
        # of the migration, so a restart mid-migration resumes from it, never from step 0.
        confirmed = getattr(self.ports, "checkpoint_confirmed", None)
        if confirmed is not None:
            try:
                await confirmed(p.job_id, ack.step, saved)
            except Exception:
                log.warning("could not record the checkpoint of %s", p.job_id, exc_info=True)
        await self._phase("checkpoint", time.monotonic() - t_stop, f"step {ack.step} at {saved}")

        if dest_dir is None:
            t_tr = time.monotonic()
            try:
                moved = await self._helper(
                    p.source.name, self.t.transfer_s + self.t.answer_s, transfer=helper_pb2.TransferCheckpoint(
                        job_id=p.job_id, checkpoint_path=saved, dest_address=p.dest.address,
                        checkpoint_name=name))
            except _StepFailed as exc:
                # The destination never activated (its warm process holds, training
                # nothing), and it is likely unreachable (its link cut mid-copy): its stop
                # goes on in the background instead of delaying the restart at the source
                # by the cleanup timeout.
                self.transfer_fault = exc.fault
                cleanup = asyncio.create_task(self._stop_dest("transfer failed"))
                _CLEANUPS.add(cleanup)
                cleanup.add_done_callback(_CLEANUPS.discard)
                return await self._restart_at_source(ack.step, saved, f"transfer failed: {exc}")
            dest_dir = moved.checkpoint_path
            await self._phase("transfer", self._reported(moved.durations_s, "transfer", time.monotonic() - t_tr) or 0.0)
        else:
            dest_dir = dest_dir + saved[len(src_dir):]  # the shim may have used a subdirectory
            await self._phase("transfer", 0.0, "same server" if p.source.name == p.dest.name else "shared mount")

        try:
            active = await self._helper(p.dest.name, self.t.activate_s, activate=helper_pb2.ActivateJob(
                job_id=p.job_id, incarnation=p.dest_incarnation, restore_checkpoint=dest_dir))
            if ack.step and active.step and active.step != ack.step:
                raise _StepFailed(f"restored step {active.step}, but the checkpoint is at {ack.step}")
        except _StepFailed as exc:
            await self._stop_dest("restore failed")
            return await self._restart_at_source(ack.step, saved, f"activation at {p.dest.name} failed: {exc}")
        await self._phase("restore", self._reported(active.durations_s, "restore", 0.0) or 0.0)
        await self._phase("first_step", self._reported(active.durations_s, "first_step", 0.0) or 0.0)
        await self._phase("total", time.monotonic() - t_stop, "stop command to first step at the destination")
        self.durations["end_to_end"] = time.monotonic() - t0
        return self._result(Outcome.MIGRATED, p.dest.name, p.dest_incarnation, ack.step, dest_dir)

    async def _stayed(self, reason: str) -> MigrationResult:
        p = self.plan
        await self._phase("aborted", 0.0, reason)
        return self._result(Outcome.STAYED, p.source.name, p.source_incarnation, reason=reason)

    async def _restart_at_source(self, step: int, checkpoint: str, why: str) -> MigrationResult:
        p = self.plan
        try:
            await self._helper(p.source.name, self.t.restart_s, launch=helper_pb2.LaunchJob(
                job_id=p.job_id, incarnation=p.fallback_incarnation, spec=p.spec,
                gpu_indices=list(p.source_gpus), restore_checkpoint=checkpoint))
        except _StepFailed as exc:
            reason = f"{why}; restarting at {p.source.name} failed too: {exc}"
            await self._phase("failed", 0.0, reason)
            return self._result(Outcome.FAILED, "", "", step, checkpoint, reason)
        await self._phase("restarted_at_source", 0.0, why)
        return self._result(Outcome.RESTARTED_AT_SOURCE, p.source.name, p.fallback_incarnation,
                            step, checkpoint, why)

    def _result(self, outcome: Outcome, server: str, incarnation: str, step: int = -1,
                checkpoint: str = "", reason: str = "") -> MigrationResult:
        if outcome is not Outcome.MIGRATED:
            log.warning("migration of %s: %s (%s)", self.plan.job_id, outcome.value, reason)
        return MigrationResult(outcome, server, incarnation, step, checkpoint, reason, dict(self.durations),
                               self.transfer_fault, self.towers_refused)
