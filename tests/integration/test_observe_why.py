"""What a user asks of a live cluster, answered by the CLI from what really happened:
real scheduler, real helper processes, real TensorFlow jobs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def gandiva(cluster, *args: str) -> str:  # type: ignore[no-untyped-def]
    out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", *args, "--scheduler", cluster.sched.address],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


VERDICT = re.compile(
    r"packing trial with (j-\w+): packed rate (\d+\.\d\d)x of time-slicing(?:: kept| is no gain) "
    r"\((j-\w+) ([\d.]+) packed vs ([\d.]+) alone, (j-\w+) ([\d.]+) vs ([\d.]+) mini-batches/s; measured over")


def test_describe_says_whether_a_pack_helped_with_the_measured_rates(policy_cluster, mlp) -> None:  # type: ignore[no-untyped-def]
    """A packing trial's verdict (kept, or undone) was only in the dashboard's in-memory
    log: `describe job` and `get events` showed the pack start ("trial: utilization 0.05 +
    0.05", naming no partner) and then nothing, so "did packing help?" had no answer
    there. Now both jobs' histories carry the verdict with the rates it was judged by."""
    c = policy_cluster(quantum_s=1.5, pack_trial_s=4.0)
    c.add_helper("node-a", 1, "--sample-interval", "0.5")
    ids = [c.stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name=f"pk-{i}", command=mlp(100000, 0.02), workdir=str(c.tmp), gpus=1))).job.id for i in range(2)]

    def verdicts(job_id: str) -> list[str]:
        events = c.stub.ListEvents(scheduler_pb2.ListEventsRequest(job_id=job_id)).events
        return [e.message for e in events if e.kind == "job.pack"]

    c.wait_for(lambda: all(verdicts(j) for j in ids), 150)
    for job_id in ids:
        text = gandiva(c, "describe", "job", job_id)
        other = ids[1 - ids.index(job_id)]
        m = VERDICT.search(text)
        assert m, text
        assert m[1] == other and {m[3], m[6]} == set(ids)
        # The ratio shown is the one the rates shown give (each rounded to 3 digits).
        gain = float(m[4]) / float(m[5]) + float(m[7]) / float(m[8])
        assert abs(gain - float(m[2])) < 0.02 * gain, text
    # The pack itself names the job it was packed beside.
    reasons = [t.reason for j in ids for t in c.job(j).history]
    assert any(re.fullmatch(r"trial: packed beside j-\w+, utilization [\d.]+ \+ [\d.]+ \(step \d+\)", r)
               for r in reasons), reasons
    for j in ids:
        c.stub.KillJob(scheduler_pb2.JobActionRequest(id=j))
