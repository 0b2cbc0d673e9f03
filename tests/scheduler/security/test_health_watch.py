"""The health service over a real socket, as a load balancer uses it: no token needed."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def test_health_watch_answers_without_a_token_and_is_bounded(make_scheduler, sqlite_url, wait_for) -> None:  # type: ignore[no-untyped-def]
    """Every Health.Watch failed UNKNOWN ("'async for' requires an object with __aiter__
    method, got coroutine"): the interceptor that names malformed requests iterated a
    handler that writes its answers. Working, it needs no token, so its streams are
    bounded (MAX_HEALTH_WATCHES; 3 here): 5,000 took a scheduler from 99 to 193 MB."""
    sched = make_scheduler(sqlite_url, auth="token")
    sched.server.health._most = 3
    with grpc.insecure_channel(sched.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(3)]
        try:
            assert [next(w).status for w in watches] == [SERVING] * 3
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=60))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "3 health watches are open already; use Check" in refused.value.details()
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=60).status == SERVING
            watches.pop().cancel()  # a place is free again once the scheduler sees it go

            def another() -> bool:
                try:
                    watches.append(stub.Watch(health_pb2.HealthCheckRequest(), timeout=60))
                    return next(watches[-1]).status == SERVING
                except grpc.RpcError:
                    watches.pop()
                    return False
            wait_for(another, 30)
        finally:
            for w in watches:
                w.cancel()
