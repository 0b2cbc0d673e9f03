"""A packing trial is judged by the rates the jobs report from inside the users' own
processes: one that reported 10^6 mini-batches/s while packed kept the packing while the
job packed with it (another user's) ran at a quarter of its rate alone. A real scheduler
over a real socket, a scripted helper with one GPU, two runtimes on real Runtime streams."""

from __future__ import annotations

import threading

import grpc

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler.policy.types import PolicyConfig
from tests.scheduler.cli.conftest import ScriptedHelper

from .scripted_runtime import ScriptedRuntime

ALONE, PACKED = 10.0, 2.5  # the GPU: mini-batches/s alone, and each while both run


def test_a_job_reporting_a_huge_rate_while_packed_does_not_keep_a_packing_that_hurts_its_partner(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, wait_for) -> None:
    """Probed (3 s slices, 6 s trials): the liar's pair was judged "packed rate 100000.25x of
    time-slicing: kept" and its partner ran at 2.5/s for the whole minute. Now each ratio is
    clipped at 1 (1.25x) and, with pack_no_loser, the partner's own 0.25 (under its
    time-slice share 0.5) undoes the packing."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, policy_config=PolicyConfig(
        quantum_s=3.0, pack_trial_s=6.0, pack_no_loser=True))
    helper = ScriptedHelper(sched.address, wait_for, name="n1", gpus=1)
    done = threading.Event()
    runtimes: list[ScriptedRuntime] = []
    with grpc.insecure_channel(sched.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        try:
            ids = {who: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
                command=["python", "t.py"], gpus=1, name=who, user=who))).job.id for who in ("victim", "liar")}
            gpu: dict = {}
            for who, job_id in ids.items():
                incarnation = wait_for(lambda j=job_id: helper.launched.get(j))
                runtimes.append(ScriptedRuntime(ch, job_id, incarnation, "huge" if who == "liar" else "", gpu=gpu,
                                                alone=ALONE, packed=PACKED))

            def beat() -> None:  # the helper's profile of both: small and idle, so packable
                while not done.wait(0.5):
                    try:
                        helper.helper.Heartbeat(helper_pb2.HeartbeatRequest(
                            name="n1", running_jobs=list(ids.values()), running=[
                                helper_pb2.JobIncarnation(job_id=j, incarnation=helper.launched[j])
                                for j in ids.values()]))
                        helper.helper.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", samples=[
                            helper_pb2.GpuSample(gpu_index=0, job_id=j, job_memory_max_bytes=1 << 30,
                                                 utilization=0.2) for j in ids.values()]))
                    except (grpc.RpcError, ValueError):
                        return

            threading.Thread(target=beat, daemon=True).start()

            def verdict() -> str | None:
                for job_id in ids.values():
                    for e in stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events:
                        if e.kind == "job.pack" and "packed rate" in e.message:
                            return str(e.message)
                return None

            message = wait_for(verdict, timeout=90)
            victim = ids["victim"]
            assert "packed rate 1.25x of time-slicing" in message, message  # 1 (clipped) + 0.25
            assert "clipped at 1x" in message, message
            assert f"but {victim} kept 0.25x of its rate alone, under its time-slice share 0.50: undone" in message
            # The pair is unpacked: the two jobs take turns again.
            wait_for(lambda: sum(r.running for r in runtimes) == 1, timeout=60)
        finally:
            done.set()
            for r in runtimes:
                r.close()
            helper.close()
