"""``benchmarks/sim_breakdown.py --tail``: each job's hours queued, suspended, running alone
and running packed, the figures docs/simulator.md reads a trace's tail from."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

from scheduler.policy import get_policy
from scheduler.policy.types import GpuRef
from scheduler.sim.engine import Simulator, make_cluster
from scheduler.sim.generator import generate
from scheduler.sim.load import scale_to_load
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

H = 3600.0
MODEL = MechanismModel.default()
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the benchmarks import their neighbours by name


def _breakdown(*args: object):  # type: ignore[no-untyped-def]
    return importlib.import_module("sim_breakdown").Breakdown(*args)


def _replay(jobs: list[JobSpec], cluster: str, policy: str):  # type: ignore[no-untyped-def]
    servers = make_cluster(cluster)
    probe = _breakdown(sum(s.num_gpus for s in servers), max(s.num_gpus for s in servers), MODEL, jobs[0].id)
    sim = Simulator(jobs, servers, get_policy(policy), MODEL, observer=probe)
    probe.watch(sim)
    result = sim.run()
    assert not result.unfinished
    return probe, {j.spec.id: j for j in result.jobs}


def test_a_job_queued_behind_another_on_one_gpu_as_computed_by_hand() -> None:
    """yarn-cs on one GPU: a 10-h job at 0, a 2-h job at 1 h. The first runs 10 h; the second
    is queued 9 h, then runs 2 h; neither is ever suspended or packed."""
    probe, _ = _replay([JobSpec("long", 0.0, 1, duration_s=10 * H), JobSpec("short", H, 1, duration_s=2 * H)],
                       "1x1", "yarn-cs")
    hours = probe.job_hours
    assert hours["long"] == pytest.approx({"RUNNING": 10.0}, abs=0.01)
    assert hours["short"] == pytest.approx({"QUEUED": 9.0, "RUNNING": 2.0}, abs=0.01)


def test_every_jobs_hours_add_up_to_its_time_in_the_system() -> None:
    """Under gandiva (time-slicing, packing, migration) at load 1.5, each job's hours queued,
    suspended, running alone and packed add up to its JCT: no interval is lost or counted
    twice when several jobs change in one event."""
    servers = make_cluster("2x4")
    jobs, _ = scale_to_load(generate(60, seed=3, max_gpus=4, median_duration_s=1800), servers, MODEL, 1.5)
    probe, done = _replay(jobs, "2x4", "gandiva")
    suspended = 0.0
    for jid, job in done.items():
        got = sum(probe.job_hours.get(jid, {}).values())
        assert got == pytest.approx((job.finished_at - job.spec.submit_time) / H, abs=1e-6), jid
        suspended += probe.job_hours.get(jid, {}).get("SUSPENDED", 0.0)
    assert suspended > 0  # the load made gandiva time-slice


def test_two_jobs_on_one_gpu_count_as_packed_and_as_packed_beside_idle() -> None:
    """Events fed by hand (a simulator's ``changed`` and its active jobs) on 2 GPUs: a runs
    alone for an hour, b joins it on GPU 0 for two hours (both packed, GPU 1 idle), then b
    moves to GPU 1 for an hour (both alone)."""
    g0, g1 = GpuRef("s0", 0), GpuRef("s0", 1)
    spec = types.SimpleNamespace
    a = spec(spec=spec(id="a", model="m"), state="RUNNING", placement=(g0,))
    b = spec(spec=spec(id="b", model="m"), state="RUNNING", placement=(g0,))
    probe = _breakdown(2, 2, MODEL, "a")
    sim = spec(changed={"a"})
    probe.watch(sim)  # type: ignore[arg-type]
    probe(0.0, {"a": a})
    sim.changed = {"b"}
    probe(H, {"a": a, "b": b})
    sim.changed = {"b"}
    b.placement = (g1,)
    probe(3 * H, {"a": a, "b": b})
    sim.changed = {"a", "b"}
    probe(4 * H, {})
    assert probe.job_hours["a"] == pytest.approx({"RUNNING": 2.0, "PACKED": 2.0})
    assert probe.job_hours["b"] == pytest.approx({"PACKED": 2.0, "RUNNING": 1.0})
    assert probe.hours["packed_beside_idle"] == pytest.approx(2.0)
