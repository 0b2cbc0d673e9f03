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


def test_why_each_suspend_or_move_and_what_came_of_it() -> None:
    """"Why did my job move, and did it help?": `gandiva demo`'s solo-gs, its state changes as
    its events said them (s52). Each suspend or move with the scheduler's reason, what followed
    (resumed how much later and why; moved, in how long, with the pause it cost), and the rates
    its runtime measured before and after: its grow onto two virtual GPUs made it slower (32.0 ->
    26.0/s), which no other view said. Also: a suspended job's move, a move rolled back, one cut
    short by a lost server, one under way now."""
    from scheduler.cli.sharing import decision_rows
    from scheduler.observe.why import decisions

    solo_gs = [
        (40.0, "RUNNING -> SUSPENDED: time-slice with new job j-1e (step 0)"),
        (48.5, "SUSPENDED -> RUNNING: its turn in the time-slice group (step 0)"),
        (57.0, "RUNNING -> SUSPENDED: time slice of 8s over (step 252) (it ran 29.8 mini-batches/s)"),
        (59.6, "SUSPENDED -> RUNNING: trial: packed beside j-1e, utilization 0.42 + 0.42 (step 252)"),
        (84.0, "RUNNING -> MIGRATING: make room for job j-7e: empty node-1: node-1 -> node-2 (it ran 31.6 mini-batches/s)"),
        (94.0, "MIGRATING -> RUNNING: migrated to node-2 at step 1342 (training paused 0.10s)"),
        (109.0, "RUNNING -> MIGRATING: GPUs idle for 6s: node-2 -> node-2 (it ran 32.0 mini-batches/s)"),
        (131.4, "MIGRATING -> RUNNING: migrated to node-2 at step 2457 (training paused 0.53s)"),
        (132.0, "RUNNING -> MIGRATING: job j-a7 needs GPUs: node-2 -> node-2 (it ran 26.0 mini-batches/s)"),
        (161.8, "MIGRATING -> RUNNING: migrated to node-2 at step 3349 (training paused 0.23s)"),
        (205.0, "RUNNING -> MIGRATING: GPUs idle for 18s: node-2 -> node-2 (it ran 30.7 mini-batches/s)"),
        (205.1, "MIGRATING -> KILLED: the demo's story is over"),
    ]
    got = decisions(list(reversed(solo_gs)), now=300.0)  # (in any order: sorted by time)
    assert [(d["decision"], d["why"], d["outcome"], d["rate_before"], d["rate_after"]) for d in got] == [
        ("suspend", "time-slice with new job j-1e (step 0)", ("resumed 8.5s later: its turn in the time-slice "
                                                          "group (step 0)"), None, 29.8),
        ("suspend", "time slice of 8s over (step 252)", ("resumed 2.6s later: trial: packed beside j-1e, "
                                                     "utilization 0.42 + 0.42 (step 252)"), 29.8, 31.6),
        ("move", "make room for job j-7e: empty node-1: node-1 -> node-2",
         "moved 10.0s later (its copy pre-warmed meanwhile), training paused 0.10s", 31.6, 32.0),
        ("move", "GPUs idle for 6s: node-2 -> node-2", "moved 22.4s later (its copy pre-warmed meanwhile), training paused 0.53s",
         32.0, 26.0),
        ("move", "job j-a7 needs GPUs: node-2 -> node-2", "moved 29.8s later (its copy pre-warmed meanwhile), training paused 0.23s",
         26.0, 30.7),
        ("move", "GPUs idle for 18s: node-2 -> node-2", "the job ended (KILLED) 0.1s later, before it moved", 30.7, None)]
    assert decision_rows(got)[3][1:] == ["move", "GPUs idle for 6s: node-2 -> node-2",
                                         ("moved 22.4s later (its copy pre-warmed meanwhile), training paused 0.53s; ran 32.0/s "
                                          "before, 26.0/s after")]
    others = [
        (10.0, "RUNNING -> SUSPENDED: time slice of 60s over (step 9) (it ran 2.5 mini-batches/s)"),
        (20.0, "SUSPENDED -> MIGRATING: lower the height: n1 -> n2"),
        (44.0, "MIGRATING -> SUSPENDED: migrated to n2 at step 9"),
        (50.0, "SUSPENDED -> RUNNING: its turn"),
        (60.0, "RUNNING -> MIGRATING: defragment: n2 -> n3 (it ran 3.0 mini-batches/s)"),
        (61.0, "MIGRATING -> RUNNING: stayed_at_source: pre-warm at n3 failed: exited with code 1"),
        (70.0, "RUNNING -> MIGRATING: defragment: n2 -> n3 (it ran 3.5 mini-batches/s)"),
        (75.0, "MIGRATING -> QUEUED: its server n2 went down"),
        (80.0, "QUEUED -> RUNNING: Algorithm 1: unallocated on n1/0"),
        (90.0, "RUNNING -> MIGRATING: GPUs idle for 5s: n1 -> n1 (it ran 4.0 mini-batches/s)"),
    ]
    assert [(d["decision"], d["outcome"], d["rate_after"]) for d in decisions(others, now=100.0, rate_now=4.2)] == [
        ("suspend", "moved while suspended, 10.0s later", None),
        ("move", "moved 24.0s later and waits its turn there", None),
        ("move", "not moved: it stayed at its source 1.0s later", 3.5),
        ("move", "back to the queue 5.0s later: its server n2 went down", None),
        ("move", "under way for 10.0s", None)]
    # Resumed and running now: its rate after is the one it runs at.
    assert decisions(solo_gs[:2], now=55.0, rate_now=31.2)[-1]["rate_after"] == 31.2
    assert decisions(solo_gs[:1], now=55.0, rate_now=31.2)[-1]["outcome"] == "suspended now for 15.0s"
    # Sent back to the queue (its server lost, a park), and what followed.
    lost = [(0.0, "QUEUED -> RUNNING: Algorithm 1: unallocated on n2/0"),
            (62.0, "RUNNING -> QUEUED: its server n2 went down"),
            (62.1, ("QUEUED -> RUNNING: Algorithm 1: oversubscribe on n1/1; no checkpoint: it starts over, its step "
                   "count with it (it was at 626)")),
            (93.0, "RUNNING -> SUSPENDED: time slice of 8s over (step 0) (it ran 16.1 mini-batches/s)"),
            (95.0, "SUSPENDED -> QUEUED: parked: a larger job waits")]
    assert [(d["decision"], d["outcome"], d["rate_after"]) for d in decisions(lost, now=100.0)] == [
        ("requeue", ("placed again 0.1s later: Algorithm 1: oversubscribe on n1/1; no checkpoint: it starts over, its "
                    "step count with it (it was at 626)"), 16.1),
        ("suspend", "back to the queue 2.0s later: parked: a larger job waits", None),
        ("requeue", "queued now for 5.0s", None)]


def test_why_a_move_rolled_back_without_its_outcome_word_is_not_moved() -> None:
    """A suspended job's move that stayed at its source says its reason alone (then "still
    suspended"), and one rolled back after a scheduler restart says so in words of its own:
    neither moved the job, which the "Why" table said it had ("moved 1.0s later")."""
    from scheduler.observe.why import decisions

    stayed = [(10.0, "RUNNING -> SUSPENDED: time slice of 60s over (step 9)"),
              (20.0, "SUSPENDED -> MIGRATING: lower the height: n1 -> n2"),
              (21.0, "MIGRATING -> RUNNING: pre-warm at n2 failed: exited with code 1"),
              (21.0, "RUNNING -> SUSPENDED: still suspended")]
    assert [(d["decision"], d["outcome"]) for d in decisions(stayed, now=30.0)] == [
        ("suspend", "a move began 10.0s later"),  # (it was not moved)
        ("move", "not moved: it stayed at its source 1.0s later; suspended now for 9.0s")]  # (no "still suspended" suspend)
    resumed = [*stayed, (40.0, "SUSPENDED -> RUNNING: its turn"),
               (50.0, "RUNNING -> SUSPENDED: time slice of 60s over (step 20) (it ran 3.0 mini-batches/s)")]
    assert [(d["decision"], d["outcome"], d["rate_after"]) for d in decisions(resumed, now=55.0)][1:] == [
        ("move", "not moved: it stayed at its source 1.0s later; still suspended, resumed 19.0s later: its turn", 3.0),
        ("suspend", "suspended now for 5.0s", None)]
    restarted = [(60.0, "RUNNING -> MIGRATING: defragment: n2 -> n3 (it ran 3.0 mini-batches/s)"),
                 (70.0, "MIGRATING -> RUNNING: migration to n3 rolled back after a scheduler restart (phase prewarm)")]
    assert decisions(restarted, now=80.0)[0]["outcome"] == "not moved: it stayed at its source 10.0s later"
