"""Tiresias' pending walk steps over the jobs too large for the GPUs left instead of visiting
every waiting job; it must decide exactly what the plain walk (``incremental = False``, every
pending job in order until no GPU is left) decides, call for call, on a live-like cluster:
decisions applied late or never (a preempted job still RUNNING at the next call), jobs that
migrate, jobs that cannot be stopped, a waiting job whose GPU count changes, arrivals and
departures, with and without the starvation rule."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.policy import ClusterSnapshot, GpuRef, JobView, PolicyConfig, ServerView, get_policy
from scheduler.policy.types import Place, Resume, Suspend

SERVERS = tuple(ServerView(f"s{i}", 4) for i in range(3))
CONFIGS = {
    "defaults": PolicyConfig(tiresias_thresholds_gpu_s=(400.0, 1600.0)),
    "starve": PolicyConfig(tiresias_thresholds_gpu_s=(300.0,), tiresias_starve_factor=0.5),
}


def _drive(seed: int, config: PolicyConfig, calls: int = 80) -> tuple[int, int]:
    """Replays one random live cluster through both walks; returns (Suspends, Place/Resumes)."""
    rnd = random.Random(seed)
    fast, plain = get_policy("tiresias", config), get_policy("tiresias", config)
    plain.incremental = False  # type: ignore[attr-defined]
    jobs: dict[str, JobView] = {}
    now, made, suspends, starts = 0.0, 0, 0, 0
    for _ in range(calls):
        now += rnd.choice([1.0, 30.0, 120.0, 600.0])
        for _ in range(rnd.choice([0, 0, 1, 3])):  # arrivals, GPU counts of mixed size
            made += 1
            jid = f"j{made:03d}"
            jobs[jid] = JobView(jid, rnd.choice([1, 1, 2, 4, 8]), submitted_at=now, reported_at=now,
                                suspendable=rnd.random() > 0.1)
        for jid, view in list(jobs.items()):
            if view.state == "RUNNING":
                served = view.attained_at(now)
                if served > rnd.uniform(200, 5000):
                    del jobs[jid]  # finished
                    continue
                view = dataclasses.replace(view, attained_service_s=served, reported_at=now)
                if rnd.random() < 0.05:
                    view = dataclasses.replace(view, state="MIGRATING")
            elif view.state == "MIGRATING":
                view = dataclasses.replace(view, state="RUNNING", reported_at=now)
            elif view.state == "QUEUED" and rnd.random() < 0.05:
                view = dataclasses.replace(view, gpus=rnd.choice([1, 2, 4]))  # resized while waiting
            jobs[jid] = view
        snapshot = ClusterSnapshot(now, SERVERS, tuple(jobs.values()))
        got, want = fast.decide(snapshot), plain.decide(snapshot)
        assert got == want, (seed, now)
        assert fast.next_wakeup() == plain.next_wakeup(), (seed, now)
        for d in got:
            if rnd.random() < 0.3:
                continue  # not applied (yet): the job is found as it was at the next call
            view = jobs[d.job_id]
            if isinstance(d, Suspend):
                suspends += 1
                jobs[d.job_id] = dataclasses.replace(view, state="SUSPENDED", last_state_change_at=now)
            elif isinstance(d, (Place, Resume)):
                starts += 1
                gpus: tuple[GpuRef, ...] = d.gpus
                jobs[d.job_id] = dataclasses.replace(view, state="RUNNING", placement=gpus,
                                                     last_state_change_at=now, reported_at=now)
    return suspends, starts


@pytest.mark.parametrize("config", sorted(CONFIGS))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_skipping_walk_decides_as_the_plain_walk(config: str, seed: int) -> None:
    _drive(seed, CONFIGS[config])


def test_the_random_clusters_really_preempt_and_queue() -> None:
    """The driver reaches the paths in question (else the equality above proves little)."""
    suspends, starts = map(sum, zip(*(_drive(seed, CONFIGS["defaults"]) for seed in range(5)), strict=True))
    assert suspends > 20 and starts > 50
