"""A host cut off while many jobs are on it, over the real Helper and Runtime APIs (a
real scheduler, gRPC and SQLite; the test answers for the helpers and the shims, as
helpers that confirm every launch, stop what they are told and list what they run in
each heartbeat). Twelve 1-GPU jobs time-share a's four GPUs; b (two GPUs) cannot take
them all. a's link is cut: every job must go back to the queue once, none lost, none
launched twice at once, no GPU held by two running jobs or by a queued one; a back,
all twelve of its old copies are named stale and each job runs once."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, helper_pb2, runtime_pb2, scheduler_pb2
from scheduler.core import Settings

from .test_fencing import Fake, scripted_shim

QUEUED, RUNNING, SUSPENDED = common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED
SETTINGS = Settings(heartbeat_interval_s=0.2, down_after_s=2.0, command_timeout_s=5.0, checkpoint_interval_s=0)


class Hosts:
    """Fake helpers for `f`'s servers: each launch confirmed at once and its shim connected
    (acking every command while its host is not cut), each stop obeyed, heartbeats every
    0.1 s listing the launches each runs. A cut host says nothing and obeys nothing."""

    def __init__(self, f: Fake) -> None:
        self.f = f
        self.running: dict[str, dict[str, str]] = {}  # server -> job -> incarnation
        self.launches: list[tuple[str, str, str]] = []  # (server, job, incarnation), in order
        self.cut: set[str] = set()
        self.overlaps: list[str] = []  # a job with live launches on two reachable servers
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._beat, daemon=True)]
        self._threads[0].start()

    def serve(self, server: str) -> None:
        """Start answering for `server` (registered): its command stream and heartbeats."""
        with self.lock:
            self.running[server] = {}
            self.cut.discard(server)
        t = threading.Thread(target=self._obey, args=(server, self.f.commands(server)), daemon=True)
        t.start()
        self._threads.append(t)

    def _answer(self, server: str) -> Any:
        def answer(cmd: Any, seen: list[Any]) -> runtime_pb2.CommandAck | None:
            if server in self.cut:
                return None  # behind the cut link
            return runtime_pb2.CommandAck(command_id=cmd.command_id, ok=True, step=10 * len(seen))
        return answer

    def _obey(self, server: str, stream: Any) -> None:
        try:
            for cmd in stream:
                if server in self.cut:
                    continue
                body = cmd.WhichOneof("body")
                if body == "launch":
                    job, inc = cmd.launch.job_id, cmd.launch.incarnation
                    with self.lock:
                        self.running[server][job] = inc
                        self.launches.append((server, job, inc))
                        live = [s for s, jobs in self.running.items() if job in jobs and s not in self.cut]
                        if len(live) > 1:
                            self.overlaps.append(f"{job} launched on {server} while live on {live}")
                    self.f.shims.append(scripted_shim(self.f.ch, job, inc, self._answer(server)))
                elif body == "stop":
                    with self.lock:
                        jobs = self.running.get(server, {})
                        if jobs.get(cmd.stop.job_id) == cmd.stop.incarnation or not cmd.stop.incarnation:
                            jobs.pop(cmd.stop.job_id, None)
                self.f.helper.ReportCommandResult(helper_pb2.HelperCommandResult(
                    server=server, command_id=cmd.command_id, ok=True))
        except (grpc.RpcError, ValueError):
            pass  # the stream ended (the scheduler called the server down, or the test is over)

    def _beat(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                beats = {s: list(jobs.items()) for s, jobs in self.running.items() if s not in self.cut}
            for server, pairs in beats.items():
                try:
                    reply = self.f.helper.Heartbeat(helper_pb2.HeartbeatRequest(name=server, running=[
                        helper_pb2.JobIncarnation(job_id=j, incarnation=i) for j, i in pairs]), timeout=5)
                except grpc.RpcError:
                    continue
                with self.lock:  # the helper kills what the answer names stale
                    for stale in reply.stop:
                        if self.running.get(server, {}).get(stale.job_id) == stale.incarnation:
                            del self.running[server][stale.job_id]

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(10)


def _held(f: Fake) -> tuple[list[str], list[str]]:
    """GPUs held wrongly (by a queued job, past the server's count), and GPUs held by two
    running jobs, as the scheduler's API lists its jobs and servers now."""
    jobs = f.api.ListJobs(scheduler_pb2.ListJobsRequest()).jobs
    count = {s.name: s.gpus for s in f.api.ListServers(scheduler_pb2.ListServersRequest()).servers}
    wrong, running = [], {}
    for job in jobs:
        for p in job.placement:
            if job.state == QUEUED or p.index >= count.get(p.server, 0):
                wrong.append(f"{p.server}/{p.index} held by {job.id} ({common_pb2.JobState.Name(job.state)})")
            if job.state == RUNNING:
                running.setdefault(f"{p.server}/{p.index}", []).append(job.id)
    return wrong, [f"{g} held by running jobs {js}" for g, js in running.items() if len(js) > 1]


@pytest.mark.parametrize("back", ["later", "at_once"])
def test_a_host_cut_off_with_twelve_jobs_requeues_each_once_and_places_none_twice(
        make_scheduler: Any, sqlite_url: str, wait_for: Any, back: str) -> None:
    """`later`: a comes back once b has taken what it can; `at_once`: as soon as a is
    called down, its helper registering again while the rounds re-place its jobs."""
    from scheduler.policy.types import PolicyConfig

    sched = make_scheduler(sqlite_url, tick_s=0.1, settings=SETTINGS, policy_config=PolicyConfig(
        quantum_s=1.0, enable_packing=False, enable_migration=False, max_jobs_per_gpu=4))
    f = Fake(sched.address, gpus={"a": 4})
    hosts = Hosts(f)
    wrong: list[str] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.wait(0.2):
            try:
                wrong.extend(_held(f)[0])
            except grpc.RpcError:
                return

    def a_back() -> None:
        """a's helper registers again; its first heartbeat lists the twelve old copies
        (frozen by its lease): every one is named stale."""
        f.streams.pop("a").cancel()
        f.register("a", 4)
        stale = {(s.job_id, s.incarnation) for s in f.helper.Heartbeat(helper_pb2.HeartbeatRequest(
            name="a", running=[helper_pb2.JobIncarnation(job_id=j, incarnation=i) for j, i in first.items()])).stop}
        assert stale == set(first.items())
        hosts.serve("a")

    threading.Thread(target=watch, daemon=True).start()
    try:
        hosts.serve("a")
        jobs = [f.submit() for _ in range(12)]
        wait_for(lambda: all(f.job(j).state in (RUNNING, SUSPENDED) for j in jobs)
                 and len({hosts.running["a"].get(j) for j in jobs} - {None}) == 12, 30)
        f.register("b", 2)
        hosts.serve("b")
        first = {j: hosts.running["a"][j] for j in jobs}
        before = len(hosts.launches)

        hosts.cut.add("a")  # a's link goes: no heartbeat, no answer, no command obeyed
        wait_for(lambda: not f.servers()["a"], 15)
        if back == "at_once":
            a_back()
        else:
            # b's two GPUs take what they can (4 jobs each, time-shared), the rest waits.
            wait_for(lambda: sum(f.job(j).state in (RUNNING, SUSPENDED) for j in jobs) == 8, 15)
            # Once the rounds settle, b runs exactly the jobs not queued, each launched there once.
            wait_for(lambda: {j for s, j, _ in hosts.launches if s == "b"}
                     == {j for j in jobs if f.job(j).state != QUEUED}, 10)
            on_b = [j for s, j, _ in hosts.launches if s == "b"]
            assert len(on_b) == len(set(on_b)) == 8, on_b
            assert sum(f.job(j).state == QUEUED for j in jobs) == 4
            a_back()
        wait_for(lambda: all(f.job(j).state in (RUNNING, SUSPENDED) for j in jobs), 20)
        wait_for(lambda: not _held(f)[1], 10)  # once its starts are suspended, one running job a GPU
        for j in jobs:
            history = [t.reason for t in f.job(j).history]
            assert len([r for r in history if "its server a went down" in r]) == 1, (j, history)
            live = [s for s, run in hosts.running.items() if j in run]
            assert len(live) == 1 and hosts.running[live[0]][j] != first[j], (j, live)
        again = [j for _, j, _ in hosts.launches[before:]]
        assert sorted(again) == sorted(jobs), "each job launched once after the cut"
        watching.set()
        assert hosts.overlaps == []
        assert wrong == [], "\n".join(wrong)
    finally:
        watching.set()
        hosts.close()
        f.close()
