"""``probe_large``: first turns over other GPU counts' servers for jobs larger than a server.

A never-run job larger than a server gets a first turn only by joining a full time-slice
group of its own GPU count, and where the jobs of smaller counts hold every server there is
none: it waits until they leave (ITP cluster04's 32-GPU jobs waited the longest of all for
their first 100 mini-batches). With the rule it time-slices over whole servers of other
counts: their running jobs are suspended in place for its turn, then it is parked and they
go on. What a user notices: the large job's first mini-batches within minutes instead of
hours, the small jobs delayed by minutes, no GPU ever running two jobs at once, no job lost.
"""

from __future__ import annotations

from collections import Counter

import pytest

from gandiva_cli.main import main
from scheduler.cli.serve import policy_options
from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.types import Place, Resume
from scheduler.sim.engine import SimResult, Simulator, make_cluster
from scheduler.sim.model import MechanismModel
from scheduler.sim.trace import JobSpec

CAP = 4
HOUR = 3600.0


def _workload(large: int) -> list[JobSpec]:
    """Four long 4-GPU jobs fill a 4x4 cluster (one a server); then ``large`` 8-GPU jobs
    arrive at 100 s, one a second."""
    jobs = [JobSpec(f"s{i}", float(i), 4, duration_s=20 * HOUR) for i in range(4)]
    return jobs + [JobSpec(f"L{i}", 100.0 + i, 8, duration_s=2 * HOUR) for i in range(large)]


def _run(jobs: list[JobSpec], rule: bool) -> tuple[SimResult, list[str], list[str]]:
    """Replay on 4x4; also return a line for every snapshot in which a GPU ran two jobs at
    once, and for every decision that resumed or placed a job on a server held for a turn."""
    policy = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=CAP, probe_large=rule, enable_packing=False))
    decide = policy.decide
    doubled: list[str] = []
    intruders: list[str] = []

    def checked(snapshot):  # type: ignore[no-untyped-def]
        running = Counter(g for j in snapshot.jobs if j.state == "RUNNING" for g in j.placement)
        doubled.extend(f"{snapshot.now:.0f}: {g}" for g, n in running.items() if n > 1)
        out = decide(snapshot)
        turn = policy.state.large_turn
        if turn is not None:
            job_id, _, names = turn
            for d in out:
                if (isinstance(d, (Place, Resume)) and d.job_id != job_id
                        and any(g.server in names for g in d.gpus)):
                    intruders.append(f"{snapshot.now:.0f}: {type(d).__name__} {d.job_id}")
        return out

    policy.decide = checked  # type: ignore[method-assign]
    result = Simulator(jobs, make_cluster("4x4"), policy, MechanismModel.default()).run()
    assert policy.state.large_turn is None
    return result, doubled, intruders


def _first(result: SimResult, prefix: str) -> list[float]:
    return sorted(j.first_n_at - j.spec.submit_time for j in result.jobs if j.spec.id.startswith(prefix))


def test_large_newcomers_time_slice_over_the_small_jobs_servers() -> None:
    """Without the rule each 8-GPU job waits for a 4-GPU job to end (20 hours) for its first
    mini-batches; with it, one at a time, each takes two servers for its first turn, the two
    4-GPU jobs there suspended, and is parked after it. All five have their first 100
    mini-batches within half an hour, the 4-GPU jobs end at most half an hour later than
    they would alone, nothing else runs on the held servers meanwhile, no GPU runs two jobs,
    and every job finishes."""
    jobs = _workload(5)
    off, doubled_off, _ = _run(jobs, rule=False)
    on, doubled_on, intruders = _run(jobs, rule=True)
    for result in (off, on):
        assert not result.unfinished
        assert sorted(j.spec.id for j in result.jobs) == sorted(j.id for j in jobs)
    assert doubled_off == [] and doubled_on == [] and intruders == []
    assert _first(off, "L")[0] > 19 * HOUR
    assert max(_first(on, "L")) < 0.5 * HOUR
    assert on.counts["parks"] == 5 and off.counts["parks"] == 0
    small_end = max(j.finished_at for j in on.jobs if j.spec.id.startswith("s"))
    assert small_end < 20 * HOUR + 0.5 * HOUR


def test_it_needs_probe_slices_and_excludes_gather_large() -> None:
    with pytest.raises(ValueError, match="turn probe_slices on too"):
        PolicyConfig(probe_large=True, probe_slices=False)
    with pytest.raises(ValueError, match="turn one of them off"):
        PolicyConfig(probe_large=True, gather_large=True)


def test_the_live_scheduler_refuses_it_naming_why() -> None:
    """Live, a job is never launched over several servers yet: the option is refused at start
    with that reason, rather than holding servers for a launch that is then refused."""
    with pytest.raises(ValueError, match=r"probe_large=true: the live scheduler does not launch jobs over "
                                         r"several servers yet.*gandiva sim --probe-large"):
        policy_options(["probe_large=true"])
    assert policy_options(["probe_large=false"]) == {"probe_large": False}


def test_off_by_default_and_on_with_the_flag(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """The default is off; ``gandiva sim --probe-large`` turns it on: the workload above as
    a CSV trace replays with the 8-GPU jobs' first mini-batches within minutes (one park
    each) instead of after hours."""
    assert PolicyConfig().probe_large is False
    trace = tmp_path / "five-large.csv"
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(
        f"{j.submit_time},{j.num_gpus},{j.duration_s}\n" for j in _workload(5)))
    args = ["sim", "--no-progress", "--trace", str(trace), "--cluster", "4x4", "--max-jobs-per-gpu", str(CAP)]

    def row(out: str, name: str) -> str:
        return next(line for line in out.splitlines() if name in line).split("\u2502")[2].split()[0]

    assert main(args) == 0
    assert float(row(capsys.readouterr().out, "avg time to first 100")) > 4 * HOUR  # five wait ~20 h
    assert main([*args, "--probe-large"]) == 0
    out = capsys.readouterr().out
    assert float(row(out, "avg time to first 100")) < 0.5 * HOUR and int(row(out, "parked to disk")) == 5
