"""A flapping link: one host's link cut and restored every 1-3 s for half a minute (a bad
cable, a switch port bouncing, a NIC resetting), while a job trains there and another is
being migrated to it. No job may be lost, duplicated or changed (both end once, with all
their mini-batches and the variables of an uninterrupted run), no two copies of a job
may train at once, no GPU may be held twice in the database, the jobs may not be
re-placed again and again (at most once each), the migration ends once (moved, or given
up and the job trained on at its source), and the host ends up in the cluster."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from protos.gandiva.v1 import scheduler_pb2

from .conftest import assert_bit_identical, feed_command, uninterrupted_variables
from .test_i9s_faults import RUNNING, Cluster, _ends_once, _no_two_copies, _states
from .test_partition_faults import GpuWatch

STEPS = 400  # as test_partition_faults.py: one uninterrupted run per step count
FLAP_S = 30.0

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# What ends a migration in the job's history, whichever way it ends.
MIGRATION_ENDS = ("migrated to ", "stayed_at_source", "restarted_at_source", "migration failed",
                  "migration to ")


def _ends_a_migration(reason: str) -> bool:
    """Whether a transition out of MIGRATING says how the migration ended (or that the job
    did: one that finishes at its source while its destination pre-warms)."""
    return reason.startswith(MIGRATION_ENDS) or reason == "finished" or (
        reason.startswith("its server ") and "mid-migration" in reason)


class Flapper:
    """Cuts and restores one host's link at random 1-3 s intervals (seeded) until
    stopped; always leaves it restored."""

    def __init__(self, c: Cluster, host: str, seed: int) -> None:
        self.c, self.host, self.rng = c, host, random.Random(seed)
        self.cuts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.c.net.cut(self.host)
                self.cuts += 1
                self._stop.wait(self.rng.uniform(1.0, 3.0))
                self.c.net.restore(self.host)
                self._stop.wait(self.rng.uniform(1.0, 3.0))
        finally:
            self.c.net.restore(self.host)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("multihost", [{"heartbeat_timeout": 10.0}], indirect=True)
def test_a_flapping_link_loses_duplicates_and_storms_nothing(multihost: Cluster, tmp_path: Path) -> None:
    """h2 (2 GPUs) runs job B; job A trains on h1. No shared root: A's migration to h2
    streams its checkpoint over the flapping link. h2's link flaps for 30 s from the
    moment A's migration is asked for."""
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    dumps, go = {name: c.tmp / f"{name}.npz" for name in ("A", "B")}, c.tmp / "GO"
    # 0.4 s mini-batches until the flapping is over (the file GO; then at full speed): 160 s
    # at least, so both outlast it however loaded the machine. At 0.08 s (32 s) A's steps
    # began before h2's helper and B's TensorFlow start (each tens of seconds at load 20),
    # so A could end before B reached step 10, or before its migration. A on h1 (alone
    # then), B on h2 (h1 full).
    c.add_helper("h1", shared=False)
    a = c.submit("A", [*feed_command(STEPS, dumps["A"], sleep=0.4), "--step-sleep-until", str(go)])
    c.wait(lambda: c.job(a).state == RUNNING, 30)
    c.add_helper("h2", gpus=2, shared=False)
    b = c.submit("B", [*feed_command(STEPS, dumps["B"], sleep=0.4), "--step-sleep-until", str(go)])
    jobs = {"A": a, "B": b}
    watch = GpuWatch(c.tmp / "state.db")
    c.wait(lambda: all((j := c.job(i)).state == RUNNING and j.steps > 10 for i in jobs.values()), 90)
    assert (c.where(a), c.where(b)) == ("h1", "h2")
    flappy = "h2"
    flapper = Flapper(c, flappy, seed=42)
    began = time.monotonic()
    try:
        # Asked again while busy, and while h2 is called down for a moment by its link.
        asked_s = c.migrate(a, flappy, 20, also=lambda err: f"server {flappy} is down" in (err.details() or ""))
        time.sleep(max(0.0, FLAP_S - (time.monotonic() - began)))
    finally:
        flapper.stop()
    c.wait(lambda: c.server_up(flappy), 30)
    go.touch()
    done = {name: _ends_once(c, job_id, STEPS, 150) for name, job_id in jobs.items()}
    for name in jobs:
        assert_bit_identical(dumps[name], STEPS, tmp_path)
    history = {name: [t.reason for t in job.history] for name, job in done.items()}
    # Every migration of A (the operator's; the policy's, if any) ended once, whichever way,
    # and there were not many.
    states = _states(done["A"])
    starts = [i for i, s in enumerate(states) if s == "MIGRATING"]
    assert all(i + 1 < len(states) and _ends_a_migration(history["A"][i + 1]) for i in starts), history["A"]
    assert 1 <= len(starts) <= 3, history["A"]
    ends = [history["A"][i + 1] for i in starts]
    # No storm: each job re-queued (its host called down) at most once.
    requeued = {name: _states(job)[1:].count("QUEUED") for name, job in done.items()}
    assert all(n <= 1 for n in requeued.values()), (requeued, history)
    downs = [e.message for e in c.stub.ListEvents(scheduler_pb2.ListEventsRequest(
        kinds=["server.down"], server=flappy)).events]
    print(f"\nflapping {flappy}: {flapper.cuts} cuts in {FLAP_S:.0f}s; migration asked after {asked_s:.1f}s, "
          f"{len(starts)} migration(s) of A: {ends}; {len(downs)} server.down; re-queued {requeued}")
    assert len(downs) <= 1, downs
    assert watch.stop() == []
    _no_two_copies(c)
    # A and B live on: nothing of either is left running.
    c.wait(lambda: not c.pids_of(a) and not c.pids_of(b), 30)
