"""Host memory in the simulator (``--host-memory-gib``, ``--job-host-memory-gib``).

Property: whatever the workload, the cluster and the memory, at every event each server's
jobs (running and suspended: each keeps its process there) fit in 90% of its host memory,
or the server holds a single job; every job still finishes. The default (0: not checked)
replays exactly as before.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gandiva_cli.main import main
from scheduler.policy import PolicyConfig, get_policy
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel

GIB = 1 << 30


def _replay(jobs, cluster: str, host_gib: float, job_gib: float, policy: str = "gandiva",
            check: bool = True, probe: bool = False, cap: int = 16,
            gather: bool = False) -> tuple[dict, int]:
    servers = make_cluster(cluster, host_memory_gib=host_gib)
    model = MechanismModel.default()
    model.job_host_memory_gib = job_gib
    budget = 0.9 * host_gib * GIB
    worst = [0]

    def observe(now: float, active: dict) -> None:
        held: dict[str, list[int]] = {}
        for job in active.values():
            if job.placement:
                for name in {g.server for g in job.placement}:
                    held.setdefault(name, []).append(job.profile.host_memory_bytes)
        for name, needs in held.items():
            worst[0] = max(worst[0], len(needs))
            if check and host_gib:
                assert len(needs) == 1 or sum(needs) <= budget + 1, (now, name, len(needs))

    result = Simulator(jobs, servers, get_policy(policy, PolicyConfig(max_jobs_per_gpu=cap, probe_slices=probe,
                                                                          gather_large=gather)), model,
                       observer=observe).run()
    assert not result.unfinished
    assert sorted(j.spec.id for j in result.jobs) == sorted(j.id for j in jobs if j.num_gpus <= len(servers) * int(
        cluster.split("x")[1]))
    return summarize(result), worst[0]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), cluster=st.sampled_from(["2x4", "3x2", "4x1"]),
       host_gib=st.sampled_from([6.0, 16.0, 40.0]), job_gib=st.sampled_from([0.5, 2.0, 4.0, 9.0]),
       load=st.sampled_from([1.5, 3.0]), probe=st.booleans(), cap=st.sampled_from([2, 16]),
       gather=st.booleans())
def test_every_server_s_jobs_fit_its_host_memory_at_every_event(seed: int, cluster: str, host_gib: float,
                                                                 job_gib: float, load: float, probe: bool,
                                                                 cap: int, gather: bool) -> None:
    """Also with ``probe_slices``, whose newcomers join full groups for a turn (memory
    permitting only), with ``gather_large``, which moves whole servers' jobs into other
    groups, and with a group cap that binds before memory does."""
    servers = make_cluster(cluster)
    jobs, _ = scale_to_load(generate(40, seed=seed, max_gpus=8), servers, MechanismModel.default(), load)
    _replay(jobs, cluster, host_gib, job_gib, probe=probe, cap=cap, gather=gather)


def test_host_memory_bounds_what_time_slicing_asks_of_a_server() -> None:
    """On an oversubscribed 4x4 cluster of 1-GPU jobs the group cap of 16 puts 64 jobs on a
    server (60 suspended beside four running). With 64 GiB of host memory, 90% of it holds
    14 jobs of 4 GiB (10 suspended) or 57 of 1 GiB. Fewer jobs share the GPUs, so more of them
    queue: the queueing delay is what the memory costs."""
    jobs, _ = scale_to_load(generate(600, seed=5, max_gpus=1), make_cluster("4x4"), MechanismModel.default(), 8.0)
    free, most = _replay(jobs, "4x4", 0.0, 4.0)
    tight, most_tight = _replay(jobs, "4x4", 64.0, 4.0)
    small, most_small = _replay(jobs, "4x4", 64.0, 1.0)
    assert (most, free["max_suspended_per_server"]) == (64, 60)
    assert (most_tight, tight["max_suspended_per_server"]) == (14, 10)
    assert most_small == 57
    assert tight["avg_queueing_delay_s"] > small["avg_queueing_delay_s"] > free["avg_queueing_delay_s"]


def test_unchecked_host_memory_replays_as_before() -> None:
    """Host memory 0 (the default) is not checked: however large the jobs' host memory, the
    replay is the one without it, decision for decision."""
    jobs, _ = scale_to_load(generate(200, seed=3, max_gpus=4), make_cluster("2x4"), MechanismModel.default(), 2.0)
    a, _ = _replay(jobs, "2x4", 0.0, 4.0)
    b, _ = _replay(jobs, "2x4", 0.0, 400.0)
    assert a == b


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--host-memory-gib", "-1", "--host-memory-gib must not be negative"),  # (was "host memory must")
    ("--job-host-memory-gib", "-2", "--job-host-memory-gib must not be negative"),
])
def test_the_cli_refuses_negative_memory(capsys: pytest.CaptureFixture[str], flag: str, value: str,
                                         message: str) -> None:
    assert main(["sim", "--no-progress", "--jobs", "10", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_the_cli_reports_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """``gandiva sim --host-memory-gib`` reaches the policy: fewer jobs wait suspended per
    server than without it, on the same workload."""
    def run(*extra: str) -> tuple[dict, str]:
        assert main(["sim", "--no-progress", "--jobs", "300", "--cluster", "2x4", "--target-load", "3",
                     "-o", "json", *extra]) == 0
        out = capsys.readouterr()
        return json.loads(out.out)["gandiva"], out.err
    free, said = run()
    bound, said_bound = run("--host-memory-gib", "24", "--job-host-memory-gib", "4")
    assert "host memory" not in said
    assert "host memory 24 GiB per server, 4 GiB per job: at most 5 jobs per server" in said_bound
    assert free["max_suspended_per_server"] > 4
    # 90% of 24 GiB holds five jobs of 4 GiB: at least one of them runs.
    assert 0 < bound["max_suspended_per_server"] <= 4
    assert bound["jobs_finished"] == free["jobs_finished"] == 297  # 3 need more GPUs than 2x4 has
