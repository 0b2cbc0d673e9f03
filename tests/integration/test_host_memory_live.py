"""Host memory bounds time-slicing on a live cluster: a real helper told how much host
memory its jobs may hold (--host-memory), real TensorFlow jobs holding known ballast, the
scheduler over real gRPC on SQLite. The server takes as many jobs as fit, although
max_jobs_per_gpu would let more time-share its GPU; the next waits, saying why, and
starts when a job ends. What is stored is what the helper measured."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from gandiva_cli.main import main
from protos.gandiva.v1 import common_pb2, scheduler_pb2

pytestmark = [pytest.mark.tf, pytest.mark.slow]

MIB = 1 << 20
GIB = 1 << 30
HOST = 3 << 30  # the helper's --host-memory
ASSUMED = 512 * MIB  # the policy's job_host_memory_bytes: a job not measured yet
MARGIN = 400 * MIB

BALLAST = """\
import sys
ballast = b"\\1" * (int(sys.argv.pop(1)) << 20)  # held, resident, for the job's whole life
from tf_runtime.examples import mlp
sys.exit(mlp.main())
"""


def job_processes(job_id: str) -> dict[int, str]:
    """pid -> launch incarnation of every process of ``job_id`` on this machine (the helper
    gives each its GANDIVA_JOB_ID and GANDIVA_INCARNATION)."""
    mark = f"GANDIVA_JOB_ID={job_id}\0".encode()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if mark in env:
            inc = next((v for v in env.split(b"\0") if v.startswith(b"GANDIVA_INCARNATION=")), b"=")
            out[int(name)] = inc.split(b"=", 1)[1].decode()
    return out


def resident(job_id: str) -> int:
    total = 0
    for pid in job_processes(job_id):
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total


def test_host_memory_bounds_the_jobs_a_server_holds(policy_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cluster = policy_cluster(job_host_memory_bytes=ASSUMED)
    cluster.add_helper("s1", 1, "--host-memory", "3GiB")
    server = cluster.stub.ListServers(scheduler_pb2.ListServersRequest()).servers[0]
    assert server.host_memory_bytes == HOST  # stored as the helper reported it
    budget = HOST * server.host_memory_use
    script = tmp_path / "ballast.py"
    script.write_text(BALLAST)

    def submit(name: str, ballast_mib: int, steps: int = 100000) -> str:
        spec = common_pb2.JobSpec(name=name, gpus=1, workdir=str(tmp_path), command=[
            "python", str(script), str(ballast_mib), "--steps", str(steps), "--step-sleep", "0.02"])
        return cluster.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id

    def host_memory(job_id: str) -> int:
        return cluster.job(job_id).host_memory_bytes

    # J1: TensorFlow alone. Once it trains, its resident set T is what a job holds here
    # besides its ballast.
    j1 = submit("j1", 0)
    cluster.wait_for(lambda: cluster.job(j1).steps > 0, 90)
    t = resident(j1)
    assert 100 * MIB < t < budget / 2, t
    # J2 holds enough ballast that J1 and J2 leave no room for a third job (charged at
    # ASSUMED until measured) by MARGIN, while J1 alone left room by far more.
    ballast = int((budget - 2 * t - ASSUMED + MARGIN) // MIB)
    j2 = submit("j2", ballast)
    cluster.wait_for(lambda: host_memory(j2) > ballast * MIB, 90)
    cluster.wait_for(lambda: cluster.job(j2).steps > 0, 90)
    # What the scheduler stored is what the helper measured: the same as this process sees,
    # once the helper's next report (every 5 s) has caught up with a job still growing.
    def pair(job_id: str) -> tuple[int, int] | None:
        stored, now = host_memory(job_id), resident(job_id)
        return (stored, now) if abs(stored - now) < max(0.1 * now, 64 * MIB) else None

    for job_id in (j1, j2):
        stored, now = cluster.wait_for(lambda job_id=job_id: pair(job_id), 30)
        assert abs(stored - now) < max(0.1 * now, 64 * MIB), (job_id, stored, now)
    assert host_memory(j1) + host_memory(j2) + ASSUMED > budget + MARGIN / 2

    # J3 waits although its GPU could be time-shared 16 ways: no host memory left.
    j3 = submit("j3", 0, steps=50)
    cluster.wait_for(lambda: "host memory of s1 is full" in cluster.job(j3).message, 30)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert cluster.job(j3).state == common_pb2.JOB_STATE_QUEUED
        (s1,) = cluster.stub.ListServers(scheduler_pb2.ListServersRequest()).servers
        assert sorted({j for g in s1.gpu_list for j in g.jobs}) == sorted([j1, j2])
        assert budget - ASSUMED < s1.host_memory_used_bytes <= budget + MARGIN
        time.sleep(0.3)
    # Users see it: the reason in the job listing, host memory held / total per server.
    at = ["--scheduler", cluster.sched.address]
    capsys.readouterr()
    assert main(["get", "jobs", j3, "-o", "wide", *at]) == 0
    assert "the host memory of s1 is full" in capsys.readouterr().out
    assert main(["get", "servers", "--no-headers", *at]) == 0
    used, total = capsys.readouterr().out.split()[7].removesuffix("Gi").split("/")
    assert total == "3.0" and abs(float(used) - s1.host_memory_used_bytes / GIB) < 0.2
    # Time-slicing went on meanwhile: the suspended job's memory counted all along.
    assert {cluster.job(j).state for j in (j1, j2)} <= {common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED}

    # J2 ends: J3 starts beside J1.
    cluster.stub.KillJob(scheduler_pb2.JobActionRequest(id=j2, reason="make room"))
    cluster.wait_for(lambda: cluster.job(j3).state in (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUCCEEDED), 30)
    (s1,) = cluster.stub.ListServers(scheduler_pb2.ListServersRequest()).servers
    assert sorted({j for g in s1.gpu_list for j in g.jobs}) == sorted([j1, j3])
    cluster.wait_for(lambda: not job_processes(j2), 30)

    # Nothing lost or run twice: J1 never left its server, J3 started once, and each
    # job's processes belong to one launch.
    hist = cluster.job(j1).history
    assert not [tr for tr in hist if tr.to_state == common_pb2.JOB_STATE_QUEUED and tr.from_state]
    starts = [tr for tr in cluster.job(j3).history if tr.from_state == common_pb2.JOB_STATE_QUEUED]
    assert len(starts) == 1
    for job_id in (j1, j3):
        assert len(set(job_processes(job_id).values())) <= 1
    assert cluster.job(j1).state in (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_SUSPENDED)
