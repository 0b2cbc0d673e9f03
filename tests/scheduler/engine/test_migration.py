"""migrate(): the fast path's order of steps and its fault handling, against
in-memory ports (the real-process version is in tests/migration_helper)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from migration_protocol.fast_path import (
    Endpoint,
    MigrationPlan,
    Outcome,
    checkpoint_paths,
    migrate,
)
from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2

A = Endpoint("a", "127.0.0.1:7001", "/shm/a", "/mnt/peers")
B = Endpoint("b", "127.0.0.1:7002", "/shm/b", "/mnt/peers")


def plan(source: Endpoint = A, dest: Endpoint = B) -> MigrationPlan:
    return MigrationPlan(
        job_id="j1", spec=common_pb2.JobSpec(command=["python", "train.py"], gpus=1),
        source=source, source_incarnation="i0", source_gpus=(0,),
        dest=dest, dest_gpus=(2,), dest_incarnation="i1", fallback_incarnation="i2",
    )


Handler = Callable[[Any], Any]


class Ports:
    """Records every call; each command kind answers through a replaceable handler."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.phases: dict[str, float] = {}
        self.handlers: dict[str, Handler] = {
            "launch": lambda c: helper_pb2.HelperCommandResult(ok=True, durations_s={"prewarm": 3.0}),
            "activate": lambda c: helper_pb2.HelperCommandResult(
                ok=True, step=42, durations_s={"restore": 0.2, "first_step": 0.1}),
            "stop": lambda c: helper_pb2.HelperCommandResult(ok=True),
            "transfer": lambda c: helper_pb2.HelperCommandResult(
                ok=True, checkpoint_path=f"/shm/b/j1/{c.transfer.checkpoint_name}",
                durations_s={"transfer": 0.3}),
            "runtime": lambda c: runtime_pb2.CommandAck(
                command_id=c.command_id, ok=True, step=42, checkpoint_path=c.checkpoint_dir,
                durations_s={"wait_boundary": 0.05, "save": 0.2}),
        }

    async def helper_command(self, server: str, command: helper_pb2.HelperCommand, timeout_s: float) -> Any:
        kind = command.WhichOneof("body")
        self.calls.append((kind, server, command))
        return _answer(self.handlers[kind], command)

    async def runtime_command(self, job_id: str, incarnation: str, command: Any, timeout_s: float) -> Any:
        self.calls.append(("runtime", incarnation, command))
        return _answer(self.handlers["runtime"], command)

    async def record_phase(self, job_id: str, phase: str, seconds: float, detail: str) -> None:
        self.phases[phase] = seconds

    def kinds(self) -> list[tuple[str, str]]:
        return [(k, s) for k, s, _ in self.calls]


def _answer(handler: Handler, command: Any) -> Any:
    out = handler(command)
    if isinstance(out, BaseException):
        raise out
    return out


async def test_shared_mount_fast_path_order_and_phases() -> None:
    ports = Ports()
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.MIGRATED
    assert (result.server, result.incarnation, result.step) == ("b", "i1", 42)
    # Pre-warm strictly before the source is stopped; no transfer with a shared mount.
    assert ports.kinds() == [("launch", "b"), ("runtime", "i0"), ("activate", "b")]
    launch = ports.calls[0][2].launch
    assert launch.warm and list(launch.gpu_indices) == [2] and launch.incarnation == "i1"
    stop = ports.calls[1][2]
    assert stop.kind == runtime_pb2.COMMAND_KIND_STOP_FOR_MIGRATION
    assert stop.checkpoint_dir == "/mnt/peers/b/j1/migrate-i1"
    assert ports.calls[2][2].activate.restore_checkpoint == "/shm/b/j1/migrate-i1"
    assert result.checkpoint_path == "/shm/b/j1/migrate-i1"
    for phase in ("prewarm", "wait_boundary", "save", "transfer", "restore", "first_step", "total"):
        assert phase in ports.phases and phase in result.durations_s
    assert ports.phases["transfer"] == 0.0


async def test_without_shared_mount_the_source_helper_streams_the_checkpoint() -> None:
    ports = Ports()
    result = await migrate(plan(Endpoint("a", "x:1", "/shm/a"), B), ports)
    assert result.outcome is Outcome.MIGRATED
    assert ports.kinds() == [("launch", "b"), ("runtime", "i0"), ("transfer", "a"), ("activate", "b")]
    assert ports.calls[1][2].checkpoint_dir == "/shm/a/j1/migrate-i1"
    transfer = ports.calls[2][2].transfer
    assert (transfer.dest_address, transfer.checkpoint_path) == (B.address, "/shm/a/j1/migrate-i1")
    assert ports.calls[3][2].activate.restore_checkpoint == "/shm/b/j1/migrate-i1"
    assert result.durations_s["transfer"] == 0.3


@pytest.mark.parametrize("failure", [
    helper_pb2.HelperCommandResult(ok=False, message="ImportError in train.py"),
    TimeoutError(),
    ConnectionError("helper b is down"),
])
async def test_prewarm_failure_leaves_the_job_running_at_the_source(failure: Any) -> None:
    ports = Ports()
    ports.handlers["launch"] = lambda c: failure
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.STAYED
    assert (result.server, result.incarnation, result.step) == ("a", "i0", -1)
    # The source was never told anything; the half-warm destination is cleaned up.
    assert ports.kinds() == [("launch", "b"), ("stop", "b")]
    assert not result.towers_refused


async def test_a_destination_refusing_its_tower_count_says_so_in_the_result_not_only_by_its_runtime() -> None:
    """A program building one tower per device, grown: its pre-warmed copy refuses the
    checkpoint and exits 76. Its runtime's message saying so raced the helper's answer; when
    the answer won, the copy was stale, its message dropped, and grow-shrink stayed on (CI of
    session 46: test_grow_towers waited 150 s for the note). The result carries it now."""
    ports = Ports()
    ports.handlers["launch"] = lambda c: helper_pb2.HelperCommandResult(
        ok=False, exit_code=76, message="j1: the job process exited with code 76 before 'warm_ready'")
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.STAYED and result.towers_refused
    assert ports.kinds() == [("launch", "b"), ("stop", "b")]


async def test_restore_failure_restarts_at_the_source_from_the_checkpoint() -> None:
    ports = Ports()
    ports.handlers["activate"] = lambda c: TimeoutError()
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.RESTARTED_AT_SOURCE
    assert (result.server, result.incarnation, result.step) == ("a", "i2", 42)
    assert ports.kinds() == [("launch", "b"), ("runtime", "i0"), ("activate", "b"), ("stop", "b"),
                             ("launch", "a")]
    restart = ports.calls[-1][2].launch
    # Exactly one process runs the job again, from the saved step, on the source's GPUs.
    assert restart.restore_checkpoint == "/mnt/peers/b/j1/migrate-i1"
    assert not restart.warm and list(restart.gpu_indices) == [0] and restart.incarnation == "i2"


async def test_a_restore_at_another_step_is_not_accepted() -> None:
    ports = Ports()
    ports.handlers["activate"] = lambda c: helper_pb2.HelperCommandResult(ok=True, step=7)
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.RESTARTED_AT_SOURCE and result.step == 42
    assert "restored step 7" in result.reason


async def test_transfer_failure_restarts_at_the_source_from_its_ramdisk() -> None:
    ports = Ports()
    ports.handlers["transfer"] = lambda c: helper_pb2.HelperCommandResult(ok=False, message="DATA_LOSS")
    result = await migrate(plan(Endpoint("a", "x:1", "/shm/a"), B), ports)
    assert result.outcome is Outcome.RESTARTED_AT_SOURCE
    assert ports.calls[-1][2].launch.restore_checkpoint == "/shm/a/j1/migrate-i1"
    assert ("activate", "b") not in ports.kinds()
    assert result.transfer_fault == helper_pb2.TRANSFER_FAULT_UNSPECIFIED


async def test_a_refused_transfer_says_so_in_its_result_whatever_its_words() -> None:
    """The destination refused the checkpoint: the migration's result carries the holder's
    structured reason (the scheduler quarantines that destination on it), not only text."""
    ports = Ports()
    ports.handlers["transfer"] = lambda c: helper_pb2.HelperCommandResult(
        ok=False, message="the peer is full", transfer_fault=helper_pb2.TRANSFER_FAULT_DEST_REFUSED)
    result = await migrate(plan(Endpoint("a", "x:1", "/shm/a"), B), ports)
    assert result.outcome is Outcome.RESTARTED_AT_SOURCE
    assert result.transfer_fault == helper_pb2.TRANSFER_FAULT_DEST_REFUSED
    assert "the peer is full" in result.reason


async def test_restart_failure_reports_failed_with_the_checkpoint_to_recover_from() -> None:
    ports = Ports()
    ports.handlers["activate"] = lambda c: ConnectionError("b died")
    ports.handlers["launch"] = lambda c: (
        helper_pb2.HelperCommandResult(ok=True) if c.launch.warm
        else helper_pb2.HelperCommandResult(ok=False, message="a is full"))
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.FAILED
    assert (result.step, result.checkpoint_path) == (42, "/mnt/peers/b/j1/migrate-i1")
    assert "a is full" in result.reason


async def test_source_refusal_keeps_the_job_at_the_source() -> None:
    ports = Ports()
    ports.handlers["runtime"] = lambda c: runtime_pb2.CommandAck(ok=False, message="not migratable")
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.STAYED and "not migratable" in result.reason
    assert ports.kinds()[-1] == ("stop", "b")


async def test_source_silent_fails_without_starting_the_destination() -> None:
    ports = Ports()
    ports.handlers["runtime"] = lambda c: TimeoutError()
    result = await migrate(plan(), ports)
    assert result.outcome is Outcome.FAILED and result.server == ""
    assert ports.kinds() == [("launch", "b"), ("runtime", "i0"), ("stop", "b")]


async def test_a_failing_event_recorder_does_not_undo_the_migration() -> None:
    ports = Ports()

    async def broken(*args: Any) -> None:
        raise RuntimeError("database is locked")

    ports.record_phase = broken  # type: ignore[method-assign]
    assert (await migrate(plan(), ports)).outcome is Outcome.MIGRATED


def test_shared_mount_requires_a_shared_root() -> None:
    bad = MigrationPlan(**{**plan(Endpoint("a", "x:1", "/shm/a")).__dict__, "use_shared_mount": True})
    with pytest.raises(ValueError, match="no shared_root"):
        checkpoint_paths(bad, "c")


async def test_phase_times_a_helper_or_a_job_reports_as_no_duration_are_not_taken() -> None:
    """A job's own process sends its save and boundary-wait times (its runtime's ack), a
    helper the others: NaN, infinite, negative or absurd ones were taken as sent, and one NaN
    left the operators' migration histogram's sum NaN for good (/metrics) and the job's event
    reading "save nans". They are now left out, or the scheduler's own measure is taken."""
    from scheduler.observe.metrics import SchedulerMetrics

    nan, inf = float("nan"), float("inf")
    ports, metrics = Ports(), SchedulerMetrics()

    async def record(job_id: str, phase: str, seconds: float, detail: str) -> None:
        ports.phases[phase] = seconds
        metrics.migration_phase(phase, seconds)  # what the scheduler's ports do first

    ports.record_phase = record  # type: ignore[method-assign]
    ports.handlers["launch"] = lambda c: helper_pb2.HelperCommandResult(ok=True, durations_s={"prewarm": nan})
    ports.handlers["runtime"] = lambda c: runtime_pb2.CommandAck(
        command_id=c.command_id, ok=True, step=42, checkpoint_path=c.checkpoint_dir,
        durations_s={"wait_boundary": -inf, "save": nan})
    ports.handlers["transfer"] = lambda c: helper_pb2.HelperCommandResult(
        ok=True, checkpoint_path=f"/shm/b/j1/{c.transfer.checkpoint_name}", durations_s={"transfer": 1e308})
    ports.handlers["activate"] = lambda c: helper_pb2.HelperCommandResult(
        ok=True, step=42, durations_s={"restore": -3.0, "first_step": inf})
    result = await migrate(plan(Endpoint("a", "x:1", "/shm/a"), B), ports)
    assert result.outcome is Outcome.MIGRATED
    assert "save" not in ports.phases and "wait_boundary" not in ports.phases
    assert all(0.0 <= s < 60 for s in ports.phases.values()), ports.phases  # the scheduler's own measures
    assert ports.phases["restore"] == 0.0 and ports.phases["first_step"] == 0.0
    assert result.durations_s == ports.phases | {"end_to_end": result.durations_s["end_to_end"]}
    sums = {s.labels["phase"]: s.value for m in metrics.registry.collect() for s in m.samples
            if s.name == "gandiva_migration_phase_seconds_sum"}
    assert sums and all(0.0 <= v < 60 for v in sums.values()), sums
