"""`gandiva wait ID... [--until running|done] [--timeout D] [-o json]` against a real scheduler:
a user who submitted with --no-wait (or a script) blocks until the job starts or ends, sees
each state change with its reason, and gets the outcome as the exit code. Before session 49
there was no such command: `gandiva get events --watch --job ID` never returned, and a script
polled `gandiva get jobs` in a loop."""

from __future__ import annotations

import json
import threading

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2


def _submit(stub, gpus: int, name: str) -> str:  # type: ignore[no-untyped-def]
    spec = common_pb2.JobSpec(name=name, command=["python", "train.py"], gpus=gpus)
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.id


def test_wait_blocks_until_a_job_starts_or_ends_and_says_why_each_state_changed(
        gandiva, stub, helper, wait_for) -> None:  # type: ignore[no-untyped-def]
    job = _submit(stub, 1, "small")
    started = gandiva("wait", job, "--until", "running")
    assert started.code == 0, started.out + started.err
    assert f"{job}  RUNNING  (Algorithm 1: " in started.out and "on n1" in started.out, started.out
    assert started.out.splitlines()[-1].startswith(f"job {job} (small) has started: RUNNING on n1:"), started.out

    def finish() -> None:
        helper.progress(job, steps=50, rate=5.0)
        helper.exit(job, 0)

    threading.Thread(target=finish, daemon=True).start()
    done = gandiva("wait", job, "-o", "json")
    assert done.code == 0, done.out + done.err
    (shown,) = json.loads(done.out)  # the job as `get jobs -o json` shows it; the lines on stderr
    assert (shown["id"], shown["state"], shown["steps"]) == (job, "SUCCEEDED", 50), shown
    assert f"{job}  SUCCEEDED" in done.err and "SUCCEEDED after 50 mini-batches" in done.err, done.err

    # A job that cannot start (2 GPUs, one of the 2 taken): --timeout gives up, saying why it waits.
    hog = _submit(stub, 1, "hog")
    assert gandiva("wait", hog, "--until", "running").code == 0
    big = _submit(stub, 2, "big")
    late = gandiva("wait", big, "--until", "running", "--timeout", "1s")
    assert late.code == 124, late.out + late.err
    assert f"still waiting at --timeout: big {big}  QUEUED: needs 2 GPUs" in late.out, late.out
    # Killed in the queue: it never ran, and the code says killed.
    threading.Thread(target=lambda: wait_for(lambda: stub.KillJob(scheduler_pb2.JobActionRequest(
        id=big, reason="too big"))), daemon=True).start()
    killed = gandiva("wait", big, "--until", "running")
    assert killed.code == 3, killed.out + killed.err
    assert f"job {big} (big) KILLED without ever running: too big" in killed.out, killed.out

    # Bad input: one line, exit 2.
    assert gandiva("wait", "j-0000000000").code == 2
    mixed = gandiva("wait", "mj-0000000000", job)
    assert mixed.code == 2 and "give one multi-job's id (mj-...) alone" in mixed.err, mixed.err
    with pytest.raises(SystemExit) as refused:  # argparse's one-line usage error
        gandiva("wait", job, "--timeout", "0")
    assert refused.value.code == 2
