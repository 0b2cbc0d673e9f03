"""``balance_sizes`` (issue 11, ITP cluster08): Algorithm 1 gives each server to one GPU count,
so 1-GPU jobs crowd their servers' time-slice groups while servers given to 4-GPU jobs run one
job each. With the rule the policy hands such a server to the crowded jobs: its 4-GPU job joins
the other 4-GPU job's group, and the suspended 1-GPU jobs move onto the freed GPUs and run.

The cluster: s0 holds four 1-GPU groups of ``per_gpu`` jobs each (one running, the others
suspended); s1 and s2 one 4-GPU job each, running alone.
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.types import ClusterSnapshot, Migrate, Place, Suspend

# probe_slices off: these tests are about who waits for a full group, not about first turns.
CFG = PolicyConfig(enable_packing=False, enable_grow_shrink=False, balance_sizes=True, probe_slices=False)


def _cluster(mk, per_gpu: int, big_migratable: bool = True) -> ClusterSnapshot:
    jobs = []
    for gpu in range(4):
        for k in range(per_gpu):
            jobs.append(mk.job(f"small{gpu}.{k}", state="RUNNING" if k == 0 else "SUSPENDED",
                               placement=mk.on("s0", gpu), attained_service_s=600.0 * (k + 1),
                               submitted_at=0.0, last_state_change_at=0.0))
    for name in ("s1", "s2"):
        jobs.append(mk.job(f"big-{name}", state="RUNNING", placement=mk.on(name, 0, 1, 2, 3),
                           attained_service_s=4 * 36000.0, migratable=big_migratable, last_state_change_at=0.0))
    return mk.snap(1000.0, mk.servers(3), *jobs)



def _small_running(snap: ClusterSnapshot) -> int:
    return sum(1 for j in snap.jobs if j.id.startswith("small") and j.state == "RUNNING")


@pytest.mark.parametrize(("per_gpu", "hands_over"), [(3, False), (4, False), (5, True), (8, True)])
def test_a_server_of_the_less_crowded_size_goes_to_the_crowded_one(mk, per_gpu: int, hands_over: bool) -> None:
    """With five or more 1-GPU jobs per GPU, s1's 4-GPU job joins s2's (which it suspends: it
    runs first, as a newcomer would) and four suspended 1-GPU jobs, from the groups in turn,
    run on s1 at once. With four or fewer, the two 4-GPU jobs sharing s2 would be as crowded
    as the 1-GPU jobs with s1 added (2 jobs per GPU set against 4 x 4 / 8): nothing moves."""
    policy = get_policy("gandiva", CFG)
    snap = _cluster(mk, per_gpu)
    first = policy.decide(snap)
    moved = [d for d in first if isinstance(d, Migrate)]
    if not hands_over:
        assert moved == [] and [d for d in first if isinstance(d, Suspend)] == []
        assert _small_running(mk.after(snap, first, 1001.0)) == 4
        return
    assert mk.kinds(first)[:2] == [("Suspend", "big-s2"), ("Migrate", "big-s1")]
    assert moved[0].to_gpus == mk.on("s2", 0, 1, 2, 3)
    onto_s1 = [d for d in moved if {g.server for g in d.to_gpus} == {"s1"}]
    assert len(onto_s1) == 4 and all(d.job_id.startswith("small") for d in onto_s1)
    assert sorted(d.to_gpus for d in onto_s1) == [mk.on("s1", i) for i in range(4)]
    # Eight 1-GPU jobs now run where four did; the 4-GPU jobs take turns on s2.
    after = mk.after(snap, first, 1001.0)
    assert _small_running(after) == 8
    # Nothing moves back in the next call.
    assert not any(isinstance(d, Migrate) for d in policy.decide(dataclasses.replace(after, now=1002.0)))


@pytest.mark.parametrize("per_gpu", [2, 3, 4])
def test_balance_per_gpu_weighs_a_job_by_its_gpus(mk, per_gpu: int) -> None:
    """balance_per_gpu: crowding is jobs per GPU, not per same-size GPU set. With two to
    four 1-GPU jobs per GPU the per-set measure moves nothing (the two 4-GPU jobs sharing s2
    would be as crowded per set as the 1-GPU jobs with s1 added), while per GPU the 4-GPU
    jobs, 2 jobs on 4 GPUs, are far less crowded than 1-GPU jobs on 8 GPUs: s1 goes to the
    1-GPU jobs, and eight of them run where four did."""
    snap = _cluster(mk, per_gpu)
    per_set = get_policy("gandiva", CFG).decide(snap)
    assert [d for d in per_set if isinstance(d, Migrate)] == []
    d = get_policy("gandiva", dataclasses.replace(CFG, balance_per_gpu=True)).decide(snap)
    assert mk.kinds(d)[:2] == [("Suspend", "big-s2"), ("Migrate", "big-s1")]
    assert _small_running(mk.after(snap, d, 1001.0)) == 8


def test_balance_per_gpu_needs_balance_sizes() -> None:
    with pytest.raises(ValueError, match="turn balance_sizes on too"):
        PolicyConfig(balance_sizes=False, balance_per_gpu=True)


def test_queued_jobs_of_the_crowded_size_take_the_server_first(mk) -> None:
    """Two 1-GPU jobs queued (every group is at the cap of 5): they are placed on the freed
    server ahead of the suspended ones, which take the other two GPUs."""
    cfg = dataclasses.replace(CFG, max_jobs_per_gpu=5)
    snap = _cluster(mk, 5)
    queued = [mk.job(f"new{i}", submitted_at=900.0 + i) for i in range(2)]
    snap = mk.snap(1000.0, snap.servers, *snap.jobs, *queued)
    d = get_policy("gandiva", cfg).decide(snap)
    placed = [x for x in d if isinstance(x, Place)]
    assert [(x.job_id, x.gpus) for x in placed] == [("new0", mk.on("s1", 0)), ("new1", mk.on("s1", 1))]
    onto_s1 = [x for x in d if isinstance(x, Migrate) and x.to_gpus[0].server == "s1"]
    assert sorted(x.to_gpus for x in onto_s1) == [mk.on("s1", 2), mk.on("s1", 3)]


@pytest.mark.parametrize("per_gpu", [5, 8])
def test_without_the_rule_the_crowded_jobs_keep_waiting(mk, per_gpu: int) -> None:
    policy = get_policy("gandiva", dataclasses.replace(CFG, balance_sizes=False))
    snap = _cluster(mk, per_gpu)
    d = policy.decide(snap)
    assert [x for x in d if isinstance(x, Migrate)] == []
    assert _small_running(mk.after(snap, d, 1001.0)) == 4


def test_a_job_that_cannot_move_keeps_its_server(mk) -> None:
    d = get_policy("gandiva", CFG).decide(_cluster(mk, 8, big_migratable=False))
    assert [x for x in d if isinstance(x, (Migrate, Suspend))] == []


def test_the_rule_acts_at_most_once_per_interval(mk) -> None:
    """After a handover the next one waits defrag_interval_s (300 s): a crowded cluster does
    not move a server at every event."""
    policy = get_policy("gandiva", CFG)
    snap = _cluster(mk, 8)
    first = policy.decide(snap)
    assert any(isinstance(d, Migrate) for d in first)
    assert policy.next_wakeup() is not None and policy.next_wakeup() <= 1000.0 + 300.0
    # The same crowded cluster again, 100 s later (as if the moves had not happened).
    again = policy.decide(dataclasses.replace(snap, now=1100.0))
    assert not any(isinstance(d, Migrate) and d.job_id.startswith("big") for d in again)


def _large_cluster(mk, per_gpu: int) -> ClusterSnapshot:
    """Five 2-GPU servers: s0 two 1-GPU groups of ``per_gpu`` jobs; s1+s2 and s3+s4 one 4-GPU
    job each (larger than a server), running alone."""
    jobs = [mk.job(f"small{gpu}.{k}", state="RUNNING" if k == 0 else "SUSPENDED", placement=mk.on("s0", gpu),
                   attained_service_s=600.0 * (k + 1), last_state_change_at=0.0)
            for gpu in range(2) for k in range(per_gpu)]
    jobs += [mk.job("big-a", state="RUNNING", placement=mk.on("s1", 0, 1) + mk.on("s2", 0, 1), last_state_change_at=0.0),
             mk.job("big-b", state="RUNNING", placement=mk.on("s3", 0, 1) + mk.on("s4", 0, 1), last_state_change_at=0.0)]
    return mk.snap(1000.0, mk.servers(5, 2), *jobs)


@pytest.mark.parametrize(("per_gpu", "hands_over"), [(3, False), (8, True), (12, True)])
def test_a_job_larger_than_a_server_hands_over_every_server_it_spans(mk, per_gpu: int, hands_over: bool) -> None:
    """Jobs larger than a server count too: with eight or more 1-GPU jobs per GPU, big-a joins
    big-b's group and both servers it held go to suspended 1-GPU jobs, which run at once
    (before, such a job was no donor, and servers drifted to large jobs for good). With three,
    the two 4-GPU jobs sharing one set would be more crowded than the 1-GPU jobs: nothing moves."""
    snap = _large_cluster(mk, per_gpu)
    d = get_policy("gandiva", CFG).decide(snap)
    moved = [x for x in d if isinstance(x, Migrate)]
    if not hands_over:
        assert moved == []
        return
    assert mk.kinds(d)[:2] == [("Suspend", "big-b"), ("Migrate", "big-a")]
    assert moved[0].to_gpus == mk.on("s3", 0, 1) + mk.on("s4", 0, 1) and "hand s1, s2" in moved[0].reason
    small = sorted(x.to_gpus for x in moved[1:])
    assert small == [mk.on(s, i) for s in ("s1", "s2") for i in range(2)]
    assert _small_running(mk.after(snap, d, 1001.0)) == 6


def test_the_ledgers_job_counts_per_gpu_count_match_a_recount_after_every_call() -> None:
    """balance_sizes reads how many jobs each requested GPU count has (all, and waiting:
    queued or suspended) from tallies the ledger keeps as states change, not from a count over
    every job at every look. Through a replay with arrivals, departures, suspensions,
    migrations and handovers of 1- to 8-GPU jobs on 4-GPU servers, after every call the
    tallies equal a count over every job the ledger holds."""
    from scheduler.policy.gandiva import GandivaPolicy
    from scheduler.sim.engine import Simulator, make_cluster
    from scheduler.sim.generator import generate
    from scheduler.sim.load import scale_to_load
    from scheduler.sim.model import MechanismModel

    calls = []

    class Recounted(GandivaPolicy):
        def decide(self, snapshot: ClusterSnapshot) -> list:
            out = super().decide(snapshot)
            ledger = self._ledger
            assert ledger is not None
            count: dict[int, int] = {}
            waiting: dict[int, int] = {}
            for job_id, st in ledger.state.items():
                k = ledger.jobs[job_id].requested_gpus
                count[k] = count.get(k, 0) + 1
                waiting[k] = waiting.get(k, 0) + (st in ("QUEUED", "SUSPENDED"))
            assert {k: n for k, n in ledger.jobs_by_request.items() if n} == count
            assert {k: n for k, n in ledger.waiting_by_request.items() if n} == {k: n for k, n in waiting.items() if n}
            calls.append(len(ledger.state))
            return out

    model = MechanismModel.default()
    servers = make_cluster("6x4")
    jobs, _ = scale_to_load(generate(150, seed=2, max_gpus=8), servers, model, 3.0)
    result = Simulator(jobs, servers, Recounted(dataclasses.replace(CFG, enable_packing=True)), model).run()
    assert not result.unfinished and len(calls) > 100 and max(calls) > 30
    assert result.counts.get("migrations", 0) > 0
