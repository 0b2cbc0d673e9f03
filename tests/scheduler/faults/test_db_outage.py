"""The database briefly unreachable: calls fail with UNAVAILABLE and a clear
message, and the service recovers by itself, without a restart."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


class TcpProxy:
    """A loopback TCP proxy that can cut every connection and refuse new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}
        await asyncio.gather(self._pipe(cr, sw), self._pipe(sr, cw))

    async def _open(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    def start(self) -> TcpProxy:
        self.thread.start()
        self._run(self._open())
        return self

    def cut(self) -> None:
        self._run(self._cut())

    def restore(self) -> None:
        self._run(self._open())


@pytest.fixture
def proxied_pg_url(pg_url: str) -> Iterator[tuple[str, TcpProxy]]:
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
    yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy
    proxy.loop.call_soon_threadsafe(proxy.loop.stop)


@pytest.mark.pg
def test_database_outage_gives_unavailable_then_recovers(proxied_pg_url, make_scheduler) -> None:  # type: ignore[no-untyped-def]
    url, proxy = proxied_pg_url
    sched = make_scheduler(url, tick_s=0.2)
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec())).job
        proxy.cut()
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "database unreachable" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.GetJob(scheduler_pb2.GetJobRequest(id=first.id), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        proxy.restore()
        second = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec()), timeout=30).job
        jobs = {j.id for j in stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs}
        # The submission that failed during the outage was not half-written.
        assert jobs == {first.id, second.id}


def _spec() -> common_pb2.JobSpec:
    return common_pb2.JobSpec(command=["python", "t.py"], gpus=1)
