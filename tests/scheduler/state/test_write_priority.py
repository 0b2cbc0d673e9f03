"""A user's writes before the bulk ones (benchmarks/control_plane_load.py): on SQLite's
writer thread a submission runs ahead of queued heartbeats and progress batches, which
are never lost, starved or reordered; on PostgreSQL a submission is one statement, all
of it or nothing. Real threads, real SQLite files and PostgreSQL databases."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.lifecycle import JobState
from scheduler.state import repo
from scheduler.state.db import WriteQueue
from scheduler.state.models import Event, Job, MultiJob, Transition

SPEC = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
KINDS = st.lists(st.sampled_from(["urgent", "bulk", "barrier"]), min_size=1, max_size=40)


def _run_queued(kinds: list[str]) -> tuple[list[int], list[int]]:
    """Queue writes of these kinds while the writer is busy, then let it go: (the order
    they ran in, their results)."""
    q = WriteQueue("test-writer")
    gate, busy = threading.Event(), threading.Event()
    ran: list[int] = []
    try:
        # The writer must be inside this (bulk) write before the others are queued: else
        # urgent ones queued first run ahead of it, and it would end their run unseen.
        q.submit(lambda: busy.set() or gate.wait())
        busy.wait(timeout=10)
        futures = [q.submit(lambda i=i: ran.append(i) or i, urgent=k == "urgent", barrier=k == "barrier")
                   for i, k in enumerate(kinds)]
        gate.set()
        results = [f.result(timeout=10) for f in futures]
    finally:
        gate.set()
        q.shutdown()
    return ran, results


@settings(max_examples=40, deadline=None)
@given(KINDS)
def test_urgent_writes_go_first_and_each_class_keeps_its_order(kinds: list[str]) -> None:
    ran, results = _run_queued(kinds)
    assert results == list(range(len(kinds)))  # every write ran, once, and answered
    assert sorted(ran) == list(range(len(kinds)))
    urgent = [i for i in ran if kinds[i] == "urgent"]
    bulk = [i for i in ran if kinds[i] != "urgent"]
    assert urgent == sorted(urgent) and bulk == sorted(bulk)
    pos = {i: n for n, i in enumerate(ran)}
    for n, i in enumerate(ran):
        if kinds[i] == "barrier":  # after everything queued before it, of either class
            assert all(pos[j] < n for j in range(i))
        elif kinds[i] == "bulk" and any(kinds[j] == "urgent" for j in ran[n:]):
            # A bulk write ran while urgent ones waited: only after URGENT_RUN of them.
            streak = 0
            while n - streak > 0 and kinds[ran[n - streak - 1]] == "urgent":
                streak += 1
            assert streak == WriteQueue.URGENT_RUN


@pytest.mark.parametrize("producers", [3])
def test_a_bulk_write_is_not_starved_by_a_stream_of_urgent_ones(producers: int) -> None:
    q = WriteQueue("test-writer")
    stop = threading.Event()
    urgent_done = [0]

    def urgent_write() -> None:
        time.sleep(0.001)
        urgent_done[0] += 1

    def produce() -> None:
        while not stop.is_set():
            f = q.submit(urgent_write, urgent=True)
            f.result(timeout=10)  # each producer keeps one urgent write queued at a time

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(producers)]
    try:
        for t in threads:
            t.start()
        while urgent_done[0] < 10:
            time.sleep(0.005)
        bulk = [q.submit(lambda i=i: i) for i in range(5)]
        assert [f.result(timeout=5) for f in bulk] == list(range(5))
        assert not stop.is_set()  # the urgent stream never stopped meanwhile
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        q.shutdown()


@pytest.fixture
def core(any_core: SchedulerCore) -> SchedulerCore:
    """Each test below runs on SQLite, then on PostgreSQL."""
    return any_core


@pytest.mark.parametrize("queued", [12])
async def test_a_submission_overtakes_queued_bulk_writes_and_is_readable_at_once(
    core: SchedulerCore, queued: int
) -> None:
    gate = threading.Event()
    done: list[int] = []

    def bulk(i: int):  # type: ignore[no-untyped-def]
        def write(conn) -> None:  # type: ignore[no-untyped-def]
            if i == 0:
                gate.wait(10)
            time.sleep(0.03)
            done.append(i)
        return write

    writes = [asyncio.create_task(core.write_sync(bulk(i))) for i in range(queued)]
    await asyncio.sleep(0.05)  # the first bulk write holds the writer
    sub = asyncio.create_task(core.submit(SPEC))
    await asyncio.sleep(0.05)
    gate.set()
    job = (await sub).job
    assert len(done) < queued  # it did not wait for the queue of bulk writes
    assert (await core.get_job(job.id)).job.state == JobState.QUEUED.value
    await asyncio.gather(*writes)
    # All of them; on SQLite's one writer in the order they were made (PostgreSQL runs
    # concurrent transactions side by side).
    assert (done if core._writer is not None else sorted(done)) == list(range(queued))


async def _count(core: SchedulerCore, model) -> int:  # type: ignore[no-untyped-def]
    async with core.tx(read=True) as s:
        return int(await s.scalar(select(func.count()).select_from(model)) or 0)


async def test_a_submission_that_fails_half_way_leaves_nothing(
    core: SchedulerCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-job whose second member collides with an existing job id: refused whole
    (no member, no multi-job, no transition or event), on both databases."""
    taken = (await core.submit(SPEC)).job.id
    before = {m: await _count(core, m) for m in (Job, MultiJob, Transition, Event)}
    ids = iter(["mj-new", "j-fresh", taken])
    monkeypatch.setattr(repo, "new_id", lambda prefix: next(ids))
    with pytest.raises(sa_exc.IntegrityError):
        await core.submit_multi("dup", [SPEC, SPEC])
    assert {m: await _count(core, m) for m in before} == before


async def test_a_multi_job_too_large_for_one_statement_is_stored_whole(core: SchedulerCore) -> None:
    n = repo.MAX_STATEMENT_PARAMS // 40 + 10  # past one statement's parameters on PostgreSQL
    jobs = [core._job_row(SPEC, 0.0, None) for _ in range(n)]
    assert repo.job_insert_statement(jobs, 0.0) is None
    mj, details = await core.submit_multi("big", [SPEC] * n)
    async with core.tx(read=True) as s:
        stored = await s.scalar(select(func.count()).select_from(Job).where(Job.multi_job_id == mj))
    assert stored == n == len(details)
