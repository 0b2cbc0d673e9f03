"""The cluster state as SQL tables (SQLAlchemy 2 ORM). The schema is owned by
alembic/; tests check that the migrated schema equals this metadata."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, validates

# Deterministic constraint names, so alembic migrations can refer to them on both dialects.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Set only inside scheduler.state.repo.transition: the one place a job's state changes
# (validated against scheduler.lifecycle's table, with its transition record and event).
_IN_TRANSITION: contextvars.ContextVar[bool] = contextvars.ContextVar("job_state_transition", default=False)


@contextlib.contextmanager
def state_change() -> Iterator[None]:
    """Lets Job.state be assigned; for scheduler.state.repo.transition alone."""
    token = _IN_TRANSITION.set(True)
    try:
        yield
    finally:
        _IN_TRANSITION.reset(token)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Server(Base):
    __tablename__ = "servers"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    address: Mapped[str] = mapped_column(String(256), default="")
    num_gpus: Mapped[int] = mapped_column(Integer)
    ramdisk: Mapped[str] = mapped_column(Text, default="")
    shared_root: Mapped[str] = mapped_column(Text, default="")
    up: Mapped[bool] = mapped_column(Boolean, default=True)
    registered_at: Mapped[float] = mapped_column(Double)
    last_heartbeat: Mapped[float] = mapped_column(Double)
    # The host memory its jobs may hold, as its helper reported at registration (0: unknown).
    host_memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # Cordoned by an operator (gandiva cordon/drain): no job comes to it. The mark is the
    # name's, so a helper that restarts or registers again finds it cordoned still.
    # draining: the scheduler moves every job placed here off it (gandiva drain).
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    cordoned_at: Mapped[float] = mapped_column(Double, default=0.0)
    cordon_reason: Mapped[str] = mapped_column(Text, default="")
    draining: Mapped[bool] = mapped_column(Boolean, default=False)


class Gpu(Base):
    __tablename__ = "gpus"
    server_name: Mapped[str] = mapped_column(
        ForeignKey("servers.name", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), default="")
    model: Mapped[str] = mapped_column(String(128), default="")
    memory_total: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_used: Mapped[int] = mapped_column(BigInteger, default=0)
    utilization: Mapped[float] = mapped_column(Double, default=0.0)
    sampled_at: Mapped[float] = mapped_column(Double, default=0.0)


class MultiJob(Base):
    __tablename__ = "multi_jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[float] = mapped_column(Double)
    # The submitter's request id, as "USER\nREQUEST_ID" (see SubmitJobRequest.request_id).
    request_key: Mapped[str | None] = mapped_column(String(300), nullable=True, unique=True, index=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    command: Mapped[list[str]] = mapped_column(JSON)
    workdir: Mapped[str] = mapped_column(Text, default="")
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    gpus: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=1)
    grow_shrink: Mapped[bool] = mapped_column(Boolean, default=False)
    user: Mapped[str] = mapped_column(String(128), default="")
    multi_job_id: Mapped[str | None] = mapped_column(
        ForeignKey("multi_jobs.id", ondelete="CASCADE"), nullable=True, index=True
    )
    array_index: Mapped[int] = mapped_column(Integer, default=0)
    params: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), index=True)
    # Which launch of the job is current; exits and acks of older launches are ignored.
    incarnation: Mapped[str] = mapped_column(String(32), default="")
    steps: Mapped[int] = mapped_column(BigInteger, default=0)
    # Mini-batches it runs in all (0: unknown), and who said so: "spec" (its submitter)
    # or "program" (the shim read it from the program's StopAtStepHook).
    total_steps: Mapped[int] = mapped_column(BigInteger, default=0)
    total_steps_from: Mapped[str] = mapped_column(String(16), default="")
    rate: Mapped[float] = mapped_column(Double, default=0.0)
    # When its rate was last reported: a rate older than its last state or placement
    # change was measured before a suspend, a move or a grow (its ETA says so).
    rate_at: Mapped[float] = mapped_column(Double, default=0.0)
    last_step_s: Mapped[float] = mapped_column(Double, default=0.0)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    migratable: Mapped[bool] = mapped_column(Boolean, default=True)
    # False when none of the job's processes connected a runtime in time: the scheduler
    # cannot stop it at a mini-batch boundary, so it never suspends, packs or moves it.
    suspendable: Mapped[bool] = mapped_column(Boolean, default=True)
    # Why the job is not suspendable or not migratable, for people ("" when it is both).
    control_note: Mapped[str] = mapped_column(Text, default="")
    # Why a grow-shrink job is no longer grown or shrunk ("" while it may be): its
    # program builds one tower per device, so a grow would change its result.
    grow_shrink_note: Mapped[str] = mapped_column(Text, default="")
    # Suspended by an operator: the policy must not resume it on its own.
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    message: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float] = mapped_column(Double, default=0.0)
    # When the state or placement last changed: time slices and packing trials run from it.
    state_changed_at: Mapped[float] = mapped_column(Double, default=0.0)
    finished_at: Mapped[float] = mapped_column(Double, default=0.0)
    # A checkpoint to restore at the next launch (after a failed migration), and the
    # server whose ramdisk holds it: the job resumes from it only when placed there.
    restore_checkpoint: Mapped[str] = mapped_column(Text, default="")
    restore_server: Mapped[str] = mapped_column(String(128), default="")
    # The global step of that checkpoint (0: not known): a job placed to resume from it
    # counts from there, not from the step its lost process had reached.
    restore_step: Mapped[int] = mapped_column(BigInteger, default=0)
    # GPU-seconds received so far (least-attained-service policies use it).
    attained_service_s: Mapped[float] = mapped_column(Double, default=0.0)
    # A queued job is not placed before this time: an earlier copy may still run on a
    # server that cannot be reached until that server's lease has surely expired.
    fenced_until: Mapped[float] = mapped_column(Double, default=0.0)
    # The submitter's request id, as "USER\nREQUEST_ID": a retried submission finds the
    # job its first attempt created instead of creating another.
    request_key: Mapped[str | None] = mapped_column(String(300), nullable=True, unique=True, index=True)

    def gpu_seconds(self, now: float) -> float:
        """The GPU time the job has had up to ``now``: its time training times its GPUs
        (attained_service_s: RUNNING, and moves of it running, lifecycle.trains; plus the
        running stretch not yet added to it; a move under way is added when it ends)."""
        running = now - self.state_changed_at if self.state == "RUNNING" and self.state_changed_at else 0.0
        return (self.attained_service_s or 0.0) + max(0.0, running) * self.gpus

    @validates("state")
    def _one_owner(self, key: str, value: str) -> str:
        """A job is created QUEUED; after that its state changes only through
        scheduler.state.repo.transition (and finish/requeue/place built on it)."""
        if _IN_TRANSITION.get() or (self.state is None and value == "QUEUED"):
            return value
        raise RuntimeError(
            f"job {self.id}: state {self.state!r} -> {value!r} assigned directly; every state change "
            "goes through scheduler.state.repo.transition (the allowed-transition table, the "
            "transition record and the event in one transaction)")


class Placement(Base):
    """One GPU a job holds. Several jobs may share a GPU (packing, time-slicing)."""

    __tablename__ = "placements"
    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    server_name: Mapped[str] = mapped_column(
        ForeignKey("servers.name", ondelete="CASCADE"), primary_key=True
    )
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    __table_args__ = (Index("ix_placements_server", "server_name", "gpu_index"),)


class GpuHold(Base):
    """One GPU held by one job over a time (its Placement row's life): opened when the job is
    placed there, closed (``end_at``) when it leaves it. What the placements table forgets,
    kept so that "which job was on GPU 3 of node-b at 03:12?" and the dashboard's per-GPU
    timeline can be answered after a restart (scheduler/observe/holds.py). ``end_at`` is
    NULL while the GPU is held. No foreign key to servers: a server deregistered keeps its
    history. Indexed by the end, so that a period's holds are read from its start on."""

    __tablename__ = "gpu_holds"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    server_name: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int] = mapped_column(Integer)
    start_at: Mapped[float] = mapped_column(Double)
    end_at: Mapped[float | None] = mapped_column(Double, nullable=True, index=True)
    __table_args__ = (Index("ix_gpu_holds_gpu", "server_name", "gpu_index", "end_at"),)


class ServerSpan(Base):
    """A server up with ``gpus`` GPUs from ``start_at`` to ``end_at`` (None: up now): the
    cluster's capacity over time, which the servers table (the present only) cannot give.
    Opened when a server registers or comes back up, closed when it goes down; a changed
    GPU count closes one and opens another. `gandiva get usage` sums it (since session 49)."""

    __tablename__ = "server_spans"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    server_name: Mapped[str] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    start_at: Mapped[float] = mapped_column(Double)
    end_at: Mapped[float | None] = mapped_column(Double, nullable=True, index=True)


class Migration(Base):
    """A migration in progress, durable: its phase, and the destination GPUs it holds
    from the first phase on (no later round places another job on them). After a
    scheduler restart every row left is completed or rolled back."""

    __tablename__ = "migrations"
    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    # prewarm -> checkpoint -> transfer -> activate (see migration_protocol/fast_path.py)
    phase: Mapped[str] = mapped_column(String(16))
    # The state the job returns to if the migration is rolled back before the source stopped.
    was_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    source_server: Mapped[str] = mapped_column(String(128))
    source_incarnation: Mapped[str] = mapped_column(String(32))
    dest_server: Mapped[str] = mapped_column(String(128))
    dest_gpus: Mapped[list[int]] = mapped_column(JSON)
    dest_incarnation: Mapped[str] = mapped_column(String(32))
    fallback_incarnation: Mapped[str] = mapped_column(String(32))
    # Once the source confirmed its checkpoint: where it is (on the source) and its step.
    checkpoint_path: Mapped[str] = mapped_column(Text, default="")
    step: Mapped[int] = mapped_column(BigInteger, default=-1)
    started_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)


class Transition(Base):
    __tablename__ = "transitions"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text, default="")


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[float] = mapped_column(Double)
    kind: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32), default="", index=True)
    server: Mapped[str] = mapped_column(String(128), default="")
    message: Mapped[str] = mapped_column(Text, default="")


class JobProfile(Base):
    """What profiling learned about a job: memory cycle, utilization, step time, and the
    host memory its processes hold."""

    __tablename__ = "job_profiles"
    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    memory_max: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_min: Mapped[int] = mapped_column(BigInteger, default=0)
    utilization: Mapped[float] = mapped_column(Double, default=0.0)
    step_time_s: Mapped[float] = mapped_column(Double, default=0.0)
    updated_at: Mapped[float] = mapped_column(Double, default=0.0)
    # The resident set of its current launch's processes, as its helper last measured it
    # (0: not measured), and when that report arrived.
    host_memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    host_memory_at: Mapped[float] = mapped_column(Double, default=0.0)


class AuthToken(Base):
    """A credential: a user's, an operator's, or a helper's (scoped to the server of
    the same name). Only the SHA-256 of the token is stored."""

    __tablename__ = "auth_tokens"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float] = mapped_column(Double, default=0.0)
