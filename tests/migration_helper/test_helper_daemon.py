"""The helper daemon against a control plane over real gRPC: registration, launching
real processes, exits, pre-warm and activation, stop, and reconnecting."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from migration_helper.config import HelperConfig
from migration_helper.daemon import HelperDaemon
from migration_helper.gpus import CpuBackend
from migration_helper.local_control import LocalControl
from protos.gandiva.v1 import common_pb2, helper_pb2

from .conftest import MakeHelper


def launch(job: str, inc: str, command: list[str], gpus: list[int], tmp: Path, **kw: object) -> helper_pb2.HelperCommand:
    spec = common_pb2.JobSpec(command=command, workdir=str(tmp), env={"USER_VAR": "from-spec"})
    return helper_pb2.HelperCommand(launch=helper_pb2.LaunchJob(
        job_id=job, incarnation=inc, spec=spec, gpu_indices=gpus, **kw))  # type: ignore[arg-type]


async def test_registers_server_gpus_ramdisk_and_heartbeats(control: LocalControl, make_helper: MakeHelper) -> None:
    helper = await make_helper("s1")
    reg = control.servers["s1"]
    assert reg.address == helper.address and reg.ramdisk.endswith("ramdisks/s1")
    assert [g.index for g in reg.gpus] == [0, 1, 2, 3] and reg.gpus[0].model == "virtual"
    assert Path(reg.ramdisk).is_dir()
    await control.wait_for(lambda: "s1" in control.heartbeats, 5, "a heartbeat")


async def test_launch_runs_job_with_env_and_gpus_and_reports_its_exit(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    helper = await make_helper("s1")
    cmd = launch("j1", "i1", [fake_job, "--lr", "0.1"], [1, 3], tmp_path)
    cmd.launch.spec.env["FAKE_STEPS"] = "5"
    result = await control.helper_command("s1", cmd, 10)
    assert result.ok, result.message
    await control.wait_for(lambda: control.exit_of("j1", "i1"), 10, "the exit report")
    exit_ = control.exit_of("j1", "i1")
    assert exit_ is not None and (exit_.exit_code, exit_.reason, exit_.server) == (0, "finished", "s1")
    log = (tmp_path / "logs" / "j1.log").read_text()
    assert "gpus=1,3" in log and "argv=['--lr', '0.1']" in log and "user_var=from-spec" in log
    assert "j1" not in helper.jobs.running_jobs()


async def test_stop_ends_the_process_group_and_reports_stopped(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    await make_helper("s1")
    assert (await control.helper_command("s1", launch("j1", "i1", [fake_job], [0], tmp_path), 10)).ok
    await control.wait_for(lambda: "j1" in control.heartbeats["s1"].running_jobs, 5, "j1 in a heartbeat")
    stop = helper_pb2.HelperCommand(stop=helper_pb2.StopJob(job_id="j1", reason="test"))
    assert (await control.helper_command("s1", stop, 10)).ok
    await control.wait_for(lambda: control.exit_of("j1", "i1"), 10, "the exit report")
    exit_ = control.exit_of("j1", "i1")
    assert exit_ is not None and exit_.reason == "stopped" and exit_.exit_code == -15


async def test_a_resent_launch_does_not_start_a_second_process(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    helper = await make_helper("s1")
    for _ in range(2):
        assert (await control.helper_command("s1", launch("j1", "i1", [fake_job], [0], tmp_path), 10)).ok
    assert len(helper.jobs.processes) == 1


async def test_launch_failures_are_reported_not_raised(
    control: LocalControl, make_helper: MakeHelper, tmp_path: Path
) -> None:
    await make_helper("s1")
    missing = await control.helper_command("s1", launch("j1", "i1", [str(tmp_path / "nope")], [0], tmp_path), 10)
    assert not missing.ok and "nope" in missing.message
    bad_dir = launch("j2", "i1", ["/bin/true"], [0], tmp_path)
    bad_dir.launch.spec.workdir = "/does/not/exist"
    result = await control.helper_command("s1", bad_dir, 10)
    assert not result.ok and "workdir '/does/not/exist' does not exist" in result.message


async def test_warm_launch_holds_until_activated_and_restores(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    helper = await make_helper("s1")
    warm = await control.helper_command("s1", launch("j1", "i1", [fake_job], [0], tmp_path, warm=True), 10)
    assert warm.ok and warm.durations_s["prewarm"] > 0
    proc = helper.jobs.processes[("j1", "i1")]
    assert proc.last_event("warm_ready") and not proc.last_event("first_step_done")
    # A restore reads only from this helper's ramdisk (or its shared root), where transfers land.
    ckpt = tmp_path / "ramdisks" / "s1" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "gandiva.json").write_text(json.dumps({"global_step": 41}))
    activate = helper_pb2.HelperCommand(activate=helper_pb2.ActivateJob(
        job_id="j1", incarnation="i1", restore_checkpoint=str(ckpt)))
    result = await control.helper_command("s1", activate, 10)
    assert result.ok and result.step == 41 and "restore" in result.durations_s
    await control.wait_for(lambda: control.steps("j1", "i1") >= 50, 10, "training past the restored step")


async def test_warm_process_dying_fails_the_launch_with_its_exit_code(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    await make_helper("s1")
    cmd = launch("j1", "i1", [fake_job], [0], tmp_path, warm=True)
    cmd.launch.spec.env["FAKE_MODE"] = "die_warm"
    result = await control.helper_command("s1", cmd, 10)
    assert not result.ok and result.exit_code == 3 and "before 'warm_ready'" in result.message


async def test_reconnects_after_the_scheduler_restarts_and_delivers_exits_it_missed(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    helper = await make_helper("s1")
    cmd = launch("j1", "i1", [fake_job], [0], tmp_path)
    cmd.launch.spec.env.update(FAKE_STEPS="25", FAKE_STEP_S="0.04")
    assert (await control.helper_command("s1", cmd, 10)).ok
    address = control.address
    await control.stop()  # the job finishes while the scheduler is away
    await asyncio.sleep(1.5)
    assert not helper.registered.is_set()
    again = LocalControl(heartbeat_interval_s=0.2)
    await again.start(address)
    try:
        await again.wait_for(lambda: "s1" in again.servers and again.exit_of("j1", "i1"), 15,
                             "re-registration and the missed exit")
        assert [e.job_id for e in again.exits] == ["j1"]  # delivered once
        # The command stream is open again.
        result = await again.helper_command("s1", helper_pb2.HelperCommand(
            stop=helper_pb2.StopJob(job_id="nothing")), 10)
        assert result.ok and result.message == "not running here"
    finally:
        await again.stop()


async def test_registers_again_when_the_scheduler_forgot_the_server(
    control: LocalControl, make_helper: MakeHelper
) -> None:
    helper = await make_helper("s1")
    control.servers.clear()  # as after a scheduler restart with a lost server row
    await control.wait_for(lambda: "s1" in control.servers and helper.sessions == 2, 10, "re-registration")
    assert control.registrations["s1"] == 2


@pytest.mark.parametrize("left", [{"s2"}, set()])
async def test_a_changed_peer_list_replaces_the_helpers_copy_even_when_it_is_empty(
    control: LocalControl, make_helper: MakeHelper, left: set[str]
) -> None:
    # Peers gone (all of them, too): the helper must stop trusting their agents.
    helper = await make_helper("s1")
    other = await make_helper("s2")
    await control.wait_for(lambda: set(helper.peers.values()) == {"s1", "s2"}, 10, "both peers listed")
    assert await helper.not_a_peer(other.address) == ""
    control.listed = left
    await control.wait_for(lambda: set(helper.peers.values()) == left, 10, f"the peers to become {left or 'none'}")
    if "s2" not in left:
        assert "is not the agent address of a registered helper" in await helper.not_a_peer(other.address)


async def test_gpu_samples_report_the_jobs_memory(
    control: LocalControl, make_helper: MakeHelper, fake_job: str, tmp_path: Path
) -> None:
    await make_helper("s1")
    assert (await control.helper_command("s1", launch("j1", "i1", [fake_job], [2], tmp_path), 10)).ok

    def job_sample() -> helper_pb2.GpuSample | None:
        for batch in control.samples:
            for s in batch.samples:
                # The first samples may catch the interpreter still starting up.
                if s.job_id == "j1" and s.job_memory_bytes > 10 << 20:
                    return s
        return None

    await control.wait_for(job_sample, 10, "a sample of j1")
    sample = job_sample()
    assert sample is not None and sample.gpu_index == 2
    assert sample.job_memory_max_bytes >= sample.job_memory_min_bytes > 0


async def test_a_launch_that_arrives_while_the_helper_stops_starts_nothing(
    control: LocalControl, make_helper: MakeHelper, tmp_path: Path
) -> None:
    """The helper stopping (SIGTERM) stops its jobs first; a launch the scheduler sends
    meanwhile (it re-queued a job on its stopped exit and placed it here again, before the
    helper said it was leaving) used to start a process that outlived the helper's stop,
    unsupervised, while the job was placed again elsewhere."""
    helper = await make_helper("s1")
    ignores_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
    slow = launch("j1", "i1", [sys.executable, "-c", ignores_term], [0], tmp_path)  # stopped after the grace
    assert (await control.helper_command("s1", slow, 10)).ok
    await asyncio.sleep(1.0)  # its SIGTERM handler in place
    stopping = asyncio.create_task(helper.stop())
    await asyncio.sleep(0.5)  # stopping j1: its grace runs
    late = asyncio.create_task(control.helper_command("s1", launch("j2", "i2", ["sleep", "30"], [1], tmp_path), 5))
    await stopping
    late.cancel()
    assert not helper.jobs.running_jobs(), helper.jobs.running_jobs()
    assert ("j2", "i2") not in helper.jobs.processes



class _HeldStub:
    """Takes the helper's reports as a scheduler would; its answer to a batch of GPU
    samples waits for `release` (a busy scheduler, a slow link)."""

    def __init__(self) -> None:
        self.taken: list[str] = []
        self.in_flight, self.release = asyncio.Event(), asyncio.Event()

    async def ReportGpuSamples(self, request: helper_pb2.GpuSamplesRequest, timeout: float) -> None:
        self.in_flight.set()
        await self.release.wait()
        self.taken.append(f"samples {request.server}")

    async def ReportCommandResult(self, request: helper_pb2.HelperCommandResult, timeout: float) -> None:
        self.taken.append(f"result {request.command_id}")

    async def ReportProcessExit(self, request: helper_pb2.ProcessExitRequest, timeout: float) -> None:
        self.taken.append(f"exit {request.job_id}")


async def test_reports_posted_while_samples_are_in_flight_are_all_delivered(tmp_path: Path) -> None:
    """CI of 4210601 (test_helper_tf.py -k shared-mount): a pre-warm launch held warm at
    the destination, yet its answer never came (300 s), nor its stop's. The newest samples
    replaced the batch being sent, and that send's end took the report behind it away."""
    helper = HelperDaemon(HelperConfig(server_name="s1", scheduler="127.0.0.1:9", ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs"), CpuBackend(1, "s1"))
    stub = _HeldStub()
    helper._post_samples(helper_pb2.GpuSamplesRequest(server="first"))
    sending = asyncio.create_task(helper._send_queued(stub))  # type: ignore[arg-type]
    await stub.in_flight.wait()
    helper._post(helper_pb2.HelperCommandResult(command_id="launch"))
    helper._post(helper_pb2.ProcessExitRequest(job_id="j1"))
    helper._post_samples(helper_pb2.GpuSamplesRequest(server="second"))
    helper._post_samples(helper_pb2.GpuSamplesRequest(server="third"))  # replaces "second", still waiting
    stub.release.set()
    await asyncio.wait_for(sending, 10)
    assert stub.taken == ["samples first", "result launch", "exit j1", "samples third"]


def test_a_registration_carries_the_exits_still_waiting_in_the_outbox(tmp_path: Path) -> None:
    """Back from a cut that outlasted the heartbeat timeout, a job that ended meanwhile was
    re-queued with its server; its exit, sent only after the registration, came after the
    round that placed it again (it ran twice). It goes with the registration now (after
    those an earlier run left), and stays in the outbox (sent again there: a no-op)."""
    helper = HelperDaemon(HelperConfig(server_name="s1", scheduler="127.0.0.1:9", ramdisk=tmp_path / "rd",
                                       log_dir=tmp_path / "logs"), CpuBackend(1, "s1"))
    left = helper_pb2.ProcessExitRequest(server="s1", job_id="j0", incarnation="i0", reason="finished")
    helper._inherited = [(left, tmp_path / "kept.exit")]
    helper._post(helper_pb2.HelperCommandResult(command_id="launch"))
    helper._post(helper_pb2.ProcessExitRequest(server="s1", job_id="j1", incarnation="i1", reason="finished"))
    helper._post_samples(helper_pb2.GpuSamplesRequest(server="s1"))
    assert [x.job_id for x in helper._register_request().exits] == ["j0", "j1"]
    assert len(helper._outbox) == 3
