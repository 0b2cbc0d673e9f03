"""Host faults that hit a migration's checkpoint stream (no shared root: the source's helper
streams it to the destination's agent), on the multi-host cluster (each host its own network
namespace): the destination's checkpoint disk failing mid-stream (ext4 turned read-only by
the kernel), and the source's helper killed with -9 mid-stream. The jobs are the MLP
program; each must end once, with the uninterrupted run's variables, never in two places
at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2

from ..migration_helper.conftest import failing_ext4
from ..tf_runtime.conftest import load_variables
from . import degrade
from .test_degraded_links import (
    DownWatch,
    _ends_bit_identical,
    _migrate_over_a_cap,
    _mlp,
    _MlpBaseline,
)
from .test_i9s_faults import _ends_once, _no_two_copies, _states

Cluster = Any  # the `multihost` fixture's Cluster (tests/multihost/conftest.py)
RUNNING = common_pb2.JOB_STATE_RUNNING

pytestmark = [pytest.mark.tf, pytest.mark.slow]


# The mechanism, by default: tests/migration_helper/test_helper_lease.py -k read_only (the
# helper's heartbeats) and test_ramdisk_transfer.py -k read_only (the stream's refusal).
@pytest.mark.full
def test_a_destination_disk_turned_read_only_mid_transfer_leaves_its_own_job_training(
        multihost: Cluster, tmp_path: Path) -> None:
    """h2's ramdisk is an ext4 disk of its own (errors=remount-ro). A job trains on h2; a
    second, on h1, is migrated to h2, its checkpoint streamed over a link capped at 1 Mbit/s;
    mid-stream h2's disk fails and the kernel turns it read-only. The migration restarts its
    job at h1, saying that h2's disk failed; h2 stays up and its own job trains on in its
    process (its periodic checkpoints refused). Before: h2's helper could neither rewrite
    nor remove its lease file there, the error ended its heartbeats for good (the process
    alive and silent), h2 was called down, and its job, told to exit, started over from
    step 0 elsewhere (its checkpoint was on h2)."""
    c = multihost
    steps, hidden = 2500, 512
    go = c.tmp / "GO"  # until it exists, 0.06 s after each step: the jobs outlast the migration
    base = _MlpBaseline(steps, hidden, tmp_path)
    c.add_helper("h1", shared=False)
    moved_dump, own_dump = c.tmp / "moved.npz", c.tmp / "own.npz"
    moved = c.submit("moved", _mlp(steps, moved_dump, hidden, sleep=0.06, until=go))
    c.wait(lambda: (j := c.job(moved)).steps > 20 and j.state == RUNNING, 120)
    with failing_ext4(c.tmp / "rd" / "h2") as fail:
        try:
            c.add_helper("h2", gpus=2, shared=False)
            own = c.submit("own", _mlp(steps, own_dump, hidden, sleep=0.06, until=go))
            c.wait(lambda: (j := c.job(own)).steps > 20 and j.state == RUNNING and c.where(own) == "h2", 120)
            watch = DownWatch(c)
            degrade.cap_to(c.net.hosts["h1"][0], c.net.link("h1"), c.net.hosts["h2"][1], "1mbit")
            c.migrate(moved, "h2")
            incoming = c.tmp / "rd" / "h2" / moved
            c.wait(lambda: any(p.name.startswith(".incoming-") for p in incoming.glob("*")), 120)
            fail.write_text("gandiva test: the disk fails\n")
            back = c.wait(lambda: (j := c.job(moved)).state == RUNNING and c.where(moved) == "h1" and j, 150)
            why = [t.reason for t in back.history if t.reason.startswith("restarted_at_source")]  # type: ignore[attr-defined]
            assert why and "its disk failed or was made read-only" in why[-1], why
            # Heartbeats of a few leases' time after the failure: h2 must stay up, its job train.
            at = c.job(own).steps
            c.wait(lambda: c.job(own).steps > at + 50, 60)
            go.touch()
            degrade.uncap(c.net.hosts["h1"][0], c.net.link("h1"))
            for job_id, dump in ((moved, moved_dump), (own, own_dump)):
                done = _ends_once(c, job_id, steps, 200)
                assert load_variables(dump) == base.variables(), f"{job_id}: variables differ from the uninterrupted run"
                if job_id == own:
                    assert _states(done).count("QUEUED") == 1, [t.reason for t in done.history]
            assert watch.stop() == set()
            _no_two_copies(c)
        finally:
            c.close()  # the helper's processes leave the file system before it is unmounted


# The mechanism, by default: tests/scheduler/api/test_host_faults.py -k lost_at_once (the
# source falling silent with its checkpoint confirmed and the stream unanswered).
@pytest.mark.full
def test_source_helper_killed_mid_transfer_and_restarted_resumes_from_the_migrations_checkpoint(
        multihost: Cluster, tmp_path: Path) -> None:
    """The stream (2 MB over 1 Mbit/s) is cut by the source helper's death; the destination's
    agent drops its partial copy; the new helper on the source registers once the old one
    has been silent past the heartbeat timeout. The job resumes on its source from the
    checkpoint the migration wrote (not from step 0), its warm copy at the destination is
    stopped, and it ends once, bit-identical, never in two places (probed: running again
    6.7 s after the kill; with the helper not started again, the job started over from step
    0 on the destination once --checkpoint-wait ran out, as documented)."""
    c = multihost
    steps = 600
    go = c.tmp / "GO"
    base, job_id, src, dest, dump = _migrate_over_a_cap(c, steps, 512, 0.06, "1mbit", tmp_path, until=go)
    incoming = c.tmp / "rd" / dest / job_id
    c.wait(lambda: any(p.name.startswith(".incoming-") for p in incoming.glob("*")), 120)
    c.kill9(src)
    degrade.uncap(c.net.hosts[src][0], c.net.link(src))
    c.add_helper(src, shared=False)
    after = c.wait(lambda: (j := c.job(job_id)).state == RUNNING and j.steps > 0 and j, 240)
    go.touch()
    resumed = [t.reason for t in after.history if "resuming from" in t.reason]  # type: ignore[attr-defined]
    assert resumed and "/migrate-" in resumed[-1], [t.reason for t in after.history]  # type: ignore[attr-defined]
    left = [p for p in incoming.glob("*") if p.name.startswith(".incoming-")]
    assert left == [], left
    _ends_bit_identical(c, job_id, steps, dump, base)
