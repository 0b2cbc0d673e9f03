"""SQLite's writer thread under concurrent writes (benchmarks/control_plane_load.py):
writes queue on the thread and run back to back, but still in the order they were
made, and an ORM write transaction never overtakes writes made before it nor lets
later ones in while it runs. Real SQLite files, real threads."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from sqlalchemy import func, select, update

from protos.gandiva.v1 import common_pb2
from scheduler.core import SchedulerCore
from scheduler.state.models import Job

SPEC = common_pb2.JobSpec(command=["python", "t.py"], gpus=1)


async def _count(core: SchedulerCore) -> int:
    async with core.tx() as s:
        return int(await s.scalar(select(func.count(Job.id))) or 0)


@pytest.mark.parametrize("queued", [1, 60])
async def test_a_transaction_sees_every_write_queued_before_it(core: SchedulerCore, queued: int) -> None:
    before = await _count(core)
    subs = [asyncio.create_task(core.submit(SPEC)) for _ in range(queued)]
    await asyncio.sleep(0)  # each submission is now queued on the writer thread
    counted = asyncio.create_task(_count(core))
    await asyncio.gather(*subs)
    assert await counted == before + queued


@pytest.mark.parametrize("writes", [1, 30])
async def test_writes_made_during_a_transaction_wait_for_it_and_see_its_change(
    core: SchedulerCore, writes: int
) -> None:
    job_id = (await core.submit(SPEC)).job.id
    seen: list[int] = []

    def read_priority(conn) -> None:  # type: ignore[no-untyped-def]
        seen.append(conn.execute(select(Job.priority).where(Job.id == job_id)).scalar_one())

    async with core.tx() as s:
        await s.execute(update(Job).where(Job.id == job_id).values(priority=7))
        waiting = [asyncio.create_task(core.write_sync(read_priority)) for _ in range(writes)]
        await asyncio.sleep(0.2)
        assert seen == []  # held back while the transaction runs
    await asyncio.gather(*waiting)
    assert seen == [7] * writes


async def test_concurrent_submissions_and_transactions_all_land(core: SchedulerCore) -> None:
    """Submissions (writer thread) and priority changes (ORM transactions) interleaved:
    every submission stored once, every priority change applied, none refused."""
    before = await _count(core)
    first = [(await core.submit(SPEC)).job.id for _ in range(10)]
    work = [core.submit(SPEC) for _ in range(80)]
    work += [core.set_priority(job_id, 100 + i) for i, job_id in enumerate(first)]
    await asyncio.gather(*work)
    assert await _count(core) == before + 90
    for i, job_id in enumerate(first):
        assert (await core.get_job(job_id)).job.priority == 100 + i


def test_the_serving_collector_still_frees_garbage_in_cycles() -> None:
    """quiet_gc (run by `gandiva scheduler`) freezes start-up objects and collects young
    ones less often; garbage in reference cycles is still freed (in a process of its own).
    quick_switches shortens the interpreter's switch interval there."""
    code = (
        "import gc, sys, weakref\n"
        "from scheduler.server import GC_YOUNG, SWITCH_INTERVAL_S, quick_switches, quiet_gc\n"
        "before = sys.getswitchinterval()\n"
        "quick_switches()\n"
        "assert sys.getswitchinterval() == SWITCH_INTERVAL_S < before, sys.getswitchinterval()\n"
        "quiet_gc()\n"
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()\n"
        "assert gc.get_threshold()[0] == GC_YOUNG\n"
        "class Node: pass\n"
        "refs = []\n"
        "for _ in range(GC_YOUNG * 3):\n"
        "    a, b = Node(), Node(); a.b, b.a = b, a; refs.append(weakref.ref(a))\n"
        "    del a, b\n"
        "alive = sum(r() is not None for r in refs)\n"
        "assert alive < GC_YOUNG * 2, alive  # collected along the way, without asking\n"
        "gc.collect()\n"
        "assert all(r() is None for r in refs)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("clients", [8])
def test_over_grpc_each_submission_is_readable_at_once_amid_other_writes(scheduler_server, clients: int) -> None:  # type: ignore[no-untyped-def]
    """Real gRPC, real SQLite file: clients submit and read back at once (the read
    runs on a reader thread, the write on the writer thread) while others change
    priorities (ORM transactions): every job is found, with its own priority."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(scheduler_server.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)

        def client(i: int) -> list[str]:
            ids = []
            for k in range(15):
                job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=SPEC), timeout=30).job
                got = stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id), timeout=30)
                assert got.id == job.id and got.state == common_pb2.JOB_STATE_QUEUED
                if i % 2:
                    stub.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=k + 1), timeout=30)
                    assert stub.GetJob(scheduler_pb2.GetJobRequest(id=job.id), timeout=30).spec.priority == k + 1
                ids.append(job.id)
            return ids

        with ThreadPoolExecutor(clients) as pool:
            ids = [j for got in pool.map(client, range(clients)) for j in got]
        listed = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=1000)).jobs
        assert sorted(j.id for j in listed) == sorted(ids) and len(set(ids)) == clients * 15
