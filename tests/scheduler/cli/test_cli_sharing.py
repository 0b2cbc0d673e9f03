"""`gandiva describe job`'s "Sharing" section (scheduler/cli/sharing.py) from a job's events as
the scheduler writes them: time in each state, suspensions, the rates before each switch,
packing verdicts with the job's own rates packed and alone, moves with their pauses. The live
case: tests/scheduler/test_dashboard_job.py (describe -o json of a job suspended and judged)."""

from __future__ import annotations

from protos.gandiva.v1 import common_pb2
from scheduler.cli.sharing import lines, sharing


def _event(at: float, kind: str, message: str) -> common_pb2.Event:
    return common_pb2.Event(at=at, kind=kind, job_id="j-b", message=message)


def test_time_slices_packing_and_moves_are_summed_for_the_job() -> None:
    job = common_pb2.Job(id="j-b", spec=common_pb2.JobSpec(gpus=2), submitted_at=100.0, finished_at=200.0)
    events = [
        _event(100.0, "job.submitted", "submitted"),
        _event(110.0, "job.state", "QUEUED -> RUNNING: placed on n1 [0, 1] (Algorithm 1: ...)"),
        _event(130.0, "job.state", "RUNNING -> SUSPENDED: time slice of 20s over (step 261) (it ran 32.5 mini-batches/s)"),
        _event(150.0, "job.state", "SUSPENDED -> RUNNING: its turn"),
        _event(160.0, "job.pack", "packing trial with j-a: packed rate 1.62x of time-slicing: kept (j-a 15.8 packed "
                                  "vs 19.5 alone, j-b 15.7 vs 19.4 mini-batches/s; measured over 4.5s)"),
        _event(170.0, "job.state", "RUNNING -> MIGRATING: GPUs idle for 5s: n1 -> n2 (it ran 30.1 mini-batches/s)"),
        _event(172.5, "job.state", "MIGRATING -> RUNNING: migrated to n2 at step 900 (training paused 1.93s)"),
        _event(200.0, "job.state", "RUNNING -> SUCCEEDED: exited 0"),
    ]
    got = sharing(job, events)
    assert (got["running_s"], got["suspended_s"], got["queued_s"], got["migrating_s"]) == (67.5, 20.0, 10.0, 2.5)
    assert (got["time_slices"], got["rates_before_switch"], got["move_pauses_s"]) == (1, [32.5, 30.1], [1.93])
    assert got["packing_trials"] == [{"at": 160.0, "verdict": "kept", "gain": 1.62, "packed_rate": 15.7,
                                      "alone_rate": 19.4}]
    said = dict(lines(got))
    assert said["Packing"] == "1 trial(s): kept at 1.62x of time-slicing; it ran 15.7 packed vs 19.4 alone"
    assert said["Moves"] == "1, training paused 1.93s"
    assert said["Time"].startswith("running 1m07s, suspended 20s (1 suspension:")


def test_only_a_moves_own_end_counts_as_a_move_not_carried_out() -> None:
    """A move that did not move the job is told by its job.migration event's first word (a phase
    of live_migration.ENDED_UNMOVED, or "not started"); an event that begins with a server's name
    (its helper moved mid-stream) is none, even when that name begins so (`failed-over-2`, a
    valid server name): it counted as one more move not carried out."""
    job = common_pb2.Job(id="j-b", spec=common_pb2.JobSpec(gpus=1), submitted_at=100.0, finished_at=200.0)
    events = [
        _event(110.0, "job.state", "QUEUED -> RUNNING: placed on n1 [0]"),
        _event(120.0, "job.migration", "failed-over-2's helper moved from 10.0.0.7:7070 to 10.0.0.8:7070 "
                                       "meanwhile: the checkpoint went to its old address (refused)"),
        _event(121.0, "job.migration", "restarted_at_source 0.812s (the destination refused it)"),
        _event(130.0, "job.migration", "not started (unpack onto idle GPUs; to n2/0): its runtime is gone"),
    ]
    assert sharing(job, events)["moves_not_done"] == ["restarted_at_source", "not started"]


def test_a_moves_pre_warm_while_the_job_trains_on_is_said_as_such() -> None:
    """`gandiva demo`'s solo-gs: three moves, MIGRATING 10, 22 and 30 s while each copy
    pre-warmed, training paused 0.10, 0.53 and 0.23 s; its log counted 1,115 mini-batches over
    the 22 s one. Sharing read "moving 62.2s" as if it lost a minute: now it says how much of it
    the job trained on at its source. Not counted: a suspended job's move (it does not train), a
    move cut short by the job's return to the queue (when it stopped is not known)."""
    job = common_pb2.Job(id="j-b", spec=common_pb2.JobSpec(gpus=1), submitted_at=100.0)
    events = [
        _event(100.0, "job.state", "QUEUED -> RUNNING: placed on n1 [0]"),
        _event(110.0, "job.state", "RUNNING -> MIGRATING: make room: n1 -> n2 (it ran 31.6 mini-batches/s)"),
        _event(120.0, "job.state", "MIGRATING -> RUNNING: migrated to n2 at step 1342 (training paused 0.10s)"),
        _event(130.0, "job.state", "RUNNING -> SUSPENDED: time slice of 8s over (step 1600)"),
        _event(140.0, "job.state", "SUSPENDED -> MIGRATING: lower the height: n2 -> n1"),
        _event(150.0, "job.state", "MIGRATING -> SUSPENDED: migrated to n1 at step 1600"),
        _event(160.0, "job.state", "SUSPENDED -> RUNNING: its turn"),
        _event(170.0, "job.state", "RUNNING -> MIGRATING: GPUs idle for 6s: n1 -> n1"),
        _event(175.0, "job.state", "MIGRATING -> QUEUED: its server n1 is down"),
        _event(180.0, "job.state", "QUEUED -> RUNNING: placed on n2 [0]"),
        _event(190.0, "job.state", "RUNNING -> MIGRATING: GPUs idle for 18s: n2 -> n2 (it ran 30.7 mini-batches/s)"),
    ]
    got = sharing(job, events, now=196.0)
    assert got["migrating_s"] == 10 + 10 + 5 + 6
    assert round(got["migrating_training_s"], 6) == 9.9 + 6  # the first move less its pause; the one under way
    assert dict(lines(got))["Time"].endswith("moving 31.0s (training on for 15.9s of it, while its copy pre-warmed)")
    events.append(_event(200.0, "job.state", "MIGRATING -> KILLED: the demo's story is over"))
    assert round(sharing(job, events, now=300.0)["migrating_training_s"], 6) == 9.9 + 10
    only_suspended_moved = dict(lines(sharing(job, events[3:7], now=165.0)))["Time"]
    assert only_suspended_moved.endswith("moving 10.0s"), only_suspended_moved
