"""Lies and garbage in measurements, over real sockets with credentials made as the real
ones are: a job's progress comes from inside the user's own process (its runtime token,
minted as its helper mints it), a server's samples from its helper (a helper token). What
must hold: every view (GetJob, ListJobs, the dashboard's data, /metrics, `gandiva top`)
still answers for everyone, and what is stored is bounded (docs/security.md)."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from protos.gandiva.v1 import (
    common_pb2,
    helper_pb2,
    helper_pb2_grpc,
    runtime_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler import auth
from scheduler.core import Settings
from scheduler.validation import MAX_RATE, MAX_STEPS
from tests.in_process import run_gandiva
from tests.scheduler.api.test_runtime_api import FakeShim

from .conftest import make_token
from .test_authorization import _http_get


def test_lying_progress_is_bounded_and_every_view_still_answers(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, connect, wait_for, capsys: pytest.CaptureFixture[str]) -> None:
    """A job's runtime reported a rate of 5e-324 mini-batches/s (finite, positive: it
    passed the NaN/inf cleaning), and its ETA, 1,000 / 5e-324, was infinity: `gandiva get
    jobs` (every operator's listing) and `describe job` died formatting it (OverflowError),
    the dashboard's /api/state answered 500 and `gandiva top` showed nothing, for as long as
    it was stored. Negative and 1e308 rates, steps past 2^53 and a mini-batch of 1e308 s
    were stored as sent. Now a rate is held to 0 (unknown) .. MAX_RATE, steps to
    MAX_STEPS, a step time to a day."""
    # The fake helper never heartbeats, and six rounds of views (three CLIs each) can run
    # past the default 10 s on a loaded machine: its server would be called down and the
    # job re-queued, its incarnation's progress refused. This test is about measurements.
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token", http_listen="127.0.0.1:0",
                           settings=Settings(down_after_s=600.0))
    alice_token, root_token = make_token(sched.db_url, "alice"), make_token(sched.db_url, "root", "operator")
    helper_token = make_token(sched.db_url, "n1", "helper")
    alice = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, alice_token))
    root = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, root_token))
    helper = helper_pb2_grpc.HelperStub(connect(sched.address, helper_token))
    helper.Register(helper_pb2.RegisterServerRequest(
        name="n1", gpus=[common_pb2.Gpu(index=0, memory_total_bytes=16 << 30)]))
    commands = helper.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
    job = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        command=["python", "t.py"], gpus=1, steps=1000))).job
    launch = next(commands).launch
    token = auth.runtime_token(helper_token, job.id, launch.incarnation)
    shim = FakeShim(connect(sched.address, token), job.id, launch.incarnation)  # says what it is told to
    http = sched.server.http_address
    try:
        wait_for(lambda: alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id)).state == common_pb2.JOB_STATE_RUNNING)
        # (sent steps, rate, last step s) -> (stored steps, rate); steps rise so each lands.
        for sent, stored in [((10, 5e-324, 0.1), (10, 0.0)),
                             ((20, -5.0, -1.0), (20, 0.0)),
                             ((30, 1e308, 1e308), (30, MAX_RATE)),
                             ((40, math.nan, math.inf), (40, 0.0)),
                             ((50, 4.5, 0.2), (50, 4.5)),
                             ((2**63 - 1, 1e-300, 0.2), (MAX_STEPS, 0.0))]:
            steps, rate, step_s = sent
            shim.out.put(runtime_pb2.RuntimeMessage(progress=runtime_pb2.ProgressReport(
                steps=steps, rate=rate, last_step_s=step_s)))
            got = wait_for(lambda n=stored[0]: (j := alice.GetJob(scheduler_pb2.GetJobRequest(id=job.id))).steps == n
                           and j, timeout=30)
            assert (got.steps, got.rate) == stored, (sent, got.steps, got.rate)
            assert got.eta_s == -1 or 0 <= got.eta_s < 1e300, got.eta_s
            # Every view answers, for the owner and the operator alike.
            assert [j.id for j in alice.ListJobs(scheduler_pb2.ListJobsRequest()).jobs] == [job.id]
            assert [j.id for j in root.ListJobs(scheduler_pb2.ListJobsRequest()).jobs] == [job.id]
            status, body = _http_get(http, "/api/state", root_token)
            assert status == 200, body[:300]
            assert [j["rate"] for j in json.loads(body)["jobs"]] == [stored[1]]
            status, body = _http_get(http, "/metrics", root_token)
            assert status == 200 and b"gandiva_job_minibatch_rate" in body, body[:300]
            top = run_gandiva(capsys, "top", "--once", "--http", http, "--token", root_token)
            assert top.returncode == 0, top.stderr
            listed = run_gandiva(capsys, "get", "jobs", "--scheduler", sched.address, "--token", root_token)
            assert listed.returncode == 0 and job.id in listed.stdout, listed.stderr
            shown = run_gandiva(capsys, "describe", "job", job.id, "--scheduler", sched.address, "--token", alice_token)
            assert shown.returncode == 0 and job.id in shown.stdout, shown.stderr
    finally:
        shim.close()
        commands.cancel()


def test_a_helper_reports_samples_only_of_the_jobs_on_its_own_server(  # type: ignore[no-untyped-def]
        make_scheduler, sqlite_url: str, connect) -> None:
    """A helper acts only as its own server, yet its GPU samples of any job id it knew (a
    job that had run there and moved on) were written into that job's profile: another
    server's helper made a job 4 EiB large (never packed again) or idle (packed first).
    Now only samples of the jobs placed on the reporting server count."""
    sched = make_scheduler(sqlite_url, tick_s=0.2, auth="token")
    alice = scheduler_pb2_grpc.SchedulerStub(connect(sched.address, make_token(sched.db_url, "alice")))
    n1, n2 = (helper_pb2_grpc.HelperStub(connect(sched.address, make_token(sched.db_url, n, "helper")))
              for n in ("n1", "n2"))
    gpu = [common_pb2.Gpu(index=0, memory_total_bytes=16 << 30)]
    n1.Register(helper_pb2.RegisterServerRequest(name="n1", gpus=gpu))
    commands = n1.ReceiveCommands(helper_pb2.ReceiveCommandsRequest(server="n1"))
    try:
        job = alice.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            command=["python", "t.py"], gpus=1))).job
        assert next(commands).launch.job_id == job.id
        n2.Register(helper_pb2.RegisterServerRequest(name="n2", gpus=gpu))

        def profile() -> Any:
            snap = sched.call(sched.server.engine.snapshot())
            return {j.id: j.profile for j in snap.jobs}[job.id]

        n1.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", samples=[helper_pb2.GpuSample(
            gpu_index=0, job_id=job.id, job_memory_max_bytes=2 << 30, utilization=0.3, minibatch_s=0.1)]))
        measured = profile()
        assert (measured.memory_bytes, measured.gpu_util, measured.step_time_s) == (2 << 30, 0.3, 0.1)
        # n2 lies about n1's job (and samples a GPU it does not have): nothing of it is taken.
        n2.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n2", samples=[
            helper_pb2.GpuSample(gpu_index=0, job_id=job.id, job_memory_max_bytes=2**62, utilization=0.0,
                                 minibatch_s=1e-300),
            helper_pb2.GpuSample(gpu_index=2**31 - 1, utilization=1.0, memory_used_bytes=1)]))
        assert profile() == measured
        # n1's own helper is still heard, its step time held to a microsecond .. a day.
        n1.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", samples=[helper_pb2.GpuSample(
            gpu_index=0, job_id=job.id, job_memory_max_bytes=3 << 30, utilization=0.5, minibatch_s=1e308)]))
        now = profile()
        assert (now.memory_bytes, now.gpu_util, now.step_time_s) == (3 << 30, 0.5, 86400.0)
        # A report of 100,000 samples (the limit) of 300 GPU indices: one statement each, in
        # one write transaction, held every write for minutes. Now the last sample of each
        # registered GPU counts, at once.
        flood = [helper_pb2.GpuSample(gpu_index=i % 300, utilization=0.25, memory_used_bytes=i) for i in range(100_000)]
        t0 = time.monotonic()
        n1.ReportGpuSamples(helper_pb2.GpuSamplesRequest(server="n1", samples=flood), timeout=60)
        assert time.monotonic() - t0 < 20
        (server,) = [s for s in alice.ListServers(scheduler_pb2.ListServersRequest()).servers if s.name == "n1"]
        assert (server.gpu_list[0].memory_used_bytes, server.gpu_list[0].utilization) == (99_900, 0.25)
    finally:
        commands.cancel()
