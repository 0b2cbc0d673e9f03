"""The accounting of `gandiva get usage` (scheduler/observe/usage.py) on made-up histories:
each job's time in each state cut to the period, from its state changes at or after the
period's start only (tests/scheduler/cli/test_cli_usage.py has the live case)."""

from __future__ import annotations

import pytest

from scheduler.errors import InvalidArgument
from scheduler.observe.usage import (
    JobFacts,
    check_period,
    job_usage,
    running_stretches,
    shared_out,
    summarise,
)

H = 3600.0


def job(id: str = "j-1", user: str = "alice", gpus: int = 2, state: str = "SUCCEEDED", submitted: float = 0.0,
        started: float = 0.0, finished: float = 0.0) -> JobFacts:
    return JobFacts(id, id, user, gpus, state, submitted, started, finished)


# Submitted at 0, queued 2 h, ran 3 h, suspended 1 h, ran 1 h more, succeeded at 7 h.
HISTORY = [("QUEUED", "RUNNING", 2 * H), ("RUNNING", "SUSPENDED", 5 * H), ("SUSPENDED", "RUNNING", 6 * H),
           ("RUNNING", "SUCCEEDED", 7 * H)]
DONE = job(started=2 * H, finished=7 * H)


def changes_from(since: float) -> list[tuple[str, str, float]]:
    """What the database query hands over: the changes at or after the period's start."""
    return [c for c in HISTORY if c[2] >= since]


def test_a_whole_history_inside_the_period_counts_each_state_once() -> None:
    u = job_usage(DONE, changes_from(0), 0, 10 * H)
    assert (u.jobs, u.gpu_seconds, u.queued_seconds, u.suspended_seconds) == (1, 2 * 4 * H, 2 * H, 1 * H)
    assert (u.started, u.wait_seconds, u.ended, u.waiting, u.state) == (1, 2 * H, 1, 0, "SUCCEEDED")


def test_a_period_that_cuts_the_history_counts_only_its_part() -> None:
    """From 3 h to 5.5 h: it was RUNNING at 3 h (the from-state of its first change after),
    ran until 5 h, then was suspended; it first started before the period (no wait counted)."""
    u = job_usage(DONE, changes_from(3 * H), 3 * H, 5.5 * H)
    assert (u.gpu_seconds, u.queued_seconds, u.suspended_seconds) == (2 * 2 * H, 0, 0.5 * H)
    assert (u.started, u.ended, u.state) == (0, 0, "SUSPENDED")


def test_a_period_before_its_first_start_shows_it_waiting() -> None:
    """Until 1 h it had waited 1 h, never started: WAITING, not STARTED."""
    u = job_usage(DONE, changes_from(0), 0, 1 * H)
    assert (u.queued_seconds, u.gpu_seconds, u.waiting, u.waiting_max_seconds, u.started) == (H, 0, 1, H, 0)
    assert u.state == "QUEUED"


def test_a_job_with_no_change_in_the_period_is_in_its_state_now_throughout() -> None:
    running = job(state="RUNNING", started=2 * H)
    u = job_usage(running, [], 10 * H, 12 * H)
    assert (u.gpu_seconds, u.started, u.state) == (2 * 2 * H, 0, "RUNNING")


def test_jobs_outside_the_period_count_nothing() -> None:
    assert job_usage(DONE, changes_from(8 * H), 8 * H, 9 * H).jobs == 0  # ended before
    assert job_usage(job(state="QUEUED", submitted=11 * H), [], 8 * H, 10 * H).jobs == 0  # submitted after


def test_users_are_summed_most_gpu_time_first() -> None:
    rows = [job_usage(DONE, changes_from(0), 0, 10 * H),
            job_usage(job("j-2", "bob", 1, "QUEUED", submitted=1 * H), [], 0, 10 * H),
            job_usage(job("j-3", "bob", 1, "RUNNING", submitted=0, started=0.5 * H),
                      [("QUEUED", "RUNNING", 0.5 * H)], 0, 10 * H)]
    report = summarise(rows, 0, 10 * H, by_job=True, limit=2)
    assert [(u.user, u.jobs, u.gpu_seconds) for u in report.users] == [("bob", 2, 9.5 * H), ("alice", 1, 8 * H)]
    bob = report.users[0]
    assert (bob.queued_seconds, bob.started, bob.wait_seconds, bob.waiting, bob.waiting_max_seconds) == \
        (9 * H + 0.5 * H, 1, 0.5 * H, 1, 9 * H)
    assert (report.total.jobs, report.total.gpu_seconds) == (3, 17.5 * H)
    assert [j.job_id for j in report.jobs] == ["j-3", "j-1"] and report.jobs_not_listed == 1


@pytest.mark.parametrize(("since", "until", "field"), [(0, 0, "since"), (float("nan"), 0, "since"),
                                                      (5 * H, 4 * H, "since"), (20 * H, 0, "since"),
                                                      (1, float("nan"), "until")])
def test_an_empty_or_reversed_period_is_refused_naming_it(since: float, until: float, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_period(since, until, now=10 * H)
    assert refused.value.field == field


def test_an_end_after_now_is_now() -> None:
    assert check_period(1 * H, 99 * H, now=10 * H) == (1 * H, 10 * H)


def test_an_answer_holds_what_a_client_takes_and_counts_the_rest() -> None:
    """25,000 users of 128-byte names were 4.4 MB, 10,000 job rows of 256-byte names 9.3 MB:
    `gandiva get usage` failed "Received message larger than max (4425078 vs. 4194304)"."""
    from scheduler.api import paging
    from scheduler.api.scheduler_api import _within_bytes
    from scheduler.observe.usage import Usage

    rows = [Usage(user="u" * 128, job_id=f"j-{k:010x}", name="n" * 256, jobs=1, gpu_seconds=k) for k in range(10000)]
    kept, used = _within_bytes(rows, paging.PAGE_BYTES)
    assert 0 < len(kept) < len(rows) and used <= paging.PAGE_BYTES < used + kept[0].ByteSize() + 1
    assert [m.job_id for m in kept] == [r.job_id for r in rows[:len(kept)]]


def test_gpu_time_from_the_gpus_held_counts_a_grown_jobs_gpus_and_splits_a_packed_one() -> None:
    """Since session 49 (HELD-H): GPU-HOURS counts the GPUs asked for, so a 1-GPU job grown to
    two counted one, and two jobs packed on one GPU counted it twice. From the GPUs' history,
    each stretch of a GPU counts once, shared by the jobs running on it then."""
    assert running_stretches(DONE, changes_from(3 * H), 3 * H, 10 * H) == [(3 * H, 5 * H), (6 * H, 7 * H)]
    # j-a ran on a/0 from 0 to 10 and on a/1 too from 4 (grown); j-b ran on a/0 from 6 to 8 (packed).
    held, busy = shared_out({("a", 0): [(0.0, 10.0, "j-a"), (6.0, 8.0, "j-b")], ("a", 1): [(4.0, 10.0, "j-a")]})
    assert held == {"j-a": 10.0 - 1.0 + 6.0, "j-b": 1.0} and busy == 16.0
    # Time-sliced (one at a time) on one GPU: each its own stretches, nothing split.
    held, busy = shared_out({("a", 0): [(0.0, 5.0, "j-a"), (5.0, 9.0, "j-b"), (9.0, 10.0, "j-a")]})
    assert held == {"j-a": 6.0, "j-b": 4.0} and busy == 10.0


def test_a_move_of_a_running_job_is_gpu_time_it_trained() -> None:
    """A running job moved trains on at its source while its copy pre-warms (10-30 s a move in
    `gandiva demo`). Its GPU time (GPU-H, HELD-H, the cluster's busy) left that out: a job that
    never stopped but for a 0.2-s pause read 3 h of GPU time in 4 h on its GPU. A suspended
    job's move, and one that ends in the queue (its server lost), are not counted; a period
    that begins in a move does not know what it began from."""
    moved = [("QUEUED", "RUNNING", 0.0), ("RUNNING", "MIGRATING", 1 * H), ("MIGRATING", "RUNNING", 2 * H),
             ("RUNNING", "SUSPENDED", 3 * H), ("SUSPENDED", "MIGRATING", 4 * H), ("MIGRATING", "SUSPENDED", 5 * H),
             ("SUSPENDED", "RUNNING", 6 * H), ("RUNNING", "MIGRATING", 7 * H), ("MIGRATING", "QUEUED", 8 * H),
             ("QUEUED", "RUNNING", 9 * H), ("RUNNING", "MIGRATING", 10 * H), ("MIGRATING", "SUCCEEDED", 11 * H)]
    facts = job(gpus=1, started=0.0, finished=11 * H)
    u = job_usage(facts, moved, 0, 12 * H)
    assert (u.gpu_seconds, u.migrating_seconds) == ((4 + 2) * H, 4 * H)  # (running 4 h, moves from running 2 h)
    assert running_stretches(facts, moved, 0, 12 * H) == [(0.0, 1 * H), (1 * H, 2 * H), (2 * H, 3 * H), (6 * H, 7 * H),
                                                          (9 * H, 10 * H), (10 * H, 11 * H)]
    assert job_usage(facts, moved, 0, 12 * H, moves_train=False).gpu_seconds == 4 * H  # (describe's Sharing: running)
    assert job_usage(facts, moved, 0, 10.5 * H).gpu_seconds == 5.5 * H  # (a move under way at the period's end)
    assert job_usage(facts, [c for c in moved if c[2] >= 1.5 * H], 1.5 * H, 2 * H).gpu_seconds == 0.0


async def test_one_users_report_splits_a_gpu_shared_with_another_users_job(sqlite_url: str) -> None:
    """alice's job packed on one GPU with bob's for the whole period: everyone's report gives
    her job half the GPU's time; her own (`--user alice`, and a user's token) gave it all, bob's
    job being left out of the split with his rows."""
    import time

    from protos.gandiva.v1 import common_pb2, helper_pb2
    from scheduler.core import SchedulerCore
    from scheduler.observe import usage
    from scheduler.state import migrate, repo
    from scheduler.state.db import make_engine

    engine = make_engine(sqlite_url)
    await migrate.upgrade(engine)
    core = SchedulerCore(engine)
    start = time.time() + 10.0  # after the submissions' own state changes
    try:
        await core.register_server(helper_pb2.RegisterServerRequest(name="b", gpus=[common_pb2.Gpu(index=0)]))
        ids = {}
        for who in ("alice", "bob"):
            ids[who] = (await core.submit(common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
            async with core.tx() as s:
                j = await repo.get_job(s, ids[who])
                j.user = who
                await repo.place(s, j, [("b", 0)], "i", start, "placed")

        async def read(user: str | None) -> dict[str, float]:
            got = await core.read_sync(lambda s: usage.report(s, start, start + 100.0, user, True, 10))
            return {row.job_id: row.held_gpu_seconds for row in got.jobs}

        assert (await read(None))[ids["alice"]] == pytest.approx(50.0)
        assert await read("alice") == {ids["alice"]: pytest.approx(50.0)}
    finally:
        await core.dispose()
        await engine.dispose()


def test_a_start_far_past_any_date_is_refused_in_a_message_a_person_reads() -> None:
    """`GetUsage(since=1e308)` and `ListPlacements(since=1e308)` were refused with the
    start written out in 309 digits (a 417-character message)."""
    with pytest.raises(InvalidArgument) as refused:
        check_period(1e308, 0, now=10 * H)
    assert "1e+308" in str(refused.value) and len(str(refused.value)) < 160, str(refused.value)
