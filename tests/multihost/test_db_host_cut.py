"""The database's host cut off while a job trains (PostgreSQL on a host of its own, its
link cut so that packets are dropped, not refused: a partition, the database's host lost
behind a router). The scheduler, a helper and its job are real processes on their hosts
(tests/multihost/conftest.py), the job the helpers' fake job.

What a user sees meanwhile: the job trains on for its first seconds, its helper's heartbeats
answered from memory until another scheduler could have taken the database, then freezes at
its lease (a standby must not find it training); `gandiva get job` answers UNAVAILABLE with the outage's line
("the scheduler is up; its database is unreachable since ...") instead of hanging until
the client gives up (a statement on a pooled connection waited until the kernel stopped
retransmitting, about 15 min); a submission is refused the same way. Once the link is
back: the scheduler goes on (before, it stopped itself, naming itself as "another
scheduler" holding its database: its advisory lock's session was still open on the
server), the job trains on in the same process, its history untouched; the submission
sent again with its request id creates one job, once."""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

from .conftest import SCHED_PORT, Cluster
from .test_crowded_host_cut import _fake_job

pytestmark = [pytest.mark.slow, pytest.mark.pg]

LEASE_S = 3.0  # (the harness's heartbeat timeout of 5 s)


def _steps(c: Cluster) -> int:
    """The job's steps done so far, as it logged them itself (the scheduler cannot record
    them while its database is cut off)."""
    path = c.tmp / "steps"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("multihost", [{"postgres": True}], indirect=True)
def test_the_database_host_cut_off_answers_in_seconds_and_the_cluster_goes_on(multihost: Cluster) -> None:
    c = multihost
    c.add_helper("a", gpus=3)
    fake = _fake_job(c.tmp)
    spec = common_pb2.JobSpec(name="j", command=[fake], gpus=1, workdir=str(c.tmp),
                              env={"FAKE_STEPS": "0", "FAKE_STEP_S": "0.05", "FAKE_STEP_LOG": str(c.tmp / "steps")})
    job_id = c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    other = c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="o", command=[fake], gpus=1, workdir=str(c.tmp), env={"FAKE_STEPS": "0", "FAKE_STEP_S": "0.05"}))).job.id
    c.wait(lambda: c.job(job_id).steps >= 5 and c.job(other).steps >= 5, 60)
    (pid,) = c.pids_of(job_id)
    (lost,) = c.pids_of(other)
    c.net.cut("db")
    cut_at = time.monotonic()
    try:
        # A process that dies during the cut: its helper's report of it waits for the database.
        os.kill(lost, signal.SIGKILL)
        # The client's deadline is generous: only a call that hangs reaches it.
        with pytest.raises(grpc.RpcError) as err:
            c.stub.GetJob(scheduler_pb2.GetJobRequest(id=job_id), timeout=60)
        print(f"\nGetJob answered {time.monotonic() - cut_at:.1f}s into the cut: {err.value.details()}")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert err.value.details().startswith("the scheduler is up; its database is unreachable since "), \
            err.value.details()
        second = common_pb2.JobSpec(name="k", command=[fake], gpus=1, workdir=str(c.tmp),
                                    env={"FAKE_STEPS": "20", "FAKE_STEP_S": "0.01"})
        asked = scheduler_pb2.SubmitJobRequest(spec=second, request_id="during-the-cut")
        with pytest.raises(grpc.RpcError) as err:
            c.stub.SubmitJob(asked, timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        # The helper's heartbeats were answered from memory only until another scheduler could
        # have taken the database and called its server down (SchedulerCore.memory_answers_s:
        # 6 s here, counted from the lock's last confirmation), then its lease ran out: over
        # 10 s into the cut its job is frozen. Before, they were answered for the whole cut, and
        # a standby that took the database ran the same job elsewhere beside it.
        assert time.monotonic() - cut_at > 6.0 + LEASE_S + 1.0
        frozen = _steps(c)
        time.sleep(1.0)
        assert _steps(c) == frozen, f"the job trained on {time.monotonic() - cut_at:.0f}s into the cut"
    finally:
        c.net.restore("db")
    c.wait(lambda: c.job(job_id).steps > 0 and c.servers() == {"a": True}, 60)

    def submitted() -> str | None:
        """Sent again, as `gandiva submit` does while the answer is UNAVAILABLE: the first
        writes after the link is back wait for the lock's session to be taken again (a
        connect begun during the cut may still be timing out)."""
        try:
            return str(c.stub.SubmitJob(asked, timeout=30).job.id)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    again = c.wait(submitted, 60)
    assert c.stub.SubmitJob(asked, timeout=30).job.id == again
    c.wait(lambda: c.job(again).state == common_pb2.JOB_STATE_SUCCEEDED, 60)
    before = c.job(job_id).steps
    c.wait(lambda: c.job(job_id).steps > before + 10, 60)  # training again
    assert c.procs["scheduler"].poll() is None, (c.tmp / "scheduler.log").read_text()[-3000:]
    assert c.pids_of(job_id) == [pid]  # the same process: neither restarted nor duplicated
    done = c.job(job_id)
    assert [t.to_state for t in done.history] == [common_pb2.JOB_STATE_QUEUED, common_pb2.JOB_STATE_RUNNING], \
        [t.reason for t in done.history]
    jobs = [j.id for j in c.stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs]
    assert sorted(jobs) == sorted([job_id, other, again]), jobs
    # The dead process's exit, reported during the cut, was recorded once it was back.
    c.wait(lambda: len(c.job(other).history) > 2, 60)
    print("the job whose process died during the cut:", [t.reason for t in c.job(other).history])


@pytest.mark.full
@pytest.mark.parametrize("multihost", [{"postgres": True}], indirect=True)
def test_a_standby_scheduler_takes_the_database_of_one_whose_host_was_cut_off(multihost: Cluster) -> None:
    """The scheduler's host cut off for good (its process still runs there): a standby
    scheduler started on another host takes the database once PostgreSQL has ended the
    lost scheduler's session (its keepalives: about 11 s); before, it was refused ("another
    scheduler is running on this database") for the kernel's 2 h. When the old host's link
    comes back, the old scheduler stops, saying another took the database. The mechanism
    (the sessions' keepalives and the lock taken back) runs by default in the test above."""
    c = multihost
    ns, addr = c.net.add_host("standby")
    c.net.cut("sched")
    cut_at = time.monotonic()
    refused = 0
    port_file = c.tmp / "standby.port"
    while True:
        standby = c._spawn("standby", ns, [
            "scheduler", "--listen", f"{addr}:50051", "--db", c.db_url, "--insecure", "--port-file", str(port_file)])
        c.wait(lambda p=standby: port_file.exists() or p.poll() is not None, 60)  # type: ignore[misc]
        if port_file.exists():
            break
        log = (c.tmp / "standby.log").read_text()
        assert standby.returncode == 2 and "another scheduler is running on this database" in log, log[-2000:]
        refused += 1
        assert time.monotonic() - cut_at < 120, f"the standby was refused {refused} times over 120 s"
        time.sleep(1)
    print(f"\nthe standby took the database {time.monotonic() - cut_at:.1f}s after the cut ({refused} refusals)")
    c.net.restore("sched")
    old = c.procs["scheduler"]
    c.wait(lambda: old.poll() is not None, 60)
    assert old.returncode == 2
    assert "it took the database while the connection was lost" in (c.tmp / "scheduler.log").read_text()


@pytest.mark.full
@pytest.mark.parametrize("multihost", [{"postgres": True}], indirect=True)
def test_a_job_that_ends_during_the_cut_its_helper_restarted_meanwhile_is_trained_once(multihost: Cluster) -> None:
    """The database's host cut off (packets dropped); a job ends during the cut and its
    helper is restarted (SIGTERM, then started again on the same host, name and log
    directory) before the link is back. Its exit, kept on the helper's disk, comes with the
    new helper's registration: the job is recorded SUCCEEDED having trained each step once.
    Before, the exit was lost with the stopped helper, and the job was re-queued once the
    link was back and trained a second time. The mechanism runs by default in
    tests/migration_helper/test_helper_faults.py -k restarted_meanwhile (connections refused)."""
    c = multihost
    c.add_helper("a")
    steps, log = 60, c.tmp / "steps"
    spec = common_pb2.JobSpec(name="k", command=[_fake_job(c.tmp)], gpus=1, workdir=str(c.tmp),
                              env={"FAKE_STEPS": str(steps), "FAKE_STEP_S": "0.05", "FAKE_STEP_LOG": str(log)})
    job_id = c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    c.wait(lambda: _steps(c) >= 10, 60)
    c.net.cut("db")
    cut_at = time.monotonic()
    try:
        c.wait(lambda: _steps(c) == steps and not c.pids_of(job_id), 30)  # ended, unrecorded
        ended = time.monotonic() - cut_at
        old = c.procs["a"]
        old.send_signal(signal.SIGTERM)
        assert old.wait(60) == 0
        ns = c.net.hosts["a"][0]
        c._spawn("a", ns, [
            "helper", "--server-name", "a", "--gpus", "1", "--scheduler", f"{c.sched_addr}:{SCHED_PORT}",
            "--listen", f"{c.net.hosts['a'][1]}:0", "--ramdisk", str(c.tmp / "rd" / "a"),
            "--shared-root", str(c.tmp / "rd"), "--log-dir", str(c.tmp / "logs"), "--insecure"])
        time.sleep(3.0)  # it tries to register meanwhile
        print(f"\nthe job ended {ended:.1f}s into the cut; the helper restarted by "
              f"{time.monotonic() - cut_at:.1f}s")
    finally:
        c.net.restore("db")
    done = c.wait(lambda: (j := c.job(job_id)).state == common_pb2.JOB_STATE_SUCCEEDED and j, 90)
    assert isinstance(done, common_pb2.Job)
    trained = log.read_text().splitlines()
    assert len(trained) == steps and len({line.split()[0] for line in trained}) == 1, trained[-5:]
    assert [t.to_state for t in done.history].count(common_pb2.JOB_STATE_RUNNING) == 1, \
        [t.reason for t in done.history]
    assert done.steps == steps
