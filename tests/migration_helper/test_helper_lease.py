"""The helper against the real scheduler: with the scheduler gone for longer than its
lease it freezes its jobs (they stop using CPU) and thaws them once a heartbeat is
answered again; a report the scheduler refuses for good is dropped, not retried
ahead of every later report."""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from protos.gandiva.v1 import common_pb2, helper_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler.core import Settings

GANDIVA = [sys.executable, "-m", "gandiva_cli.main"]
SETTINGS = Settings(heartbeat_interval_s=0.2, down_after_s=3.0)  # lease 1.8 s


def _job_pids(job_id: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if f"GANDIVA_JOB_ID={job_id}\0".encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _state_and_cpu(pid: int) -> tuple[str, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


def test_jobs_freeze_when_the_lease_runs_out_and_thaw_when_it_is_renewed(
    make_scheduler: Any, sqlite_url: str, tmp_path: Path, fake_job: str, wait_for: Any
) -> None:
    first = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    address = first.address
    helper = subprocess.Popen(
        [*GANDIVA, "helper", "--server-name", "s1", "--gpus", "1", "--virtual", "--scheduler", address,
         "--ramdisk", str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs"), "--http-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert helper.stdout is not None
        said = helper.stdout.readline() + helper.stdout.readline()  # its metrics' address, then "listening"
        metrics = re.search(r"metrics on http://(\S+)/metrics", said)
        assert "listening" in said, said
        assert metrics, "the helper did not say where its metrics are"

        def lease() -> tuple[float, float, float]:
            """What an operator would alert on, from a real scrape of the helper's /metrics:
            (frozen, jobs frozen, seconds of lease left). None of them existed before session 49."""
            samples = {s.name: s.value for f in text_string_to_metric_families(
                urllib.request.urlopen(f"http://{metrics[1]}/metrics", timeout=10).read().decode()) for s in f.samples}
            return (samples["gandiva_helper_lease_frozen"], samples["gandiva_helper_jobs_frozen"],
                    samples["gandiva_helper_lease_remaining_seconds"])
        api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        spec = common_pb2.JobSpec(name="f", command=[fake_job], workdir=str(tmp_path), gpus=1,
                                  env={"FAKE_STEPS": "0", "FAKE_STEP_S": "0.02"})
        job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.id
        wait_for(lambda: api.GetJob(scheduler_pb2.GetJobRequest(id=job_id)).steps >= 10, 30)
        (pid,) = _job_pids(job_id)
        wait_for(lambda: (got := lease())[:2] == (0, 0) and 0 < got[2] <= 1.8, 10)  # renewed every 0.2 s
        first.call(first.server.stop(grace=0.5))
        gone = time.monotonic()
        wait_for(lambda: _state_and_cpu(pid)[0] == "T", 10)
        assert lease() == (1, 1, 0), lease()
        frozen_after = time.monotonic() - gone
        assert frozen_after < SETTINGS.down_after_s, f"frozen only {frozen_after:.1f}s after the scheduler went"
        cpu = _state_and_cpu(pid)[1]
        time.sleep(1.0)
        assert _state_and_cpu(pid) == ("T", cpu), "a frozen job used CPU"
        second = make_scheduler(sqlite_url, listen=address, tick_s=0.1, settings=SETTINGS)
        # Heartbeats answered again, and the job still expected here: it goes on.
        wait_for(lambda: _state_and_cpu(pid)[0] != "T", 15)
        wait_for(lambda: _state_and_cpu(pid)[1] > cpu, 15)  # training again
        wait_for(lambda: (got := lease())[:2] == (0, 0) and got[2] > 0, 10)
        api = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(second.address))
        job = api.GetJob(scheduler_pb2.GetJobRequest(id=job_id))
        assert job.state == common_pb2.JOB_STATE_RUNNING and job.placement[0].server == "s1"
        assert [t.to_state for t in job.history].count(common_pb2.JOB_STATE_RUNNING) == 1, "never re-placed"
        api.KillJob(scheduler_pb2.JobActionRequest(id=job_id))
        wait_for(lambda: not _job_pids(job_id), 15)
    finally:
        helper.terminate()
        helper.wait(15)


async def test_a_report_refused_for_good_is_dropped_and_later_ones_still_arrive(
    scheduler_server: Any, tmp_path: Path, wait_for: Any
) -> None:
    daemon = HelperDaemon(HelperConfig(server_name="s1", scheduler=scheduler_server.address,
                                       ramdisk=tmp_path / "rd", log_dir=tmp_path / "logs"), CpuBackend(1, "s1"))
    await daemon.start()
    try:
        await asyncio.wait_for(daemon.registered.wait(), 10)
        with grpc.insecure_channel(scheduler_server.address) as ch:
            api = scheduler_pb2_grpc.SchedulerStub(ch)
            job_id = api.SubmitJob(scheduler_pb2.SubmitJobRequest(
                spec=common_pb2.JobSpec(command=["python", "t.py"], gpus=1))).job.id
            # First a report the scheduler refuses (no job id), then one it takes.
            daemon._post(helper_pb2.ProcessExitRequest(server="s1", job_id="", exit_code=1))
            daemon._post(helper_pb2.ProcessExitRequest(server="s1", job_id=job_id, incarnation="old", exit_code=1))

            def taken() -> bool:
                events = api.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
                return any(e.kind == "job.stale_exit" for e in events)

            for _ in range(100):
                if taken():
                    break
                await asyncio.sleep(0.1)
            assert taken(), "the report behind the refused one never arrived"
        # Other reports may still be on their way (the job's launch result, posted as the
        # scheduler placed it here): the outbox drains; only the refused one was dropped.
        for _ in range(100):
            if not daemon._outbox:
                break
            await asyncio.sleep(0.1)
        assert daemon.dropped == 1 and not daemon._outbox
    finally:
        await daemon.stop()


async def test_stopping_a_frozen_job_continues_it_so_its_sigterm_ends_it(tmp_path: Path) -> None:
    """A frozen process group handles its SIGTERM only once continued: stop() must not
    wait out the grace period and SIGKILL it."""
    import signal

    from migration_helper.process import JobProcess

    proc = JobProcess(job_id="j", incarnation="i", argv=["sleep", "60"], workdir=str(tmp_path),
                      env=dict(os.environ), gpu_indices=(), log_path=tmp_path / "j.log")
    await proc.start(lambda p: None)
    proc.freeze()
    t0 = time.monotonic()
    assert await proc.stop(grace_s=20.0) == -signal.SIGTERM
    assert time.monotonic() - t0 < 10.0 and not proc.frozen


async def test_the_lease_watchdog_does_not_freeze_a_job_while_it_handles_its_sigterm(
        tmp_path: Path) -> None:
    """The watchdog freezes again every poll while the lease is out; a job being stopped
    must still get to finish its SIGTERM handler rather than wait for the SIGKILL."""
    from migration_helper.process import JobProcess

    handler = ("import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(3)))\n"
               "print('handler' + ' installed', flush=True)\n"
               "time.sleep(60)\n")
    log_path = tmp_path / "j.log"
    proc = JobProcess(job_id="j", incarnation="i", argv=[sys.executable, "-c", handler],
                      workdir=str(tmp_path), env=dict(os.environ), gpu_indices=(), log_path=log_path)
    await proc.start(lambda p: None)
    for _ in range(100):
        if "handler installed" in log_path.read_text():  # (the log's header shows the script)
            break
        await asyncio.sleep(0.05)
    proc.freeze()
    t0 = time.monotonic()
    stopping = asyncio.create_task(proc.stop(grace_s=20.0))
    await asyncio.sleep(0.2)  # the SIGTERM handler is running
    proc.freeze()  # the watchdog's next poll
    assert await stopping == 3
    assert time.monotonic() - t0 < 10.0


async def test_a_launch_read_after_the_lease_ran_out_starts_frozen_and_thaws_only_once_reported(
    make_scheduler: Any, sqlite_url: str, tmp_path: Path, fake_job: str
) -> None:
    """A helper stopped (SIGSTOP) past its lease, then continued, reads the launches the
    scheduler sent before calling its server down; the jobs run elsewhere by then. Each
    launch starts frozen (the lease checked there and then, not at the watchdog's next
    look, which had not come yet: here it never comes), and the answer to a heartbeat sent
    before a launch, which did not report it, does not thaw it: only an answer to one that
    reported it (the scheduler names a stale launch there, and it is killed). Before, it
    trained until the watchdog's next look, and again from that first answer on (a
    multihost test's sampler saw two copies of the job training)."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    daemon = HelperDaemon(HelperConfig(server_name="s1", scheduler=sched.address, ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs"), CpuBackend(2, "s1"))
    await daemon.start()

    async def launch(job_id: str, gpu: int) -> Any:
        result = await daemon.jobs.handle(helper_pb2.HelperCommand(command_id=job_id, launch=helper_pb2.LaunchJob(
            job_id=job_id, incarnation="i-1", gpu_indices=[gpu], spec=common_pb2.JobSpec(
                command=[fake_job], workdir=str(tmp_path), gpus=1, env={"FAKE_STEP_S": "0.02"}))))
        assert result.ok, result.message
        return daemon.jobs.processes[(job_id, "i-1")]

    async def state_becomes(pid: int, stopped: bool) -> tuple[str, int]:
        for _ in range(100):
            if (_state_and_cpu(pid)[0] == "T") == stopped:
                break
            await asyncio.sleep(0.02)
        return _state_and_cpu(pid)

    try:
        await asyncio.wait_for(daemon.registered.wait(), 10)
        daemon._tasks[3].cancel()  # the lease watchdog: its next look never comes
        sched.call(sched.server.stop(grace=0.5))  # no heartbeat is answered any more
        await asyncio.sleep(daemon.lease_s + 0.5)
        assert not daemon.frozen
        first = await launch("j-1", 0)
        assert first.frozen, "a launch carried out after the lease ran out started unfrozen"
        loop = asyncio.get_running_loop()
        heartbeat_sent = loop.time()  # a heartbeat reporting j-1 only, answered below
        second = await launch("j-2", 1)
        assert second.frozen
        cpu = await state_becomes(second.pid, stopped=True)
        assert cpu[0] == "T"
        daemon._lease_renewed(heartbeat_sent, {("j-1", "i-1")})
        assert (await state_becomes(first.pid, stopped=False))[0] != "T", "the reported launch was not thawed"
        await asyncio.sleep(0.5)
        assert _state_and_cpu(second.pid) == cpu, "thawed by the answer to a heartbeat that did not report it"
        daemon._lease_renewed(loop.time(), {("j-1", "i-1"), ("j-2", "i-1")})
        assert (await state_becomes(second.pid, stopped=False))[0] != "T", \
            "not thawed by the answer to a heartbeat that reported it"
    finally:
        await daemon.stop()


async def test_the_lease_metric_says_what_the_jobs_shims_read(make_helper: Any, monkeypatch: Any) -> None:
    """gandiva_helper_lease_remaining_seconds and the lease file that the jobs' shims hold by
    agree, at one instant, whatever the lease: both come from HelperDaemon.lease_left. The
    metric did its own sum from the daemon's private renewal time, and said 0 ("ran out",
    what an operator alerts on) for a helper with no lease (its scheduler sends none, no
    --lease: this control plane), whose shims read "never runs out" and train on."""
    from migration_helper.metrics import HelperMetrics
    from tf_runtime.lease import Lease

    for daemon in await make_helper("none"), await make_helper("leased", lease_s=30.0):
        await daemon.registered.wait()  # its lease file written
        metrics = HelperMetrics(daemon)
        lease_file = daemon.lease_file
        start = time.monotonic()
        for now in (start, start + 31.0):  # the second instant: 30 s with no heartbeat answered
            # One instant for the metric, the file and the shim (the test's asyncio loop reads
            # time.monotonic); nothing else runs meanwhile (no await that yields).
            monkeypatch.setattr(time, "monotonic", lambda now=now: now)
            if now == start:
                daemon._publish_lease()  # as an answered heartbeat does (it reads two clocks)
            await metrics.refresh()
            metric = metrics.registry.get_sample_value("gandiva_helper_lease_remaining_seconds",
                                                       {"server": daemon.config.server_name})
            until = float(lease_file.read_text())
            holds = Lease(str(lease_file), clock=lambda now=now: now).holds()
            monkeypatch.undo()
            assert metric is not None
            assert metric == pytest.approx(max(0.0, until - now), abs=1e-6), (daemon.config.server_name, now - start)
            assert holds == (metric > 0), (daemon.config.server_name, metric)
        assert math.isinf(until) == (daemon.config.server_name == "none")


async def test_a_ramdisk_turned_read_only_neither_silences_the_helper_nor_freezes_its_lease_file(
        make_helper: Any, control: Any, tmp_path: Path) -> None:
    """The helper's ramdisk on a disk (ext4, errors=remount-ro) that fails: the kernel turns
    it read-only. Before, the lease file there could be neither rewritten nor removed; the
    error left the heartbeat loop and ended the helper's sessions for good: the process
    lived on, silent, its server was called down and every job there re-placed (live:
    tests/multihost/test_stream_host_faults.py -k read_only), and the file's stale end would hold every
    job's shim. Now the lease file lives in RAM (a folder of the helper's own in /dev/shm),
    heartbeats go on and the lease file's end moves on with them."""
    from .conftest import failing_ext4

    with failing_ext4(tmp_path / "ramdisks" / "ro") as fail:
        daemon = await make_helper("ro", lease_s=30.0)
        await daemon.registered.wait()
        lease_file = Path(daemon.lease_file)
        assert daemon.ramdisk.root not in lease_file.parents, lease_file
        fail.write_text("gandiva test: the disk fails\n")
        failed_at = time.monotonic()
        seen: list[object] = []

        def heartbeats_go_on() -> bool:
            last = control.heartbeats.get("ro")
            if not seen or seen[-1] is not last:
                seen.append(last)
            return len(seen) > 10 and float(lease_file.read_text()) > failed_at + 30.0

        await control.wait_for(heartbeats_go_on, 30, "heartbeats and lease renewals after the disk failed")
        assert control.registrations["ro"] == 1  # one session throughout
        assert daemon.registered.is_set()
        await daemon.stop()
        assert not lease_file.parent.exists(), "the lease's folder in RAM outlived its helper"


async def test_a_lease_shorter_than_two_heartbeats_is_raised_to_two(make_helper: Any, control: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """`gandiva helper --lease 0.001` (or any lease under two of the scheduler's heartbeats,
    which the scheduler refuses for its own): every job of the server was frozen within 0.1 s
    of its start, and none was ever thawed, since no heartbeat is answered within 1 ms. Now
    the helper takes two heartbeats (this control plane's) and says why."""
    interval = control.heartbeat_interval_s
    daemon = await make_helper("short", lease_s=1e-3)
    await daemon.registered.wait()
    assert daemon.lease_s == 2 * interval
    assert f"--lease 0.001 s is shorter than two of the scheduler's heartbeats ({interval:g} s each)" in caplog.text
