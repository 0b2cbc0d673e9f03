"""An event watch whose client reads nothing (`WatchEvents` over a real socket): what the
scheduler keeps for it while gRPC waits for the client to make room."""

from __future__ import annotations

import gc

import grpc

from protos.gandiva.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler.state import repo
from scheduler.state.models import Event

EVENTS = 2000
MESSAGE = "m" * 4000  # 8 MB of events in all: more than any HTTP/2 window lets through unread


def _rows_alive() -> int:
    """This test's event rows still in memory (read from __dict__: no lazy load; other
    tests run in the same process may have left rows of their own)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Event) and o.__dict__.get("kind") == "test.flood")


def test_a_watch_nobody_reads_holds_no_database_rows(make_scheduler, sqlite_url, wait_for) -> None:  # type: ignore[no-untyped-def]
    """Each unread watch held the last batch it read as database rows (500 ORM objects)
    beside the messages made of them: 200 such watches took a real `gandiva scheduler`
    from 102 to 294-302 MB (about 1 MB a watch). It now keeps only the messages not yet
    sent: 149-178 MB (benchmarks/unread_watch_memory.py)."""
    sched = make_scheduler(sqlite_url)
    core = sched.server.core

    async def make_events() -> None:
        async with core.tx() as s:
            for i in range(EVENTS):
                repo.add_event(s, 1.0 + i, "test.flood", f"{i} {MESSAGE}")

    sched.call(make_events())
    with grpc.insecure_channel(sched.address) as channel:
        watch = scheduler_pb2_grpc.SchedulerStub(channel).WatchEvents(scheduler_pb2.WatchEventsRequest(after_id=0))
        try:
            first = next(watch)  # the watch has read its first batch; then its client reads no more
            assert first.kind == "test.flood" and first.message.startswith("0 ")
            wait_for(lambda: _rows_alive() == 0, 20)
            # Read again, it goes on where it was, in order and with nothing lost.
            rest = [next(watch) for _ in range(EVENTS - 1)]
            assert [e.message.split()[0] for e in rest] == [str(i) for i in range(1, EVENTS)]
        finally:
            watch.cancel()
