"""The GPUs' history (gpu_holds, scheduler/observe/holds.py): the per-GPU timeline drawn from
it after a restart, the GPUs of the decisions read back, a period's checks (what each
placement records: tests/scheduler/state/test_gpu_holds.py). Before session 49 the placements table kept only the present: the
dashboard's timeline started empty after a restart and no command answered the question."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidArgument
from scheduler.observe import holds
from scheduler.observe.holds import Change, Hold
from scheduler.observe.metrics import Timeline


def test_a_period_is_checked_naming_the_field() -> None:
    assert holds.check_period(10.0, 0.0, 50.0) == (10.0, 50.0)
    assert holds.check_period(10.0, 99.0, 50.0) == (10.0, 50.0)  # past now: now
    for since, until, field in ((0.0, 0.0, "since"), (float("nan"), 0.0, "since"), (60.0, 0.0, "since"),
                                (10.0, float("inf"), "until"), (20.0, 15.0, "since")):
        with pytest.raises(InvalidArgument) as err:
            holds.check_period(since, until, 50.0)
        assert err.value.field == field, (since, until)
    with pytest.raises(InvalidArgument, match=r"since: 1970-01-01 00:00:20 UTC is after the period's end "
                                              r"\(1970-01-01 00:00:15 UTC\)"):
        holds.check_period(20.0, 15.0, 50.0)  # said as times, not unix seconds


def test_the_timeline_is_drawn_again_as_it_was_live() -> None:
    # j1 runs on a/0 from 10, j2 joins it at 20 (time-sliced: j1 suspended at 30, j2 runs),
    # j1 leaves at 50 (requeued); j3 holds a/1 from before the window, moves at 40 to b/0
    # (held from its arrival at 45).
    # j4, suspended on b/1, moves at 40 to a/2.
    held = [Hold("j1", "a", 0, 10.0, 50.0), Hold("j2", "a", 0, 20.0, None), Hold("j3", "a", 1, 0.0, 45.0),
            Hold("j3", "b", 0, 45.0, None), Hold("j4", "b", 1, 0.0, 45.0), Hold("j4", "a", 2, 45.0, None)]
    changes = [Change("j1", 10.0, "QUEUED", "RUNNING"), Change("j2", 20.0, "QUEUED", "SUSPENDED"),
               Change("j1", 30.0, "RUNNING", "SUSPENDED"), Change("j2", 30.0, "SUSPENDED", "RUNNING"),
               Change("j3", 40.0, "RUNNING", "MIGRATING"), Change("j4", 40.0, "SUSPENDED", "MIGRATING"),
               Change("j3", 45.0, "MIGRATING", "RUNNING"), Change("j4", 45.0, "MIGRATING", "SUSPENDED"),
               Change("j1", 50.0, "SUSPENDED", "QUEUED")]
    segs = holds.segments(held, changes, {"j1": "QUEUED", "j2": "RUNNING", "j3": "RUNNING", "j4": "SUSPENDED"},
                          5.0, 60.0)
    assert segs["a/0"] == [[5.0, 10.0, [], [], []], [10.0, 20.0, ["j1"], [], []], [20.0, 30.0, ["j1"], ["j2"], []],
                           [30.0, 50.0, ["j2"], ["j1"], []], [50.0, 60.0, ["j2"], [], []]]
    # j3's state at the window's start is the from-state of its first change in it. Moved while
    # running, it trains on at its source while its copy pre-warms, as live (since session 53;
    # before, [40, 45] read migrating there); j4, moved suspended, does not.
    assert segs["a/1"] == [[5.0, 45.0, ["j3"], [], []], [45.0, 60.0, [], [], []]]
    assert segs["b/1"] == [[5.0, 40.0, [], ["j4"], []], [40.0, 45.0, [], [], ["j4"]], [45.0, 60.0, [], [], []]]
    assert segs["a/2"] == [[5.0, 40.0, [], [], []], [40.0, 45.0, [], [], ["j4"]], [45.0, 60.0, [], ["j4"], []]]
    # Its destination shows it moving from the move's start, as the live timeline does (the
    # policy's GPUs from then; checked against a live one over `gandiva demo`: 4,952 samples agree).
    assert segs["b/0"] == [[5.0, 40.0, [], [], []], [40.0, 45.0, [], [], ["j3"]], [45.0, 60.0, ["j3"], [], []]]
    # Put into the live timeline, the next round's snapshot carries the last bar on.
    t = Timeline()
    t.gpus.update(segs)
    assert t.export(0.0)["a/0"][-1] == {"t0": 50.0, "t1": 60.0, "running": ["j2"], "waiting": [], "migrating": []}


def test_a_decision_read_back_names_the_gpus_it_concerns() -> None:
    held = [Hold("j", "a", 0, 10.0, 50.0), Hold("j", "b", 2, 60.0, None), Hold("j", "b", 3, 60.0, None)]
    assert holds.gpus_of_decision(held, "place", 10.0) == ("a/0",)
    assert holds.gpus_of_decision(held, "suspend", 30.0) == ("a/0",)
    assert holds.gpus_of_decision(held, "migrate", 45.0) == ("b/2", "b/3")  # where it arrived
    assert holds.gpus_of_decision(held[:1], "migrate", 45.0) == ("a/0",)  # not arrived: where from
    assert holds.gpus_of_decision(held, "requeue", 50.0) == ("a/0",)
    assert holds.gpus_of_decision([], "place", 10.0) == ()  # before the history was kept


def test_a_grow_or_shrink_read_back_names_the_gpus_it_ended_on() -> None:
    """`gandiva demo`'s solo-gs (holds as its database had them): moved onto node-2/1 at 74,
    grown at 89 onto node-2/1,node-2/0 (arrived 111.98: node-2/0 begun, node-2/1 kept), shrunk
    at 112.77 to node-2/0 (arrived 142.54: node-2/1 ended, none begun). Live, the log said
    node-2/1,node-2/0 and node-2/0; read back after a restart, node-2/0 and node-2/1,node-2/0."""
    held = [Hold("j", "node-1", 0, 1.07, 74.2), Hold("j", "node-2", 1, 74.2, 142.54),
            Hold("j", "node-2", 0, 111.98, None)]
    assert holds.gpus_of_decision(held, "migrate", 64.18, 74.2) == ("node-2/1",)
    assert holds.gpus_of_decision(held, "migrate", 89.56, 111.98) == ("node-2/1", "node-2/0")
    assert holds.gpus_of_decision(held, "migrate", 112.77, 142.54) == ("node-2/0",)
    # Its end not known (still moving at the restart): as of the first holds begun after it.
    assert holds.gpus_of_decision(held, "migrate", 89.56) == ("node-2/1", "node-2/0")
    assert holds.gpus_of_decision(held, "migrate", 112.77) == ("node-2/1", "node-2/0")  # none: from


def test_an_answer_holds_what_a_client_takes_and_says_there_is_more() -> None:
    """10,000 placements of 256-byte job names, 128-byte users and 64-byte servers (the longest
    each may be) were 5.0 MB, more than a client takes (4 MiB): `get placements --limit 10000` would fail "Received message
    larger than max"; the answer stops at 2 MiB and says there is more."""
    from scheduler.api import paging
    from scheduler.api.scheduler_api import placements_pb

    rows = [Hold(f"j-{k:010x}", "s" * 64, k % 8, float(k), None, "n" * 256, "u" * 128, "running")
            for k in range(10000)]
    kept, cut = placements_pb(rows, None, paging.PAGE_BYTES)
    assert cut and 0 < len(kept) < len(rows) and sum(m.ByteSize() for m in kept) <= paging.PAGE_BYTES
    assert [m.job_id for m in kept] == [r.job_id for r in rows[:len(kept)]]
    # A user's view: another user's job is hidden-N, one number per job, the GPU still shown.
    shown, cut = placements_pb(rows[:3] + rows[:1], {rows[1].job_id}, paging.PAGE_BYTES)
    assert [(m.job_id, m.name, m.server[:1]) for m in shown] == [
        ("hidden-1", "", "s"), (rows[1].job_id, "n" * 256, "s"), ("hidden-2", "", "s"), ("hidden-1", "", "s")]
    assert not cut
