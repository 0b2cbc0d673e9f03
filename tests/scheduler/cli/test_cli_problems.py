"""`gandiva get problems` through the real scheduler and CLI, with a scripted helper that
reports what a real one would (tests/integration/test_observe.py -k gpu_time_per_job has the
live case: a helper killed; tests/scheduler/test_problems_units.py each rule)."""

from __future__ import annotations

import json
import signal

from protos.gandiva.v1 import common_pb2, scheduler_pb2


def test_a_job_killed_again_and_again_is_listed_with_what_to_do(gandiva, stub, helper, wait_for) -> None:  # type: ignore[no-untyped-def]
    """A job whose process is killed by SIGKILL (the kernel's OOM killer) is re-placed from
    its start, twice, then fails: nothing but its History said so. `get problems` counts the
    times it was sent back to the queue (not its submission, which is a transition to QUEUED
    too: it read "3 times" for two kills) and says what to run."""
    assert gandiva("get", "problems").out.startswith("nothing needs a person now")
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="oom", command=["python", "t.py"], gpus=1))).job.id
    for _ in range(2):
        launched = wait_for(lambda: helper.launched.get(job))
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(id=job)).state == common_pb2.JOB_STATE_RUNNING)
        helper.exit(job, -signal.SIGKILL)
        wait_for(lambda l=launched: helper.launched.get(job) not in (None, l), 30)  # placed again
    listed = json.loads(gandiva("get", "problems", "-o", "json").out)
    assert [(p["kind"], p["subject"]) for p in listed] == [("job.failing", job)], listed
    assert listed[0]["what"].startswith("oom: sent back to the queue 2 times in the last hour; lately: its process "
                                        "was killed by SIGKILL (out of memory?)"), listed
    assert listed[0]["next"] == f"gandiva logs {job}; gandiva describe job {job} (History); gandiva kill {job} to stop it"
    table = gandiva("get", "problems")
    assert table.code == 0 and table.out.split()[:7] == ["KIND", "SUBJECT", "SINCE", "WHAT", "NEXT", "job.failing", job]
