"""Faults on a multi-host cluster (each host its own network namespace): a host's link
cut and restored, the scheduler killed with -9 mid-migration. Throughout each test (not
only at its end) no job ever trains in two places at once, and every job ends exactly
once, with exactly the mini-batches it asked for. (A helper killed with -9 is in
test_i9s_faults.py, test_i9s_lost_host_job_ends_with_the_uninterrupted_variables, which
also checks the job's final variables.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2

# The `multihost` fixture's Cluster (tests/multihost/conftest.py).
Cluster = Any
DONE = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)

pytestmark = [pytest.mark.tf, pytest.mark.slow]

STEPS = 400


def _states(job: common_pb2.Job) -> list[str]:
    return [common_pb2.JobState.Name(t.to_state).removeprefix("JOB_STATE_") for t in job.history]


def _ends_once(c: Cluster, job_id: str, steps: int, timeout: float) -> common_pb2.Job:
    done = c.wait(lambda: (j := c.job(job_id)).state in DONE and j, timeout)
    assert isinstance(done, common_pb2.Job)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, done.message
    assert done.steps == steps
    ends = [s for s in _states(done) if s in ("SUCCEEDED", "FAILED", "KILLED")]
    assert ends == ["SUCCEEDED"], _states(done)
    return done


def _no_two_copies(c: Cluster) -> None:
    assert c.sampler.samples > 20, "the sampler did not run"
    assert c.sampler.violations == [], c.sampler.violations


def _training_on_one_of_two(c: Cluster, name: str, command: list[str]) -> tuple[str, str, str]:
    """Helpers h1 and h2, a job trains on one of them: (job id, its server, the other)."""
    c.add_helper("h1")
    c.add_helper("h2")
    job_id = c.submit(name, command)
    c.wait(lambda: (j := c.job(job_id)).steps > 20 and j.state == common_pb2.JOB_STATE_RUNNING, 60)
    src = c.where(job_id)
    return job_id, src, "h2" if src == "h1" else "h1"


# Only with GANDIVA_FULL_TESTS=1 (tests/conftest.py): test_i9s_faults.py -k wall_clock_jumps
# cuts its job's host the same way by default (frozen once the lease has run out, re-placed
# only after that, the stale copy stopped once the link is back, ends once, bit-identical),
# and tests/scheduler/api/test_fencing.py checks the job.fenced event.
@pytest.mark.full
def test_cut_link_freezes_the_copy_and_a_restored_host_stops_it(multihost: Cluster, mlp_command) -> None:  # type: ignore[no-untyped-def]
    c = multihost
    job_id, src, other = _training_on_one_of_two(c, "cut", mlp_command(STEPS))
    (old,) = c.sampler.cpu_of(job_id)
    c.net.cut(src)
    cut_at = time.monotonic()
    # Re-placed on the other host only once the cut host's lease has run out.
    c.wait(lambda: c.where(job_id) == other, 40)
    replaced_after = time.monotonic() - cut_at
    assert replaced_after >= 3.0, f"re-placed {replaced_after:.1f}s after the cut, before the lease ran out"
    # The cut host's copy is frozen: its CPU time stands still.
    frozen = c.sampler.cpu_of(job_id)[old]
    time.sleep(2.0)
    assert c.sampler.cpu_of(job_id).get(old) == frozen, "the cut host's copy kept running"
    c.net.restore(src)
    # Back on the network, its helper learns the copy is stale and kills it.
    c.wait(lambda: old not in c.sampler.cpu_of(job_id), 20)
    c.wait(lambda: c.server_up(src), 20)
    done = _ends_once(c, job_id, STEPS, 90)
    assert {g.server for g in done.placement} <= {other}
    assert any(e.kind == "job.fenced" for e in c.events(job_id)), [e.kind for e in c.events(job_id)]
    _no_two_copies(c)


def test_scheduler_killed_9_mid_migration(multihost: Cluster, mlp_command) -> None:  # type: ignore[no-untyped-def]
    """Killed while the destination pre-warms: rolled back, the job goes on where it was.
    (Kills after the source's checkpoint, in the transfer and activate phases, are in
    test_i9s_faults.py, where each phase is held with SIGSTOP instead of raced.)"""
    c = multihost
    # Long enough to outlast a slow pre-warm (a loaded machine): 2,000 steps of at least 20 ms.
    steps = 2000
    job_id, _, dest = _training_on_one_of_two(c, "mover", mlp_command(steps, 0.02))
    c.migrate(job_id, dest)
    c.kill9("scheduler")
    c.start_scheduler()
    done = _ends_once(c, job_id, steps, 150)
    reasons = [t.reason for t in done.history]
    assert any("after a scheduler restart" in r or "scheduler restarted mid-migration" in r for r in reasons), reasons
    # Rolled back: it never left its source.
    assert "QUEUED" not in _states(done)[1:], _states(done)
    _no_two_copies(c)
