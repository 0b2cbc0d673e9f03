"""More faults on the multi-host cluster (each host its own network namespace; issue 9):
the scheduler killed with -9 while a migration transfers its checkpoint and while the
destination activates, a helper whose clocks differ and whose wall clock jumps for real
(libfaketime) while it runs or is cut off, a job whose host is lost, a migration that
fails at both ends (the destination's process and the source's helper), and the
scheduler cut off from every host at once. Throughout each test no job trains in two
places at once (the sampler), every job ends exactly once, and its final variables are
bit-identical to an uninterrupted run of the same program (feed_step: every mini-batch
fed from the global step; momentum, two towers).

Each phase is reached deterministically, not by racing the migration: processes are
held with SIGSTOP where the real fault would leave them waiting, and the durable phase
is read from the scheduler's database before it is killed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2

from .conftest import (
    CHECKPOINT_INTERVAL_S,
    WallClock,
    assert_bit_identical,
    child_pids,
    feed_command,
    uninterrupted_variables,
)

Cluster = Any  # the `multihost` fixture's Cluster (tests/multihost/conftest.py)
DONE = (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_KILLED)
RUNNING = common_pb2.JOB_STATE_RUNNING

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def _states(job: common_pb2.Job) -> list[str]:
    return [common_pb2.JobState.Name(t.to_state).removeprefix("JOB_STATE_") for t in job.history]


def _ends_once(c: Cluster, job_id: str, steps: int, timeout: float) -> common_pb2.Job:
    done = c.wait(lambda: (j := c.job(job_id)).state in DONE and j, timeout)
    assert isinstance(done, common_pb2.Job)
    assert done.state == common_pb2.JOB_STATE_SUCCEEDED, (done.message, _states(done))
    assert done.steps == steps
    assert [s for s in _states(done) if s in ("SUCCEEDED", "FAILED", "KILLED")] == ["SUCCEEDED"], _states(done)
    return done


def _no_two_copies(c: Cluster) -> None:
    assert c.sampler.samples > 20, "the sampler did not run"
    assert c.sampler.violations == [], c.sampler.violations


def _start(c: Cluster, steps: int, shared: bool = True, held: bool = False) -> tuple[str, str, str, Path]:
    """Helpers h1 and h2 and a feed_step job training on one of them:
    (job id, its server, the other, where its final variables will be).

    ``held``: the test will hold the job's process with SIGSTOP, and the job sleeps 0.25 s
    a step until the file c.tmp / "GO" exists (then at full speed). A helper whose lease
    runs out freezes its jobs and, once its lease is renewed, thaws them with SIGCONT:
    that also lets go of a process the test held. At 0.03 s a step the source then ran
    its last 100 steps in 3 s and ended before the migration asked for its checkpoint
    ("condition not met within 60s" waiting for the phase; at load 50-100 the scheduler
    left the heartbeats unanswered past the 3-s lease). At 0.25 s it trains 25 s more."""
    c.add_helper("h1", shared=shared)
    c.add_helper("h2", shared=shared)
    dump = c.tmp / "final.npz"
    command = ([*feed_command(steps, dump, sleep=0.25), "--step-sleep-until", str(c.tmp / "GO")] if held
               else feed_command(steps, dump))
    job_id = c.submit("feed", command)
    c.wait(lambda: (j := c.job(job_id)).steps > (3 if held else 20) and j.state == RUNNING, 90)
    c.wait(lambda: c.pids_of(job_id), 30)  # (the sampler looks at /proc every 0.2 s)
    src = c.where(job_id)
    return job_id, src, "h2" if src == "h1" else "h1", dump


def _phase_reached(c: Cluster, job_id: str, phase: str) -> bool:
    row = c.migration_row(job_id)
    return row is not None and row[0] == phase and row[1] >= 0


STEPS = 120


# Heartbeat timeout 30 s (lease 18 s): transfer holds the source's helper (SIGSTOP) a
# while; activate holds the pre-warmed process, which a lease run out (3 s at the default
# 5 s) and renewed would thaw (SIGCONT), letting the migration finish before the kill.
@pytest.mark.parametrize(("phase", "multihost"), [
    ("transfer", {"heartbeat_timeout": 30.0}),
    ("activate", {"heartbeat_timeout": 30.0}),
], indirect=["multihost"])
def test_i9s_scheduler_killed_9_in_transfer_and_activate(multihost: Cluster, phase: str, tmp_path: Path) -> None:
    """After the source's checkpoint is confirmed, a restarted scheduler completes the
    migration by a restart from that checkpoint: the destination is stopped, the job
    ends once, never two copies, with the uninterrupted run's variables.

    transfer: no shared root (the checkpoint moves by the gRPC stream); the source
    helper is held, so the migration waits in `transfer`. activate: the pre-warmed
    process is held, so the migration waits in `activate`."""
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)  # (computed while nothing else runs)
    job_id, src, dest, dump = _start(c, STEPS, shared=(phase == "activate"), held=True)
    (source_pid,) = c.pids_of(job_id)
    # Hold the source at a step until the destination has pre-warmed, so that what
    # follows happens in this order whatever the machine's load.
    os.kill(source_pid, signal.SIGSTOP)
    c.migrate(job_id, dest)
    c.wait(lambda: any(e.kind == "job.migration" and e.message.startswith("prewarm") for e in c.events(job_id)), 90)
    held: list[tuple[str, int]] = []
    if phase == "transfer":
        c.signal(src, signal.SIGSTOP)  # its TransferCheckpoint will wait
        held.append(("helper", c.procs[src].pid))
    else:
        # The prewarm event can come before the process sampler's next look at /proc.
        (warm_pid,) = c.wait(lambda: c.pids_of(job_id, warm=True), 60)  # type: ignore[misc]
        os.kill(warm_pid, signal.SIGSTOP)  # its activation will wait
        held.append(("warm", warm_pid))
    os.kill(source_pid, signal.SIGCONT)  # checkpoints, acks, exits 75
    c.wait(lambda: _phase_reached(c, job_id, phase), 60)
    (c.tmp / "GO").touch()  # the source has checkpointed: every copy after it at full speed
    c.kill9("scheduler")
    # The held process goes on while no scheduler runs (a warm process then trains alone:
    # the source has exited).
    for _, pid in held:
        os.kill(pid, signal.SIGCONT)
    c.start_scheduler()
    restarted = time.monotonic()
    # In activate the restarted scheduler first waits out the destination's lease (a
    # heartbeat timeout: the copy it told to train may) before it places the job again.
    done = _ends_once(c, job_id, STEPS, 120 + (c.heartbeat_timeout if phase == "activate" else 0.0))
    print(f"\n{phase}: the job ended {time.monotonic() - restarted:.1f}s after the scheduler restarted")
    reasons = [t.reason for t in done.history]
    assert any(f"scheduler restarted mid-migration (phase {phase})" in r for r in reasons), reasons
    if phase == "activate":  # not placed beside the copy it may have told to train
        assert any(f"waiting {c.heartbeat_timeout:.0f}s for {dest}'s lease to run out" in r for r in reasons), reasons
    assert c.migration_row(job_id) is None
    assert_bit_identical(dump, STEPS, tmp_path)
    _no_two_copies(c)


def _gpu_sampled_at(c: Cluster, server: str) -> float:
    """When the scheduler's database says the server's GPUs were last sampled."""
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{c.tmp / 'state.db'}?mode=ro", uri=True, timeout=5)) as db:
        return float(db.execute("SELECT max(sampled_at) FROM gpus WHERE server_name = ?", (server,)).fetchone()[0])


def _on_jumped_host(c: Cluster, steps: int, wrapper: list[str] | None = None) -> tuple[WallClock, str, int, Path]:
    """h1 with its wall clock under libfaketime (and `wrapper`), a feed_step job training
    on it, h2 standing by: (the clock, the job, its process, where its variables go). The
    job sleeps 0.25 s a step until the file c.tmp / "GO" exists (then at full speed): it
    must outlive h2's start, both jumps and the cut however loaded the machine. At 0.04 s
    (16 s for 400 steps), at load 23, it ended first ("job process ... ended: it trained
    on to its end instead of being frozen")."""
    clock = WallClock(c.tmp)
    c.add_helper("h1", wrapper=wrapper or [], env=clock.env())
    dump = c.tmp / "final.npz"
    job_id = c.submit("feed", [*feed_command(steps, dump, sleep=0.25), "--step-sleep-until", str(c.tmp / "GO")])
    c.wait(lambda: (j := c.job(job_id)).steps > 20 and j.state == RUNNING, 90)
    assert c.where(job_id) == "h1"
    c.add_helper("h2")
    (pid,) = c.pids_of(job_id)
    helper = c.procs["h1"].pid
    helper = ([helper, *child_pids(helper)] if wrapper else [helper])[-1]
    assert WallClock.loaded_in(helper) and WallClock.loaded_in(pid), "libfaketime is not in h1 or its job"
    return clock, job_id, pid, dump


def _jump(clock: WallClock, offset_s: int) -> None:
    clock.set(offset_s)
    seen = clock.offset_seen()
    assert abs(seen - offset_s) < 5, f"h1's wall clock is {seen:+.0f}s off, not {offset_s:+d}s"
    time.sleep(1.2)  # libfaketime re-reads the offset every second: every process of h1 has it now


def test_i9s_helper_wall_clock_jumps_neither_freeze_a_connected_job_nor_keep_a_cut_off_one_training(
        multihost: Cluster, tmp_path: Path) -> None:
    """h1 runs in a time namespace whose monotonic and boot clocks are a day ahead of the
    scheduler's, and its wall clock (CLOCK_REALTIME, moved by libfaketime for the helper,
    its job, gRPC's C core and TensorFlow alike) jumps an hour ahead, then an hour behind
    real time, while its job trains. The lease runs on monotonic time: the job is not
    frozen, h1 does not go down, the job is not re-placed (h2 stands by), and the
    scheduler stamps h1's GPU samples with its own clock, not h1's. Then, the wall clock
    still an hour behind (a lease measured on it would never run out), h1's link is cut:
    its job is frozen once the real lease (3 s) has run out, re-placed on h2 only after
    that, and once the link is back h1 stops its stale copy. The job ends once, with the
    uninterrupted run's variables."""
    c = multihost
    steps = 400
    uninterrupted_variables(steps, tmp_path)
    clock, job_id, pid, dump = _on_jumped_host(c, steps, wrapper=[
        "unshare", "--fork", "--kill-child=SIGTERM", "--time", "--monotonic", "86400", "--boottime", "86400"])
    offsets = Path(f"/proc/{pid}/timens_offsets").read_text().split()
    assert offsets[offsets.index("monotonic") + 1] == "86400", offsets  # the job, and h1, a day ahead

    states, down, running, stamped = [], [], [], []
    for value in (3600, -3600):
        _jump(clock, value)
        running.append(c.job(job_id).state == RUNNING)
        until = time.monotonic() + 3.0 + 1.0  # past the lease (heartbeat timeout 5 s)
        while time.monotonic() < until:
            states.append(_proc_state(pid))
            down += [n for n, up in c.servers().items() if not up]
            time.sleep(0.05)
        stamped.append(_gpu_sampled_at(c, "h1") - time.time())
    assert running == [True, True], "the job ended before every jump was made"
    assert "T" not in states, "the job was frozen: the lease followed the wall clock"
    assert down == [], f"servers marked down: {set(down)}"
    assert all(abs(s) < 30 for s in stamped), f"GPU samples stamped with h1's clock: {stamped}"
    assert "freezing jobs" not in (c.tmp / "h1.log").read_text()
    assert c.where(job_id) == "h1"

    c.net.cut("h1")
    cut_at = time.monotonic()
    frozen = c.wait(lambda: time.monotonic() - cut_at if _proc_state(pid) == "T" else None, 20)
    assert isinstance(frozen, float) and frozen < 3.0 + 2.5, f"frozen {frozen:.1f}s after the cut"
    c.wait(lambda: c.where(job_id) == "h2", 40)
    replaced = time.monotonic() - cut_at
    (c.tmp / "GO").touch()  # its copy on h2 runs at full speed
    assert replaced >= 3.0 and replaced > frozen, f"re-placed {replaced:.1f}s after the cut (frozen at {frozen:.1f}s)"
    c.net.restore("h1")
    c.wait(lambda: pid not in c.pids_of(job_id), 30)  # h1, back, stops its stale copy
    clock.set(0)
    done = _ends_once(c, job_id, steps, 150)
    assert {g.server for g in done.placement} <= {"h2"}
    assert _states(done).count("RUNNING") == 2, _states(done)  # on h1, then on h2: never a third launch
    assert_bit_identical(dump, steps, tmp_path)
    _no_two_copies(c)


def _proc_state(pid: int) -> str:
    """The process's state letter (T: stopped); a copy that is gone was never frozen."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        raise AssertionError(f"job process {pid} ended: it trained on to its end instead of being frozen") from None


def test_i9s_lost_host_job_ends_with_the_uninterrupted_variables(multihost: Cluster, tmp_path: Path) -> None:
    """The helper of the job's host killed with -9 after a periodic checkpoint: the host is
    marked down, the job resumes on the other host from that checkpoint (through the shared
    root) and trains on past it there, ends once, and with the variables of an uninterrupted
    run. (This also covers what test_multihost_faults.py's helper-killed test checked.)"""
    c = multihost
    steps = 400  # the wall-clock test's step count: one uninterrupted run serves both
    uninterrupted_variables(steps, tmp_path)
    job_id, src, other, dump = _start(c, steps)

    def checkpoint_steps(server: str) -> list[int]:
        return [int(e.message.split()[1]) for e in c.events(job_id) if e.kind == "job.checkpoint" and e.server == server]

    c.wait(lambda: max(checkpoint_steps(src), default=0) >= 100, 60)
    c.kill9(src)
    lost_at = time.monotonic()
    c.wait(lambda: c.where(job_id) == other, 40)
    assert not c.servers()[src]
    placed = c.job(job_id)
    resumed = [t.reason for t in placed.history if "resuming from" in t.reason]
    assert resumed and f"/rd/{src}/{job_id}/periodic-" in resumed[-1], [t.reason for t in placed.history]
    replaced_s = time.monotonic() - lost_at
    step = max(checkpoint_steps(src))
    # Training again elsewhere, past the restored step: the new launch's own checkpoint.
    c.wait(lambda: checkpoint_steps(other), 60)
    again_s = time.monotonic() - lost_at
    assert min(checkpoint_steps(other)) > step
    print(f"\nlost host: job re-placed on {other} {replaced_s:.1f}s after its helper was killed, "
          f"training again (first checkpoint there) after {again_s:.1f}s, resumed from step {step} of {steps} "
          f"(checkpoint every {CHECKPOINT_INTERVAL_S:g}s, heartbeat timeout {c.heartbeat_timeout:g}s)")
    _ends_once(c, job_id, steps, 120)
    assert_bit_identical(dump, steps, tmp_path)
    _no_two_copies(c)


@pytest.mark.parametrize("multihost", [{"heartbeat_timeout": 5.0}], indirect=True)
def test_i9s_migration_failed_at_both_ends_resumes_from_the_checkpoint_it_left_at_the_destination(
        multihost: Cluster, tmp_path: Path) -> None:
    """Through the shared mount the source checkpoints straight into the destination's
    ramdisk; then the pre-warmed destination process dies (kill -9) before it activates,
    and the source's helper, which should restart the job from the checkpoint, is frozen
    (SIGSTOP) until it is marked down. No process runs the job: it is re-queued with that
    checkpoint (on the destination, where it lies) as its restore point, not an older
    periodic one on the lost source, resumes from its step, ends once and with the
    uninterrupted run's variables; the source helper, let go, never trains a second copy."""
    c = multihost
    uninterrupted_variables(STEPS, tmp_path)
    job_id, src, dest, dump = _start(c, STEPS, held=True)
    (source_pid,) = c.pids_of(job_id)
    os.kill(source_pid, signal.SIGSTOP)  # at a step until the destination has pre-warmed
    c.migrate(job_id, dest)
    c.wait(lambda: any(e.kind == "job.migration" and e.message.startswith("prewarm") for e in c.events(job_id)), 90)
    (warm_pid,) = c.wait(lambda: c.pids_of(job_id, warm=True), 60)  # type: ignore[misc]
    os.kill(warm_pid, signal.SIGSTOP)  # its activation waits
    os.kill(source_pid, signal.SIGCONT)  # checkpoints into the destination's ramdisk, exits 75
    c.wait(lambda: _phase_reached(c, job_id, "activate"), 60)
    (c.tmp / "GO").touch()  # the source has checkpointed: the job resumes at full speed
    step = c.migration_row(job_id)[1]  # type: ignore[index]
    c.signal(src, signal.SIGSTOP)  # the restart at the source will get no answer
    os.kill(warm_pid, signal.SIGKILL)
    try:
        c.wait(lambda: not c.servers()[src], 30)
    finally:
        c.signal(src, signal.SIGCONT)
    requeued = c.wait(lambda: (j := c.job(job_id)).state != common_pb2.JOB_STATE_MIGRATING and j, 60)
    reasons = [t.reason for t in requeued.history]  # type: ignore[attr-defined]
    assert any(f"its server {src} went down mid-migration; will resume from step {step} "
               f"(its checkpoint is on {dest})" in r for r in reasons), reasons
    placed = c.wait(lambda: (j := c.job(job_id)).state == RUNNING and j.placement and j, 60)
    resumed = placed.history[-1].reason  # type: ignore[attr-defined]
    assert "resuming from" in resumed and f"/rd/{dest}/{job_id}/migrate-" in resumed, resumed
    done = _ends_once(c, job_id, STEPS, 120)
    assert not any("step 0" in t.reason for t in done.history), [t.reason for t in done.history]
    assert_bit_identical(dump, STEPS, tmp_path)
    _no_two_copies(c)


def _a_job_for_each_of_two_hosts(c: Cluster, steps: int) -> dict[str, Path]:
    """Helpers h1 and h2 and two feed_step jobs submitted: {job id: where its final
    variables will be}. Each sleeps 0.25 s a step until the file c.tmp / "GO" exists (then
    at full speed): 100 s at least, so the first to start outlives the other's start and
    the cut however loaded the machine. At 0.03 s (12 s), TensorFlow starts tens of seconds
    apart at load 20 could let the first end before the cut froze it."""
    c.add_helper("h1")
    c.add_helper("h2")
    dumps = {}
    for name in ("a", "b"):
        dump = c.tmp / f"final-{name}.npz"
        dumps[c.submit(name, [*feed_command(steps, dump, sleep=0.25), "--step-sleep-until", str(c.tmp / "GO")])] = dump
    return dumps


def test_i9s_scheduler_cut_off_from_every_host(multihost: Cluster, tmp_path: Path) -> None:
    """The scheduler's own link is cut while a job trains on each of two hosts: every
    helper freezes its job once its lease runs out, the scheduler marks both servers down
    and re-queues both jobs, with nowhere to place them. When the link is back the helpers
    reconnect, stop their frozen stale copies, and each job resumes from its periodic
    checkpoint, ends once and with the uninterrupted run's variables; never two copies."""
    c = multihost
    steps = 400  # as the other tests here: one uninterrupted run serves them all
    uninterrupted_variables(steps, tmp_path)
    dumps = _a_job_for_each_of_two_hosts(c, steps)

    def checkpointed(job_id: str) -> bool:
        return any(e.kind == "job.checkpoint" and "/periodic-" in e.message for e in c.events(job_id))

    c.wait(lambda: all(c.job(j).state == RUNNING and checkpointed(j) for j in dumps), 90)
    assert {c.where(j) for j in dumps} == {"h1", "h2"}
    # The sampler sees a process within its interval (CI once asked before it had).
    pids = {j: c.wait(lambda j=j: c.pids_of(j), 30)[0] for j in dumps}  # type: ignore[index]
    c.net.cut("sched")
    cut_at = time.monotonic()
    c.wait(lambda: all(_proc_state(pid) == "T" for pid in pids.values()), 20)
    frozen = time.monotonic() - cut_at
    c.wait(lambda: not any(c.servers().values()), 30)
    assert all(c.job(j).state == common_pb2.JOB_STATE_QUEUED for j in dumps)
    assert all(_proc_state(pid) == "T" for pid in pids.values()), "a stale copy thawed while cut off"
    c.net.restore("sched")
    (c.tmp / "GO").touch()  # the resumed copies run at full speed
    c.wait(lambda: not any(pid in c.pids_of(j) for j, pid in pids.items()), 40)  # stale copies stopped
    for job_id, dump in dumps.items():
        done = _ends_once(c, job_id, steps, 150)
        reasons = [t.reason for t in done.history]
        assert any("went down" in r for r in reasons), reasons
        assert any("resuming from" in r and "/periodic-" in r for r in reasons), reasons
        assert_bit_identical(dump, steps, tmp_path)
    print(f"\nscheduler cut off: both jobs frozen {frozen:.1f}s after the cut")
    _no_two_copies(c)
