"""The rung rules of scheduler.automl (synchronous and asynchronous successive halving,
Hyperband's brackets) against an in-process stand-in for the Scheduler service that
advances jobs at given speeds. The live path (real TensorFlow jobs, a real scheduler)
is tests/integration/test_automl.py; these cover the decisions exhaustively and fast."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2
from scheduler.automl import Hyperband, SuccessiveHalving

RUNNING, KILLED, SUCCEEDED = (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_KILLED,
                              common_pb2.JOB_STATE_SUCCEEDED)


class Cluster:
    """Jobs advance ``speed[name]`` mini-batches per poll up to ``total`` steps; the loss of
    configuration q after s steps is ``q / (1 + s / 100)`` (lower q is better, always),
    unless ``curve`` says otherwise."""

    def __init__(self, speed: dict[str, int], total: int = 10_000, curve: Any = None) -> None:
        self.speed, self.total = speed, total
        self.curve = curve or (lambda q, s: q / (1 + s / 100))
        self.jobs: dict[str, common_pb2.Job] = {}
        self.priority_log: list[tuple[str, int]] = []
        self.killed_at: dict[str, int] = {}  # name -> the poll it was killed at
        self.polls = 0

    def call(self, method: str, request: Any) -> Any:
        assert method == "SubmitMultiJob"
        out = scheduler_pb2.SubmitMultiJobResponse(multi_job_id="m-1")
        for spec in request.jobs:
            job = common_pb2.Job(id=f"j-{spec.name}", spec=spec, state=RUNNING)
            self.jobs[job.id] = job
            out.jobs.append(job)
        return out

    def call_retrying(self, method: str, request: Any, give_up_after: float = 0) -> Any:
        if method == "ListJobs":
            self.polls += 1
            for job in self.jobs.values():
                if job.state != RUNNING:
                    continue
                job.steps = min(self.total, job.steps + self.speed[job.spec.name])
                job.metrics["loss"] = self.curve(float(job.spec.params["q"]), job.steps)
                if job.steps >= self.total:
                    job.state = SUCCEEDED
            return scheduler_pb2.ListJobsResponse(jobs=list(self.jobs.values()))
        job = self.jobs[request.id]
        if method == "SetPriority":
            self.priority_log.append((job.spec.name, request.priority))
        elif method == "KillJob":
            job.state, job.message = KILLED, request.reason
            self.killed_at[job.spec.name] = self.polls
        return job


def specs(qualities: list[float]) -> list[common_pb2.JobSpec]:
    return [common_pb2.JobSpec(name=f"c{i}", params={"q": str(q)}) for i, q in enumerate(qualities)]


def search(cls: type, cluster: Cluster, **kw: Any) -> Any:
    return cls(cluster, "loss", poll_s=0, **kw)


@pytest.mark.parametrize("seed", range(8))
def test_asynchronous_rungs_choose_what_synchronous_rungs_choose_and_decide_sooner(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.choice([4, 6, 9, 16])
    qualities = [rnd.uniform(1, 2) for _ in range(n)]
    speed = {f"c{i}": rnd.choice([1, 2, 5, 20]) for i in range(n)}
    eta = rnd.choice([2, 3]) if n > 4 else 2
    results, clusters = {}, {}
    for asynchronous in (False, True):
        clusters[asynchronous] = c = Cluster(speed)
        results[asynchronous] = search(SuccessiveHalving, c, min_steps=20, eta=eta,
                                       asynchronous=asynchronous).run("s", specs(qualities))
    sync, asyn = results[False], results[True]
    assert [(r.steps, sorted(r.promoted), sorted(r.killed)) for r in sync.rungs] == [
        (r.steps, sorted(r.promoted), sorted(r.killed)) for r in asyn.rungs]
    # The loss here always ranks by quality: the best configuration wins, and nothing else survives.
    assert sync.best_params == asyn.best_params == {"q": str(min(qualities))}
    assert sum(j.state == RUNNING for j in clusters[True].jobs.values()) == 1
    # Every kill comes no later than the synchronous rung would have made it.
    for name, poll in clusters[True].killed_at.items():
        assert poll <= clusters[False].killed_at[name]


def test_a_rung_compares_jobs_at_its_step_not_where_each_has_run_to() -> None:
    # c0 is better at every step, but c1 runs 10x as fast: by the time c0 reaches the
    # rung, c1's loss has fallen below c0's at the rung. Compared at the rung, c0 wins.
    cluster = Cluster({"c0": 5, "c1": 50})
    result = search(SuccessiveHalving, cluster, min_steps=50).run("s", specs([1.0, 1.2]))
    assert result.best_params == {"q": "1.0"} and result.rungs[0].ranked == [("j-c0", pytest.approx(1 / 1.5)), ("j-c1", pytest.approx(1.2 / 1.5))]
    assert cluster.jobs["j-c1"].state == KILLED and "rung 0 at 50 steps" in cluster.jobs["j-c1"].message


def test_a_diverged_run_ranks_last_and_a_failed_one_is_not_waited_for() -> None:
    cluster = Cluster({f"c{i}": 10 for i in range(4)},
                      curve=lambda q, s: math.nan if q > 5 else q / (1 + s / 100))
    result = search(SuccessiveHalving, cluster, min_steps=30, asynchronous=True).run("s", specs([1, 9, 2, 3]))
    assert result.best_params == {"q": "1"}
    assert result.rungs[0].ranked[-1][0] == "j-c1" and math.isnan(result.rungs[0].ranked[-1][1])


def test_hyperband_brackets_follow_hyperbands_proportions() -> None:
    hb = search(Hyperband, Cluster({}), min_steps=50, max_steps=800, eta=2)
    # s_max = 4: n_s = 16, 10, 7, 5, 5 of 43, scaled to 16 configurations (largest remainders).
    assert hb.bracket_sizes(16) == [(50, 6), (100, 4), (200, 2), (400, 2), (800, 2)]
    for n in (2, 5, 16, 40):
        sizes = hb.bracket_sizes(n)
        assert sum(k for _, k in sizes) == n and all(k >= 1 for _, k in sizes)
        assert len(sizes) <= 5 and sizes[0][0] == 50
    # s_max = 1: n_s = 3, 2.
    assert search(Hyperband, Cluster({}), min_steps=100, max_steps=300, eta=3).bracket_sizes(9) == [
        (100, 5), (300, 4)]
    with pytest.raises(ValueError, match="--max-steps"):
        search(Hyperband, Cluster({}), min_steps=100, max_steps=50)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_hyperband_compares_every_brackets_survivors_at_max_steps(asynchronous: bool) -> None:
    # A late bloomer: c5 is the worst until 400 steps, then the best by far.
    def curve(q: float, s: int) -> float:
        return (3.0 if s < 400 else 0.01) if q == 0.5 else q / (1 + s / 100)

    n = 16
    qualities = [1 + i / 10 for i in range(n)]
    qualities[5] = 0.5
    cluster = Cluster({f"c{i}": 25 for i in range(n)}, curve=curve)
    hb = search(Hyperband, cluster, min_steps=50, max_steps=800, eta=2, asynchronous=asynchronous, seed=3)
    result = hb.run("hb", specs(qualities))
    final = [r for r in result.rungs if not r.killed and not r.promoted]
    assert len(final) == len(hb.bracket_sizes(n))  # one final ranking per bracket, at max_steps
    assert all(r.steps == 800 for r in final)
    finalists = {j for r in final for j, _ in r.ranked}
    best = min(((j, v) for r in final for j, v in r.ranked), key=lambda x: x[1])
    assert result.best_job == best[0] and result.best_value == pytest.approx(best[1])
    # Only the winner still trains; the other finalists are killed with the reason.
    alive = [j for j in cluster.jobs.values() if j.state == RUNNING]
    assert [j.id for j in alive] == [result.best_job]
    assert all("not the best across brackets" in cluster.jobs[j].message for j in finalists - {result.best_job})
    # Where c5 was dealt decides whether early feedback misled: in a bracket that halves
    # before 400 it is killed; in a bracket that starts at 400 or later it wins.
    bracket_of_c5 = next(r.bracket for r in result.rungs if any(j == "j-c5" for j, _ in r.ranked))
    first_steps = dict(enumerate((s for s, _ in hb.bracket_sizes(n)), start=1))[bracket_of_c5]
    assert (result.best_job == "j-c5") == (first_steps >= 400)


def test_hyperband_compares_at_max_steps_also_where_eta_does_not_divide_it() -> None:
    """Its rungs were the first one multiplied up: at --max-steps 1000 and --eta 3 the bracket
    from 111 went 111, 333, 999 (a rung of one) and compared its survivors at 2,997 mini-batches,
    three times the budget, while the other brackets stopped at 1,000."""
    n = 20
    cluster = Cluster({f"c{i}": 37 for i in range(n)})
    hb = search(Hyperband, cluster, min_steps=50, max_steps=1000, eta=3)
    assert [steps for steps, _ in hb.bracket_sizes(n)] == [111, 333, 1000]
    result = hb.run("hb", specs([1 + i / 10 for i in range(n)]))
    assert [r.steps for r in result.rungs if r.bracket == 1] == [111, 333, 1000]
    assert {r.steps for r in result.rungs if not r.killed and not r.promoted} == {1000}


@pytest.mark.parametrize(("cls", "kw", "says"), [
    # 309 digits and more: an OverflowError traceback, once the jobs were submitted.
    (Hyperband, {"max_steps": 10**400}, "--max-steps 10000000... (401 digits): must be at most 9,007,199,254,740,992"),
    # Past what a job's count holds (2^53): never reached; the search waited out its timeout.
    (Hyperband, {"max_steps": 2**53 + 1}, "--max-steps 9007199254740993: must be at most"),
    (SuccessiveHalving, {"min_steps": 2**53 + 1}, "--min-steps 9007199254740993: must be at most"),
    (SuccessiveHalving, {"min_steps": 2**50}, ("100 configurations at --min-steps 1125899906842624 and --eta 2 "
                                               "would be compared at 72057594037927936 mini-batches, past")),
], ids=["309_digits", "max_past_2_53", "min_past_2_53", "rung_past_2_53"])
def test_a_search_no_job_could_finish_is_refused_before_it_submits_anything(cls: type, kw: dict[str, int],
                                                                           says: str) -> None:
    cluster = Cluster({f"c{i}": 1 for i in range(100)})
    with pytest.raises(ValueError) as refused:
        search(cls, cluster, **kw).run("s", specs([1.0] * 100))
    assert str(refused.value).startswith(says), refused.value
    assert cluster.jobs == {}  # nothing left running without a search
