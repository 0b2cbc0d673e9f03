"""Builders shared by the policy tests (servers, jobs on GPUs, snapshots), as the ``mk`` fixture.

The suite runs with --import-mode=importlib, so test modules cannot import a sibling
helper module; a fixture hands the builders out instead."""

from __future__ import annotations

import dataclasses
import types

import pytest

from scheduler.policy import ClusterSnapshot, GpuRef, JobProfile, JobView, ServerView
from scheduler.policy.types import Migrate, Park, Place, Resume, Suspend

GIB = 1 << 30


def servers(n: int, gpus: int = 4) -> tuple[ServerView, ...]:
    return tuple(ServerView(f"s{i}", gpus) for i in range(n))


def on(server: str, *indexes: int) -> tuple[GpuRef, ...]:
    return tuple(GpuRef(server, i) for i in indexes)


def job(jid: str, gpus: int = 1, state: str = "QUEUED", placement: tuple[GpuRef, ...] = (),
        **kw: object) -> JobView:
    if placement and "gpus" not in kw:
        gpus = len(placement)
    return JobView(jid, gpus, state=state, placement=placement, **kw)  # type: ignore[arg-type]


def profiled(mem_gib: float, util: float, step_s: float = 0.1) -> JobProfile:
    return JobProfile(int(mem_gib * GIB), util, step_s)


def snap(now: float, srv: tuple[ServerView, ...], *jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(now, srv, tuple(jobs))


def after(snap: ClusterSnapshot, decisions: list, now: float) -> ClusterSnapshot:
    """The snapshot after the decisions, as the live engine or the simulator applies them."""
    jobs = {j.id: j for j in snap.jobs}
    for d in decisions:
        j = jobs[d.job_id]
        if isinstance(d, Suspend):
            jobs[d.job_id] = dataclasses.replace(j, state="SUSPENDED", last_state_change_at=now)
        elif isinstance(d, Park):
            jobs[d.job_id] = dataclasses.replace(j, state="QUEUED", placement=(), last_state_change_at=now)
        elif isinstance(d, Migrate):
            jobs[d.job_id] = dataclasses.replace(j, state="RUNNING", placement=d.to_gpus, last_state_change_at=now)
        elif isinstance(d, (Resume, Place)):
            jobs[d.job_id] = dataclasses.replace(j, state="RUNNING", placement=d.gpus, last_state_change_at=now)
    return ClusterSnapshot(now, snap.servers, tuple(jobs.values()))


def kinds(decisions: list) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.job_id) for d in decisions]


@pytest.fixture
def mk() -> types.SimpleNamespace:
    return types.SimpleNamespace(servers=servers, on=on, job=job, profiled=profiled, snap=snap,
                                 kinds=kinds, after=after)
