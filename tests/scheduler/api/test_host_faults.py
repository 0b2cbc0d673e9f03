"""Hosts lost or moved while a checkpoint is on its way, over the real Helper API (a real
scheduler, real gRPC and SQLite; the test answers for the helpers and the shims): a
drain's checkpoint and a migration's streamed to a helper's old address (its host back
on a new IP, same name), the source and the destination of a migration lost at once, and
a host lost while its job grows onto more of its GPUs. In each, the job is neither lost
nor run twice, resumes from the step it had checkpointed, and no GPU stays held for it
where it does not run."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import grpc

from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2, scheduler_pb2
from scheduler.core import Settings

from .test_fencing import AGENTS, Fake, _next_command

# Launches are answered at once here; a server silent for 2 s is down (lease 1.2 s).
SETTINGS = Settings(heartbeat_interval_s=0.2, down_after_s=2.0, command_timeout_s=5.0)
# For the tests that lose no host: a server Beats does not beat yet (y until its job's
# launch, a server while the next registers) stays up. With 2 s, at load 20, y was called
# down before its launch came ("no launch command for y"; -k drains_checkpoint_sent, 2 of 6).
NO_HOST_LOST = dataclasses.replace(SETTINGS, down_after_s=600.0)
MOVED = "127.0.0.1:7199"  # a helper's new agent address


class Beats:
    """Heartbeats for the fake helpers, every 0.1 s, each listing the launches its server
    runs (``run``); a server not listed falls silent. One heartbeat at a time with the
    test's own (``Fake.beat_lock``), as from a real helper: the test's sent while one of
    these was still being recorded was answered from memory, without the stop its
    ``running`` asked for (-k grows, line ``... in f.heartbeat("a", ...)``, at load 11-14)."""

    def __init__(self, f: Fake) -> None:
        self.f = f
        self.running: dict[str, tuple[tuple[str, str], ...]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def run(self, server: str, *pairs: tuple[str, str]) -> None:
        self.running[server] = pairs

    def silence(self, *servers: str) -> None:
        for server in servers:
            self.running.pop(server, None)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for server, pairs in list(self.running.items()):
                try:
                    with self.f.beat_lock:
                        self.f.helper.Heartbeat(helper_pb2.HeartbeatRequest(name=server, running=[
                            helper_pb2.JobIncarnation(job_id=j, incarnation=i) for j, i in pairs]), timeout=5)
                except grpc.RpcError:
                    pass  # the scheduler stopping at the test's end, or a slow answer

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _launch_confirmed(f: Fake, server: str) -> helper_pb2.LaunchJob:
    cmd = _next_command(f, server, "launch")
    f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(server=server, command_id=cmd.command_id, ok=True))
    return cmd.launch


def _migrate(f: Fake, job_id: str, dest: str, wait_for: Any) -> None:
    """MigrateJob, asked again while refused (its runtime not connected yet, a command in flight)."""
    def ask() -> bool:
        try:
            f.api.MigrateJob(scheduler_pb2.MigrateJobRequest(id=job_id, to_server=dest))
            return True
        except grpc.RpcError:
            return False
    wait_for(ask, 20)


def _events(f: Fake, kind: str, **where: str) -> list[str]:
    return [e.message for e in f.api.ListEvents(scheduler_pb2.ListEventsRequest(kinds=[kind], **where)).events]


def _allocated(f: Fake) -> dict[str, tuple[int, int]]:
    """server -> (GPUs, GPUs allocated), as the scheduler's database has them."""
    return {s.name: (s.gpus, s.allocated) for s in f.api.ListServers(scheduler_pb2.ListServersRequest()).servers}


def _refused_by_old_address(server: str, cmd: helper_pb2.HelperCommand) -> helper_pb2.HelperCommandResult:
    return helper_pb2.HelperCommandResult(
        server=server, command_id=cmd.command_id, ok=False, transfer_fault=helper_pb2.TRANSFER_FAULT_DEST_REFUSED,
        message=f"transfer: could not send the checkpoint to the helper at {cmd.transfer.dest_address}: "
                "UNAVAILABLE: failed to connect to all addresses")


def _two_gpu_job_on_y(f: Fake, beats: Beats, wait_for: Any) -> tuple[str, helper_pb2.LaunchJob]:
    """x (one GPU) heartbeating; a 2-GPU job launched on y (two GPUs), its shim connected
    (it acks a checkpoint at once, at step 42) and RUNNING: (its id, its launch)."""
    beats.run("x")
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=2, steps=1000)
    job_id = f.api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    launch = _launch_confirmed(f, "y")
    beats.run("y", (job_id, launch.incarnation))
    f.shim(job_id, launch.incarnation)
    wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and j.steps >= 0)
    return job_id, launch


def growing_on_a(f: Fake, beats: Beats) -> tuple[str, helper_pb2.LaunchJob, Any, helper_pb2.LaunchJob]:
    """A grow-shrink job launched on one of a's two GPUs, its shim connected (one tower),
    and its grow's destination pre-warmed on both, both heartbeating:
    (its id, its launch, its shim, the grow's launch)."""
    beats.run("a")
    spec = common_pb2.JobSpec(command=["python", "t.py"], gpus=1, steps=1000, grow_shrink=True)
    job_id = f.api.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    launch = _launch_confirmed(f, "a")
    beats.run("a", (job_id, launch.incarnation))
    shim = f.shim(job_id, launch.incarnation)
    shim.out.put(runtime_pb2.RuntimeMessage(towers=runtime_pb2.TowerReport(towers=1)))
    warm = _launch_confirmed(f, "a")  # the grow's destination, pre-warmed
    beats.run("a", (job_id, launch.incarnation), (job_id, warm.incarnation))
    assert warm.warm and sorted(warm.gpu_indices) == [0, 1], warm
    return job_id, launch, shim, warm


def test_a_drains_checkpoint_sent_to_a_helpers_old_address_goes_to_its_new_one_at_once(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """`gandiva drain y` parks y's 2-GPU job (x, one GPU, has no room for it) and streams
    its checkpoint to x, whose helper meanwhile registers again at another address (a
    machine back on a new IP, same name). y cannot reach the old address. The next stream
    goes to the new one at the drain's next pass; before, only 30 s later (the retry of a
    stream that failed), y not drained meanwhile."""
    from scheduler.engine.drain import EVACUATE_RETRY_S

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=NO_HOST_LOST)
    f = Fake(sched.address, gpus={"y": 2, "x": 1}, agents=True)
    beats = Beats(f)
    try:
        job_id, _ = _two_gpu_job_on_y(f, beats, wait_for)
        wait_for(lambda: f.api.DrainServer(scheduler_pb2.CordonServerRequest(server="y"), timeout=30).jobs, 20)
        wait_for(lambda: f.job(job_id).state == common_pb2.JOB_STATE_QUEUED, 20)
        beats.run("y")  # its process exited with the park's checkpoint
        first = _next_command(f, "y", "transfer")
        assert first.transfer.dest_address == AGENTS["x"], first
        f.helper.Register(helper_pb2.RegisterServerRequest(
            name="x", gpus=[common_pb2.Gpu(index=0)], ramdisk="/ram/x", address=MOVED))
        failed_at = time.monotonic()
        f.helper.ReportCommandResult(_refused_by_old_address("y", first))
        again = _next_command(f, "y", "transfer")
        after_s = time.monotonic() - failed_at
        assert again.transfer.dest_address == MOVED, again
        assert again.transfer.checkpoint_path == first.transfer.checkpoint_path
        assert after_s < EVACUATE_RETRY_S / 2, f"sent again {after_s:.1f}s later"
        copy = f"/ram/x/{job_id}/{again.transfer.checkpoint_name}"
        f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
            server="y", command_id=again.command_id, ok=True, checkpoint_path=copy))
        wait_for(lambda: _events(f, "server.drained", server="y"), 15)
        said = _events(f, "job.drain", job_id=job_id)
        assert any(f"x's helper moved from {AGENTS['x']} to {MOVED} meanwhile" in m for m in said), said
        moved = _events(f, "job.checkpoint", job_id=job_id)
        assert any(f"to x ({copy})" in m for m in moved), moved
    finally:
        beats.close()
        f.close()


def test_a_migrations_checkpoint_sent_to_its_destinations_old_address_does_not_bar_that_server(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """No shared root: a migration's checkpoint is streamed from the source's helper to the
    destination's agent, whose helper registers again at another address mid-stream. The
    stream fails (the job restarts at its source from the checkpoint, as for any failed
    transfer), but the destination is not taken for one that cannot take checkpoints:
    before, it got no new job for 60 s ("could not take J's migration checkpoint")."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=NO_HOST_LOST)
    f = Fake(sched.address, gpus={"a": 1, "b": 1}, agents=True)
    beats = Beats(f)
    try:
        beats.run("a")
        beats.run("b")
        job_id = f.submit()
        source = wait_for(lambda: (j := f.job(job_id)).placement and j.placement[0].server)
        dest = "b" if source == "a" else "a"
        launch = _launch_confirmed(f, source)
        beats.run(source, (job_id, launch.incarnation))
        f.shim(job_id, launch.incarnation)  # acks the stop for migration: step 42
        _migrate(f, job_id, dest, wait_for)
        warm = _launch_confirmed(f, dest)  # pre-warmed
        beats.run(dest, (job_id, warm.incarnation))
        transfer = _next_command(f, source, "transfer")
        assert transfer.transfer.dest_address == AGENTS[dest]
        f.helper.Register(helper_pb2.RegisterServerRequest(
            name=dest, gpus=[common_pb2.Gpu(index=0)], ramdisk=f"/ram/{dest}", address=MOVED))
        f.helper.ReportCommandResult(_refused_by_old_address(source, transfer))
        restart = _launch_confirmed(f, source)  # at its source, from the migration's checkpoint
        beats.run(source, (job_id, restart.incarnation))
        assert restart.restore_checkpoint == transfer.transfer.checkpoint_path, restart
        said = wait_for(lambda: [m for m in _events(f, "job.migration", job_id=job_id) if "meanwhile" in m], 10)
        assert f"{dest}'s helper moved from {AGENTS[dest]} to {MOVED} meanwhile" in said[0], said
        assert _events(f, "server.launch_failed", server=dest) == []
        reasons = [t.reason for t in f.job(job_id).history]
        assert reasons[-1].startswith("restarted_at_source: transfer failed"), reasons
    finally:
        beats.close()
        f.close()


def test_the_source_and_destination_of_a_migration_lost_at_once_resume_the_job_once_from_its_checkpoint(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A migration streams its checkpoint (no shared root): the source's shim confirmed it
    (step 42, in the source's ramdisk) and exited; before the stream ends both hosts fall
    silent (a rack's switch lost). Both are called down; the job waits for the source,
    which holds its checkpoint, holding no GPU anywhere; the source back, the job resumes
    from that checkpoint, launched once; the destination back, its pre-warmed copy is
    told to stop."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS)
    f = Fake(sched.address, gpus={"a": 1, "b": 1, "x": 1}, agents=True)
    beats = Beats(f)
    try:
        for server in ("a", "b", "x"):
            beats.run(server)
        job_id = f.submit()
        source = wait_for(lambda: (j := f.job(job_id)).placement and j.placement[0].server)
        dest = next(s for s in ("a", "b", "x") if s != source)
        launch = _launch_confirmed(f, source)
        beats.run(source, (job_id, launch.incarnation))
        shim = f.shim(job_id, launch.incarnation)
        _migrate(f, job_id, dest, wait_for)
        warm = _launch_confirmed(f, dest)
        beats.run(dest, (job_id, warm.incarnation))
        transfer = _next_command(f, source, "transfer")  # the checkpoint is confirmed; never answered
        checkpoint = transfer.transfer.checkpoint_path
        assert checkpoint == f"/ram/{source}/{job_id}/migrate-{warm.incarnation}", checkpoint
        shim.close()  # the source's process exited after its checkpoint
        beats.silence(source, dest)
        waiting = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_QUEUED
                           and f"waits for server {source}" in j.message and j, 15)
        wait_for(lambda: not any(up for name, up in f.servers().items() if name in (source, dest)), 10)
        reasons = [t.reason for t in waiting.history]
        assert any(f"its server {source} went down mid-migration; will resume from step 42 (its checkpoint is "
                   f"on {source})" in r for r in reasons), reasons
        assert all(n == 0 for _, n in _allocated(f).values()), _allocated(f)
        # The source back: the job resumes from the migration's checkpoint (there, or fetched).
        f.streams.pop(source).cancel()
        f.register(source)
        beats.run(source)
        where = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and j.placement[0].server,
                         15)
        if where == source:
            relaunch = _launch_confirmed(f, source)
            assert relaunch.restore_checkpoint == checkpoint, relaunch
        else:
            fetch = _next_command(f, source, "transfer")
            assert fetch.transfer.checkpoint_path == checkpoint, fetch
            copy = f"/ram/{where}/{job_id}/{fetch.transfer.checkpoint_name}"
            f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
                server=source, command_id=fetch.command_id, ok=True, checkpoint_path=copy))
            relaunch = _launch_confirmed(f, where)
            assert relaunch.restore_checkpoint == copy, relaunch
        beats.run(where, (job_id, relaunch.incarnation))
        assert relaunch.incarnation not in (launch.incarnation, warm.incarnation)
        assert sorted(n for _, n in _allocated(f).values()) == [0, 0, 1], _allocated(f)
        # The destination back: its pre-warmed copy is not expected there.
        f.streams.pop(dest).cancel()
        f.register(dest)
        assert (job_id, warm.incarnation) in f.heartbeat(dest, (job_id, warm.incarnation))
        job = f.job(job_id)
        assert [g.server for g in job.placement] == [where]
        states = [common_pb2.JobState.Name(t.to_state) for t in job.history]
        assert states[states.index("JOB_STATE_QUEUED", 2):] == ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING"], states
        assert not any("step 0" in t.reason for t in job.history), [t.reason for t in job.history]
    finally:
        beats.close()
        f.close()


def test_a_host_lost_while_its_job_grows_resumes_the_job_from_the_grows_checkpoint_on_one_set_of_gpus(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A grow-shrink job on one of a's two GPUs grows onto both (a migration within a: its
    checkpoint stays in a's ramdisk); the source confirmed it (step 42) and exited, and a is
    lost before the grown copy's activation is answered. The job is re-queued to resume
    from that checkpoint, holding no GPU; a back, it is launched once from it, on as many
    GPUs as a has, and the grown copy is stopped."""
    from scheduler.policy.types import PolicyConfig

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS, policy_config=PolicyConfig(grow_idle_s=0.3))
    f = Fake(sched.address, gpus={"a": 2})
    beats = Beats(f)
    try:
        job_id, launch, shim, warm = growing_on_a(f, beats)
        activate = _next_command(f, "a", "activate")  # the source checkpointed; never answered
        checkpoint = activate.activate.restore_checkpoint
        assert checkpoint == f"/ram/a/{job_id}/migrate-{warm.incarnation}", checkpoint
        shim.close()  # the source's process exited after its checkpoint
        beats.silence("a")
        waiting = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_QUEUED and j, 15)
        reasons = [t.reason for t in waiting.history]
        assert any("its server a went down mid-migration; will resume from step 42 (its checkpoint is on a)" in r
                   for r in reasons), reasons
        assert _allocated(f) == {"a": (2, 0)}
        f.streams.pop("a").cancel()
        f.register("a", 2)
        beats.run("a")
        relaunch = _launch_confirmed(f, "a")
        beats.run("a", (job_id, relaunch.incarnation))
        assert relaunch.restore_checkpoint == checkpoint and not relaunch.warm, relaunch
        assert relaunch.incarnation not in (launch.incarnation, warm.incarnation)
        assert (job_id, warm.incarnation) in f.heartbeat("a", (job_id, warm.incarnation))
        job = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and j, 10)
        assert len(job.placement) == len(relaunch.gpu_indices) and _allocated(f)["a"][1] <= 2
        assert not any("step 0" in t.reason for t in job.history), [t.reason for t in job.history]
    finally:
        beats.close()
        f.close()


def test_a_command_lost_with_its_helpers_stream_comes_again_on_the_next_one(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A launch written into a helper's command stream just before its link went down
    never arrives: the connection dies with it (the helper ends its session when a
    heartbeat goes unanswered, and opens a new one). The helper's next stream gets the
    launch again, the same command (a helper runs a command id once), and the job starts;
    before, the launch waited out its timeout (60 s by default) unanswered, was withdrawn
    and the job placed again a heartbeat timeout later."""
    settings = Settings(heartbeat_interval_s=0.2, down_after_s=10.0, command_timeout_s=30.0)
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=settings)
    f = Fake(sched.address, gpus={"a": 1})
    beats = Beats(f)
    try:
        beats.run("a")
        job_id = f.submit()
        lost = _next_command(f, "a", "launch")  # in the connection when it died
        f.streams.pop("a").cancel()
        f.register("a")  # the helper's new session
        reopened = time.monotonic()
        again = _next_command(f, "a", "launch")
        after_s = time.monotonic() - reopened
        assert again.command_id == lost.command_id and again.launch == lost.launch, again
        assert after_s < 5.0, f"sent again {after_s:.1f}s after the new stream opened"
        f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(server="a", command_id=again.command_id, ok=True))
        beats.run("a", (job_id, again.launch.incarnation))
        f.shim(job_id, again.launch.incarnation)
        job = wait_for(lambda: (j := f.job(job_id)).state == common_pb2.JOB_STATE_RUNNING and j, 10)
        assert [common_pb2.JobState.Name(t.to_state) for t in job.history] == ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING"]
    finally:
        beats.close()
        f.close()


def test_a_server_no_peer_can_stream_to_gets_no_more_jobs_to_fetch_and_the_job_resumes_where_its_checkpoint_is(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A one-way partition: x's helper reaches the scheduler (its heartbeats arrive, it runs
    a job), but nothing reaches x's agent (a firewall, a route missing one way), so every
    checkpoint streamed to x fails. y's job is lost and its checkpoint is on y, whose GPU is
    free again. The policy first places it on x (beside the job there); the fetch fails;
    then x gets no new job for a while, and the job resumes on y from its checkpoint. Before,
    x, running a job, was still offered to the policy: the job was placed there and refused
    ten times, then started over from step 0 (its 42 steps lost).

    No server is lost here: a server is down after 5 s without a heartbeat (the refused
    job's fence, before it goes back to y). With 2 s, the heartbeats of Beats, in this
    process beside the scheduler, came more than 2 s apart at load 25: x was called down
    and its stream ended before its launch ("no launch command for x", 1 run in 15)."""
    settings = Settings(heartbeat_interval_s=0.2, down_after_s=5.0, command_timeout_s=5.0, checkpoint_interval_s=0.5)
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=settings)
    f = Fake(sched.address, gpus={"y": 1}, agents=True)
    beats = Beats(f)
    try:
        beats.run("y")
        lost = f.submit()
        first = _launch_confirmed(f, "y")
        beats.run("y", (lost, first.incarnation))
        shim = f.shim(lost, first.incarnation)  # acks its periodic checkpoints: step 42
        path = f"/ram/y/{lost}/periodic-{first.incarnation}"
        wait_for(lambda: f"step 42 at {path}" in _events(f, "job.checkpoint", job_id=lost), 15)
        f.register("x", 2)
        beats.run("x")
        other = f.submit()  # runs on x: x has a job (its affinity), and a free GPU
        on_x = _launch_confirmed(f, "x")
        beats.run("x", (other, on_x.incarnation))
        f.shim(other, on_x.incarnation)
        shim.close()
        beats.run("y")  # the job's process on y is lost
        fetch = _next_command(f, "y", "transfer")
        assert fetch.transfer.dest_address == AGENTS["x"], fetch
        f.helper.ReportCommandResult(_refused_by_old_address("y", fetch))
        again = _launch_confirmed(f, "y")
        assert (again.job_id, again.restore_checkpoint) == (lost, path), again
        job = f.job(lost)
        reasons = [t.reason for t in job.history]
        assert [g.server for g in job.placement] == ["y"], reasons
        assert len([r for r in reasons if "could not fetch" in r]) == 1, reasons
        assert not any("step 0" in r or "starts over" in r for r in reasons), reasons
        assert _events(f, "server.launch_failed", server="x"), "x's refusal was not said"
    finally:
        beats.close()
        f.close()


def test_a_helper_registered_again_without_its_failed_gpu_gets_jobs_only_on_the_gpus_it_has(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """GPU 0 of a two-GPU server failed; its helper registers again with GPU 1 alone (what
    NVML then lists). New jobs are launched on GPU 1, the one it has; before, the policy
    placed by count (one GPU: index 0) and launched them on GPU 0, the GPU that had failed,
    and with two 1-GPU jobs the second waited while GPU 1 stood idle."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=NO_HOST_LOST)
    f = Fake(sched.address, gpus={"a": 2})
    beats = Beats(f)
    try:
        f.helper.Register(helper_pb2.RegisterServerRequest(
            name="a", gpus=[common_pb2.Gpu(index=1)], ramdisk="/ram/a"))
        beats.run("a")
        first, second = f.submit(), f.submit()
        launch = _launch_confirmed(f, "a")
        assert list(launch.gpu_indices) == [1], launch
        beats.run("a", (launch.job_id, launch.incarnation))
        job = wait_for(lambda: (j := f.job(launch.job_id)).state == common_pb2.JOB_STATE_RUNNING and j, 10)
        assert [(p.server, p.index) for p in job.placement] == [("a", 1)], job.placement
        # The server counts the one GPU it has; the other job may already share it in a
        # time-slice group (then two jobs are placed on it), never on GPU 0.
        gpus, allocated = _allocated(f)["a"]
        assert gpus == 1 and allocated in (1, 2), (gpus, allocated)
        # The other job waits for the one GPU (or takes its turn on it), never GPU 0.
        other = second if launch.job_id == first else first
        time.sleep(1.0)
        assert all(p.index == 1 for p in f.job(other).placement), f.job(other).placement
    finally:
        beats.close()
        f.close()


def test_a_drain_lists_the_job_it_parked_however_fast_it_left(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """DrainServer answers with what its pass did to each job on the server. It read the
    jobs on the server after the pass: a job whose park had already queued it (its shim
    answering at once) was left out, and `gandiva drain` said "0 job(s) on it" with no
    "park" line (test_drain_live -k no_room failed so under load). Now every job that was
    on the server when the drain began is listed, with its move."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=NO_HOST_LOST)
    f = Fake(sched.address, gpus={"y": 2, "x": 1}, agents=True)
    beats = Beats(f)
    try:
        job_id, launch = _two_gpu_job_on_y(f, beats, wait_for)
        wait_for(lambda: sched.server.core.runtimes.connected(job_id, launch.incarnation))
        answer = f.api.DrainServer(scheduler_pb2.CordonServerRequest(server="y"), timeout=30)
        assert [(j.job_id, j.action) for j in answer.jobs] == [(job_id, "park")], answer
    finally:
        beats.close()
        f.close()


def test_a_drain_during_a_periodic_checkpoint_lists_the_move_that_follows_it(
        make_scheduler: Any, sqlite_url: str, wait_for: Any) -> None:
    """A drain whose first pass finds the job with a command in flight (a periodic
    checkpoint: SETTINGS takes one every 0.5 s) starts no move for it then. DrainServer
    answered with that pass alone: `gandiva drain` said "moving (running, a command in
    flight)" for a job nothing was moving. Now the answer waits for the pass that moves
    it. Forced here: the job is held in flight until a pass has found it so."""
    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=NO_HOST_LOST)
    engine = sched.server.engine
    f = Fake(sched.address, gpus={"y": 2, "x": 1}, agents=True)
    beats = Beats(f)
    try:
        job_id, launch = _two_gpu_job_on_y(f, beats, wait_for)
        wait_for(lambda: sched.server.core.runtimes.connected(job_id, launch.incarnation))
        found: list[str] = []
        real_step = engine.drainer.step

        async def step() -> list:
            moves = await real_step()
            if any(m.job_id == job_id and m.action == "moving" for m in moves):
                found.append(job_id)
                engine.inflight.discard(job_id)  # the checkpoint ends after that pass
            return moves

        async def hold() -> None:
            engine.drainer.step = step  # type: ignore[method-assign]
            engine.inflight.add(job_id)

        sched.call(hold())
        answer = f.api.DrainServer(scheduler_pb2.CordonServerRequest(server="y"), timeout=30)
        # At least one pass met it in flight (a periodic checkpoint may follow the release,
        # every 0.5 s here, and be met by another pass: the answer still waits for the park).
        assert found, "no drain pass met the job with its command in flight"
        assert [(j.job_id, j.action) for j in answer.jobs] == [(job_id, "park")], answer
    finally:
        beats.close()
        f.close()
