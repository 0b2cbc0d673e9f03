"""The simulator's fast paths decide exactly what the full paths decide, and its output is reproducible.

A decide() call costs time in proportion to what changed because (1) the snapshot says
what changed since the previous one and the policy's ledger looks at those jobs only,
(2) the policy skips queued jobs that cannot be placed instead of visiting each one
(``queue_reasons`` off), (3) the backend keeps the running jobs of every GPU apart from
the preempted ones parked there. Each test runs the same workload with a fast path
and without it and demands identical results, for every policy and several workloads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.policy import ClusterSnapshot, Decision, Policy, PolicyConfig, get_policy
from scheduler.policy.gittins import ServiceWindow
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.metrics import summarize
from scheduler.sim.model import MechanismModel

MODEL = MechanismModel.default()
ROOT = Path(__file__).resolve().parents[3]
POLICIES = ["gandiva", "yarn-cs", "tiresias", "fifo", "yarn-cs-local"]


class FullPath(Policy):
    """Runs ``inner`` on snapshots without the change hint, and with queue reasons if asked."""

    def __init__(self, inner: Policy, reasons: bool) -> None:
        self.inner, self.reasons = inner, reasons
        self.name, self.preemption = inner.name, inner.preemption
        self.queued_reasons = 0

    @property  # type: ignore[override]
    def config(self) -> PolicyConfig:
        return self.inner.config

    @config.setter
    def config(self, value: PolicyConfig) -> None:
        self.inner.config = dataclasses.replace(value, queue_reasons=self.reasons)

    def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
        out = self.inner.decide(dataclasses.replace(snapshot, seq=None, delta=None))
        self.queued_reasons += sum(type(d).__name__ == "Queue" for d in out)
        return out

    def next_wakeup(self) -> float | None:
        return self.inner.next_wakeup()


def _workload(seed: int, n: int = 160) -> tuple[list, tuple]:
    servers = make_cluster("4x4")
    jobs = generate(n, seed=seed, median_duration_s=900, max_gpus=8, grow_shrink_prob=0.1)
    jobs, _ = scale_to_load(jobs, servers, MODEL, 1.2)
    return jobs, servers


def _result(jobs: list, servers: tuple, policy: Policy) -> tuple[dict, list]:
    result = Simulator(jobs, servers, policy, MODEL).run()
    per_job = sorted((j.spec.id, j.first_run_at, j.first_n_at, j.finished_at) for j in result.jobs)
    return summarize(result), per_job


def _same_looking_only_at_changes(jobs: list, servers: tuple, cfg: PolicyConfig) -> tuple[dict, list]:
    """gandiva's result with ``cfg``, checked to be every job's times of the same policy
    looking at everything in every call (incremental off)."""
    fast = _result(jobs, servers, get_policy("gandiva", cfg))
    every = get_policy("gandiva", cfg)
    every.incremental = False  # type: ignore[attr-defined]
    assert fast == _result(jobs, servers, every)
    return fast


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_incremental_snapshots_and_skipped_queue_change_nothing(policy: str, seed: int) -> None:
    jobs, servers = _workload(seed)
    fast = _result(jobs, servers, get_policy(policy))
    full = FullPath(get_policy(policy), reasons=True)
    slow = _result(jobs, servers, full)
    assert fast == slow
    # The workload really queues jobs (else the skipping path was never taken).
    assert full.queued_reasons > 0
    assert fast[0]["jobs_finished"] == len(jobs)


def test_a_long_queue_does_not_make_each_call_visit_every_queued_job() -> None:
    """yarn-cs with hundreds waiting: the policy looks at few jobs per call."""
    servers = make_cluster("2x4")
    jobs, _ = scale_to_load(generate(600, seed=5, max_gpus=4), servers, MODEL, 3.0)
    seen: list[int] = []
    queued: list[int] = []

    class Counting(FullPath):
        def decide(self, snapshot: ClusterSnapshot) -> list[Decision]:
            delta = snapshot.delta
            assert delta is not None
            seen.append(len(delta.changed) + len(delta.removed))
            queued.append(sum(j.state == "QUEUED" for j in snapshot.jobs))
            return self.inner.decide(snapshot)

    policy = Counting(get_policy("yarn-cs"), reasons=False)
    result = Simulator(jobs, servers, policy, MODEL).run()
    assert len(result.jobs) == 600
    assert max(queued) > 100
    # Per call the snapshot names only the jobs that changed: a few, never the queue.
    assert max(seen) < 60 and sum(seen) / len(seen) < 5


def test_same_seed_gives_the_same_output_in_separate_processes() -> None:
    """benchmarks/sim_scaling.py's digest is the same under different hash seeds."""
    script = ("import json,sys;sys.argv=['x'];from benchmarks.sim_scaling import digest;"
              "from scheduler.policy import get_policy;from scheduler.sim.engine import Simulator,make_cluster;"
              "from scheduler.sim.generator import generate;from scheduler.sim.load import scale_to_load;"
              "from scheduler.sim.metrics import summarize;from scheduler.sim.model import MechanismModel;"
              "s=make_cluster('8x4');m=MechanismModel.default();"
              "j,_=scale_to_load(generate(300,seed=7),s,m,0.9);"
              "print(json.dumps({p:digest(summarize(Simulator(j,s,get_policy(p),m).run())) "
              "for p in ('gandiva','yarn-cs','tiresias')}))")
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=True)
        outs.append(json.loads(proc.stdout))
    assert outs[0] == outs[1]
    assert len(set(outs[0].values())) == 3


RULES = {
    "defaults": PolicyConfig(),
    "paper": PolicyConfig(las_slices=False, slice_growth=0.0, max_jobs_per_gpu=4, probe_slices=False),
    "no-las": PolicyConfig(las_slices=False),
    "no-growth": PolicyConfig(slice_growth=0.0),
    "buckets": PolicyConfig(fifo_after_s=600.0),
    "starve": PolicyConfig(starve_factor=1.0),
    "block": PolicyConfig(share_block_after_s=600.0, fifo_after_s=600.0),
    # A newcomer's first turn in a full group, then parked: its group is looked at again.
    "probe": PolicyConfig(probe_slices=True, max_jobs_per_gpu=4),
    # ... and the member ranked last parked in its place.
    "probe-last": PolicyConfig(probe_slices=True, probe_park_last=True, max_jobs_per_gpu=4),
    # A server handed to a crowded GPU count by parking its jobs: their groups change.
    "balance-park": PolicyConfig(balance_park=True, max_jobs_per_gpu=3),
    # The eldest of each GPU count keeps its GPUs; its group's other members are parked.
    "eldest": PolicyConfig(eldest_runs=True, max_jobs_per_gpu=4),
    # ... bounded: first turns on the eldest's GPUs, and no keeping while its group is its size's only one.
    "eldest-bounded": PolicyConfig(eldest_runs=True, eldest_first_turns=True, eldest_second_group=True,
                                   max_jobs_per_gpu=4),
}


@pytest.mark.parametrize("rules", sorted(RULES))
def test_gandiva_looking_only_at_changed_and_due_groups_changes_nothing(rules: str) -> None:
    """Rotation and packing look only at the groups that changed (a progress report alone is
    no change) or whose slice is due, and placement remembers across calls which GPU counts
    found no place; every job starts, reaches its first 100 mini-batches and finishes exactly
    when it does with every group looked at, and every search made again, in every call."""
    servers = make_cluster("3x4")
    jobs = generate(160, seed=3, median_duration_s=1800, max_gpus=4, grow_shrink_prob=0.1)
    jobs, _ = scale_to_load(jobs, servers, MODEL, 2.0)
    fast = _same_looking_only_at_changes(jobs, servers, RULES[rules])
    # The workload really time-slices and packs (else rotation and packing were idle).
    assert fast[0]["suspends"] > 50 and fast[0]["packs"] > 0


@pytest.mark.parametrize("rule", ["gittins_slices", "fifo_after_measured", "gittins_history"])
def test_gandiva_measured_slice_orders_decide_the_same_looking_only_at_changes(rule: str) -> None:
    """gittins_slices orders each group by an index (fifo_after_measured: by buckets whose
    boundary) the departures keep changing; a group is looked at again when its slice ends
    or its runner's service crosses the index's next grid point (the boundary), so every
    job's times are those of looking at every group at every call. A small window (the
    index from the 10th departure on, again every 5) makes it act early; with
    gittins_history the departures before the window's 50 count too."""
    servers = make_cluster("3x4")
    jobs, _ = scale_to_load(generate(160, seed=3, median_duration_s=1800, max_gpus=4), servers, MODEL, 2.0)
    cfg = PolicyConfig(**{rule: True})  # type: ignore[arg-type]
    fast, every = get_policy("gandiva", cfg), get_policy("gandiva", cfg)
    every.incremental = False  # type: ignore[attr-defined]
    for policy in (fast, every):
        policy.state.service = ServiceWindow(size=50, cold_start=10, refresh=5)  # type: ignore[attr-defined]
    got = _result(jobs, servers, fast)
    assert got == _result(jobs, servers, every)
    # The rule really acted: the jobs' times differ from least attained service's.
    assert got != _result(jobs, servers, get_policy("gandiva", PolicyConfig(gittins_slices=False)))


@pytest.mark.parametrize("max_gpus", [4, 8])
def test_gandiva_balancing_sizes_decides_the_same_looking_only_at_changes(max_gpus: int) -> None:
    """balance_sizes moves whole servers' jobs into other groups (with 8-GPU jobs, larger than
    a server, also a group's two servers at once); the groups it changes are looked at as any
    other change, so every job's times are those of looking at every group."""
    servers = make_cluster("6x4")
    jobs, _ = scale_to_load(generate(200, seed=0, max_gpus=max_gpus), servers, MODEL, 3.0)
    # unpack_idle off on both sides: its moves (on by default) would blur the count below.
    fast = _same_looking_only_at_changes(jobs, servers, PolicyConfig(balance_sizes=True, unpack_idle=False))
    plain = _result(jobs, servers, get_policy("gandiva", PolicyConfig(balance_sizes=False, unpack_idle=False)))
    # The rule really acted here: it handed servers over (each a handful of migrations; fewer
    # since a count none of whose waiting jobs can take a server is no longer handed one).
    assert fast[0]["migrations"] > plain[0]["migrations"] + 15


def test_gandiva_blocking_large_jobs_decides_the_same_looking_only_at_changes() -> None:
    """large_block_after_s keeps jobs larger than a server (4 GPUs on 2-GPU servers) out of
    time-slice groups while a job that fits one server has waited; placement remembers which
    GPU counts found no free GPUs, and every job's times are those of searching again in
    every call."""
    servers = make_cluster("6x2")
    cfg = PolicyConfig(large_block_after_s=600.0, max_jobs_per_gpu=4)
    jobs, _ = scale_to_load(generate(160, seed=5, median_duration_s=1800, max_gpus=4), servers, MODEL, 2.0)
    fast = _same_looking_only_at_changes(jobs, servers, cfg)
    # The rule really acted here: many jobs start or finish at other times than without it.
    plain = _result(jobs, servers, get_policy("gandiva", dataclasses.replace(cfg, large_block_after_s=None)))
    assert sum(a != b for a, b in zip(fast[1], plain[1], strict=True)) > 20


def test_gandiva_first_turns_of_large_jobs_decide_the_same_looking_only_at_changes() -> None:
    """probe_large holds whole servers for a large newcomer's first turn (4 and 8 GPUs on
    2-GPU servers) and rotation passes over their groups until it is over, then looks at them
    as changed: every job's times are those of looking at every group in every call."""
    servers = make_cluster("4x2")
    cfg = PolicyConfig(probe_large=True, max_jobs_per_gpu=4)
    jobs, _ = scale_to_load(generate(160, seed=1, median_duration_s=1800, max_gpus=8), servers, MODEL, 2.0)
    fast = _same_looking_only_at_changes(jobs, servers, cfg)
    # The rule really acted here: first turns were given over other counts' servers.
    plain = _result(jobs, servers, get_policy("gandiva", dataclasses.replace(cfg, probe_large=False)))
    assert fast[0]["parks"] > plain[0]["parks"]


def test_gandiva_unpacking_idle_pairs_decides_the_same_looking_only_at_changes() -> None:
    """unpack_idle parts kept pairs once GPUs stand idle with nothing queued (a moved member
    changes two groups); every job's times are those of looking at every group in every
    call."""
    servers = make_cluster("3x4")
    cfg = PolicyConfig(unpack_idle=True)
    jobs, _ = scale_to_load(generate(160, seed=3, median_duration_s=1800, max_gpus=4), servers, MODEL, 2.0)
    fast = _same_looking_only_at_changes(jobs, servers, cfg)
    # The rule really acted here: pairs were parted (more migrations than without it).
    plain = _result(jobs, servers, get_policy("gandiva", dataclasses.replace(cfg, unpack_idle=False)))
    assert fast[0]["migrations"] > plain[0]["migrations"]
