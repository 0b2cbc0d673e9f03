"""`gandiva get usage` through the real scheduler and CLI, with a scripted helper whose jobs
end when the test says (tests/scheduler/test_usage_units.py has each rule of the accounting).
Before session 48 nothing answered "who had the GPUs over a period, and who waited":
`gandiva get users` summed every job's GPU time since the job began, with no period and no
waits."""

from __future__ import annotations

import json
import time

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2


def test_usage_over_a_period_per_user_and_job(gandiva, stub, helper, wait_for) -> None:  # type: ignore[no-untyped-def]
    """alice's 1-GPU job runs; bob's 2-GPU job waits in the queue behind it (the server has 2
    GPUs) until it ends, then runs. The accounting says what each job's own record says: GPU
    time as the job's gpu_seconds, bob's wait as his job's submission to its first start, and
    a period that ends before bob's job started shows it still waiting."""
    def submit(name: str, user: str, gpus: int) -> str:
        spec = common_pb2.JobSpec(name=name, user=user, command=["python", "t.py"], gpus=gpus)
        return str(stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id)

    def get(job: str) -> common_pb2.Job:
        return stub.GetJob(scheduler_pb2.GetJobRequest(id=job))

    a = submit("small", "alice", 1)
    wait_for(lambda: get(a).state == common_pb2.JOB_STATE_RUNNING)
    b = submit("big", "bob", 2)
    time.sleep(0.5)
    between = time.time()
    time.sleep(0.5)
    helper.exit(a, 0)
    wait_for(lambda: get(b).state == common_pb2.JOB_STATE_RUNNING)
    time.sleep(0.3)
    helper.exit(b, 0)
    wait_for(lambda: get(b).state == common_pb2.JOB_STATE_SUCCEEDED)
    done_a, done_b = get(a), get(b)

    got = gandiva("get", "usage", "--since", "1h", "-o", "json")
    assert got.code == 0, got.err
    report = json.loads(got.out)
    users = {u["user"]: u for u in report["users"]}
    assert list(users) == ["bob", "alice"] or list(users) == ["alice", "bob"]
    assert abs(users["alice"]["gpu_seconds"] - done_a.gpu_seconds) < 1e-6
    assert abs(users["bob"]["gpu_seconds"] - done_b.gpu_seconds) < 1e-6
    bob_started = min(t.at for t in done_b.history if t.to_state == common_pb2.JOB_STATE_RUNNING)
    assert users["bob"]["started"] == 1 and users["bob"]["ended"] == 1
    assert abs(users["bob"]["wait_max_seconds"] - (bob_started - done_b.submitted_at)) < 1e-6
    assert abs(users["bob"]["queued_seconds"] - (bob_started - done_b.submitted_at)) < 1e-6
    assert report["total"]["jobs"] == 2
    # Since session 49, from the GPUs each held (alice 1, bob 2, nothing packed): the same here,
    # and the cluster's side: 2 GPUs up since the helper registered, busy while a job ran.
    for u, done in (("alice", done_a), ("bob", done_b)):
        assert users[u]["held_gpu_seconds"] == pytest.approx(done.gpu_seconds, abs=1e-3), users[u]
    cluster = report["cluster"]
    assert cluster["busy_gpu_seconds"] == pytest.approx(done_a.gpu_seconds + done_b.gpu_seconds, abs=1e-3), cluster
    first_event = stub.ListEvents(scheduler_pb2.ListEventsRequest(limit=1)).events[0]  # n1 registered
    assert cluster["busy_gpu_seconds"] < cluster["capacity_gpu_seconds"] <= 2 * (time.time() - first_event.at) + 1e-3, \
        (cluster, first_event)
    assert cluster["busy_fraction"] == pytest.approx(cluster["busy_gpu_seconds"] / cluster["capacity_gpu_seconds"])
    shown = gandiva("get", "usage", "--since", "1h").out.splitlines()
    assert shown[-1].startswith("cluster: ") and "GPU-hours of servers up" in shown[-1] and "busy (" in shown[-1], shown

    before = json.loads(gandiva("get", "usage", "--since", "1h", "--until", time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(between)) + f"{between % 1:.3f}"[1:], "--by", "job", "-o", "json").out)
    bobs = [j for j in before["jobs"] if j["user"] == "bob"]
    assert [(j["job_id"], j["state"], j["waiting"], j["gpu_seconds"]) for j in bobs] == [(b, "QUEUED", 1, 0.0)]

    table = gandiva("get", "usage", "--since", "1h", "--user", "bob")
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].startswith("from ") and lines[1].split()[:3] == ["USER", "JOBS", "GPU-HOURS"]
    assert lines[2].split()[:2] == ["bob", "1"] and len(lines) == 3  # one user: no TOTAL line

    refused = gandiva("get", "usage", "--since", "2099-01-01")
    assert refused.code == 2 and "since: the period starts at 209" in refused.err, refused.err  # (a UTC time)
    assert "give a start before" in refused.err
    reversed_ = gandiva("get", "usage", "--since", "1h", "--until", "2h")
    assert reversed_.code == 2 and "--until (" in reversed_.err and "is not after --since" in reversed_.err
    # A window longer than the clock's past is the whole history (it was refused with a
    # negative unix time the user never typed).
    everything = gandiva("get", "usage", "--since", "99999999999d", "-o", "json")
    assert everything.code == 0 and json.loads(everything.out)["total"]["jobs"] == 2, everything.err


def test_get_users_whose_jobs_all_ended_says_how_to_list_them(gandiva, stub, helper, wait_for) -> None:  # type: ignore[no-untyped-def]
    """`gandiva get users` leaves out users whose jobs have all ended (--all lists them): after
    `gandiva demo` it printed its header and nothing else, as if no one had used the cluster
    (`gandiva get usage` counted 1,024.8 GPU-seconds)."""
    spec = common_pb2.JobSpec(name="done", user="carol", command=["python", "t.py"], gpus=1)
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id
    wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job)).state == common_pb2.JOB_STATE_RUNNING)
    helper.exit(job, 0)
    wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job)).state == common_pb2.JOB_STATE_SUCCEEDED)
    shown = gandiva("get", "users")
    assert shown.code == 0 and "1 user whose jobs have all ended is not listed: --all lists them" in shown.out, shown
    assert "carol" in gandiva("get", "users", "--all").out
    assert json.loads(gandiva("get", "users", "-o", "json").out) == []  # (JSON: the rows only, as before)
