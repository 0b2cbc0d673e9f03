"""``probe_slices``: early feedback however full the time-slice groups are.

With the rule on, a job that has never run and finds every group of its GPU count full
(``max_jobs_per_gpu``) joins one anyway for its first turn (one such newcomer per group at
a time), and once its turn is over it is parked (checkpointed to disk, back in the queue)
while the group is still over the cap. What a user notices: new jobs reach their first
100 mini-batches within a few quanta of arrival, no group holds more than one job over
the cap, every job still finishes, and a parked job pays a restart when it comes back.
"""

from __future__ import annotations

import statistics

import pytest

from gandiva_cli.main import main
from scheduler.policy import PolicyConfig, get_policy
from scheduler.sim.engine import SimResult, Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.model import MechanismModel
from scheduler.sim.observers import GroupWatch
from scheduler.sim.trace import JobSpec

CAP = 2


def _run(jobs: list[JobSpec], cluster: str, probe: bool, cap: int = CAP,
         host_gib: float = 0.0, packing: bool = True) -> tuple[SimResult, int]:
    """Replay under gandiva (jobs of 4 GiB of host memory, servers of ``host_gib``, 0: not
    checked); return the result and the most jobs bound to one GPU set."""
    watch = GroupWatch()

    cfg = PolicyConfig(max_jobs_per_gpu=cap, probe_slices=probe, enable_packing=packing)
    model = MechanismModel.default()
    model.job_host_memory_gib = 4.0
    result = Simulator(jobs, make_cluster(cluster, host_memory_gib=host_gib), get_policy("gandiva", cfg), model,
                       observer=watch).run()
    return result, watch.most


def _waits(result: SimResult) -> list[float]:
    return [j.first_n_at - j.spec.submit_time for j in result.jobs]


@pytest.mark.parametrize("seed", [1, 2])
def test_new_jobs_get_their_first_mini_batches_within_a_few_quanta(seed: int) -> None:
    """1-GPU jobs at four times what a 2x2 cluster can serve, with at most 2 jobs a GPU:
    without probes a newcomer waits for a group to have room (hours); with them its first
    100 mini-batches come within a few quanta, no GPU set ever holds more than one job over
    the cap, and every job still finishes."""
    jobs, _ = scale_to_load(generate(160, seed=seed, max_gpus=1), make_cluster("2x2"), MechanismModel.default(), 4.0)
    off, most_off = _run(jobs, "2x2", probe=False)
    on, most_on = _run(jobs, "2x2", probe=True)
    assert not off.unfinished and not on.unfinished
    assert len(on.jobs) == len(off.jobs) == len(jobs)
    assert most_off == CAP and most_on == CAP + 1
    assert off.counts["parks"] == 0 < on.counts["parks"]
    assert on.counts["packs"] > 0  # a packing trial with a newcomer ends when it is parked
    quantum = PolicyConfig().quantum_s
    assert statistics.median(_waits(off)) > 20 * quantum
    assert statistics.median(_waits(on)) <= 5 * quantum
    assert statistics.fmean(_waits(on)) < statistics.fmean(_waits(off)) / 4


@pytest.mark.parametrize(("host_gib", "room"), [(10.0, False), (16.0, True), (0.0, True)])
def test_a_probe_joins_a_group_only_where_host_memory_holds_it(host_gib: float, room: bool) -> None:
    """A cap of 2 on one GPU and jobs of 4 GiB: 90% of 10 GiB holds the two members and no
    newcomer beside them, so none gets a first turn there (they wait, as without probes);
    90% of 16 GiB holds a third."""
    jobs, _ = scale_to_load(generate(60, seed=4, max_gpus=1), make_cluster("1x1"), MechanismModel.default(), 4.0)
    result, most = _run(jobs, "1x1", probe=True, host_gib=host_gib)
    assert not result.unfinished
    assert most == (CAP + 1 if room else CAP)
    assert (result.counts["parks"] > 0) == room


def test_a_parked_job_pays_a_restart_and_keeps_its_progress() -> None:
    """One GPU, a cap of 1: a long job holds it; a short one arrives, gets its first turn
    (a quantum, and its first 100 mini-batches), is parked, and comes back when the long one
    finishes. It finishes exactly its remaining work plus one restart after that."""
    model = MechanismModel.default()
    long = JobSpec("long", 0.0, 1, duration_s=3600.0)
    short = JobSpec("short", 100.0, 1, duration_s=600.0)
    result, most = _run([long, short], "1x1", probe=True, cap=1, packing=False)
    jobs = {j.spec.id: j for j in result.jobs}
    assert result.counts["parks"] == 1 and most == 2
    turn = jobs["short"].first_n_at - short.submit_time
    assert turn <= PolicyConfig().quantum_s
    # The long job lost the short one's turn (plus the resume after it) ...
    waited = jobs["long"].finished_at - long.duration_s
    assert PolicyConfig().quantum_s <= waited <= PolicyConfig().quantum_s + 60
    # ... and the short one ran the rest of its 600 s after it, behind one restart.
    ran_first = waited - model.costs.suspend_resume_s
    expected = jobs["long"].finished_at + model.costs.restart_s + short.duration_s - ran_first
    assert jobs["short"].finished_at == pytest.approx(expected, abs=1.0)


def test_on_by_default_and_off_with_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The default replays with probes and shows the parks; ``gandiva sim --no-probe-slices``
    (the paper's behaviour: a newcomer waits for room) has none."""
    assert PolicyConfig().probe_slices is True
    args = ["sim", "--no-progress", "--jobs", "150", "--cluster", "2x2", "--target-load", "4",
            "--max-jobs-per-gpu", "2"]
    assert main(args) == 0
    assert "parked to disk (probe_slices)" in capsys.readouterr().out
    assert main([*args, "--no-probe-slices"]) == 0
    assert "parked to disk" not in capsys.readouterr().out


@pytest.mark.parametrize("seed", [3, 7])
def test_a_parked_job_leaves_no_packing_trial_or_pair_behind(seed: int) -> None:
    """With packing on, a newcomer on its first turn may be packed with a member of its
    group; parking it ends the trial and the pair (a trial or pair naming a job no longer
    there kept a group from rotating: two packed jobs ran at a rate of 0 forever). After
    every call, every trial and kept pair names bound jobs, and every job finishes."""
    jobs, _ = scale_to_load(generate(160, seed=seed, max_gpus=4), make_cluster("2x4"), MechanismModel.default(), 4.0)
    policy = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=CAP, probe_slices=True))
    decide = policy.decide
    parked_in_trial = [0]

    def checked(snapshot):  # type: ignore[no-untyped-def]
        before = {j for t in policy.state.trials.values() for j in (t.job_id, t.partner_id)}
        out = decide(snapshot)
        ledger = policy._ledger  # as the call left it (not synced again)
        assert ledger is not None
        parked = {d.job_id for d in out if type(d).__name__ == "Park"}
        parked_in_trial[0] += len(parked & before)
        named = {j for t in policy.state.trials.values() for j in (t.job_id, t.partner_id)} | set(policy.state.kept_pairs)
        assert all(j in ledger.placement for j in named), sorted(j for j in named if j not in ledger.placement)
        return out

    policy.decide = checked  # type: ignore[method-assign]
    result = Simulator(jobs, make_cluster("2x4"), policy, MechanismModel.default()).run()
    assert not result.unfinished and result.counts["parks"] > 0
    assert parked_in_trial[0] > 0  # the case this test is about happened
