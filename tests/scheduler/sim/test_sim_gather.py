"""``gather_large``: whole servers for jobs larger than a server.

Algorithm 1 gives a job larger than a server only idle servers, and where the jobs of
smaller GPU counts hold every server none goes idle: the large jobs wait until the small ones
have left (ITP cluster04's 32-GPU jobs waited a median of 331 days). With the rule on, when
such a GPU count is the most crowded, servers are held for it, their jobs move into other
groups of their size, and its first waiting job starts there. What a user notices: the large
job starts within minutes instead of hours, no small job is lost or crowded past the cap,
and nothing lands on the held servers meanwhile.
"""

from __future__ import annotations

import dataclasses

import pytest

from gandiva_cli.main import main
from scheduler.policy import PolicyConfig, get_policy
from scheduler.policy.types import Migrate, Place
from scheduler.sim.engine import SimResult, Simulator, make_cluster
from scheduler.sim.model import MechanismModel
from scheduler.sim.observers import GroupWatch
from scheduler.sim.trace import JobSpec

CAP = 4
HOUR = 3600.0


def _workload(large: int, later: int = 0, small: int = 4) -> list[JobSpec]:
    """``small`` long 4-GPU jobs fill a 4x4 cluster (4: one a server); then ``large`` 8-GPU
    jobs come at 100 s, and ``later`` more 4-GPU jobs, one every 5 s from 306 s (the rule's
    second look is at about 304 s)."""
    jobs = [JobSpec(f"s{i}", float(i), 4, duration_s=20 * HOUR) for i in range(small)]
    jobs += [JobSpec(f"n{i}", 306.0 + 5 * i, 4, duration_s=2 * HOUR) for i in range(later)]
    return jobs + [JobSpec(f"L{i}", 100.0 + i, 8, duration_s=2 * HOUR) for i in range(large)]


def _run(jobs: list[JobSpec], gather: bool, moves: int = 8, cap: int = CAP) -> tuple[SimResult, list[str], int]:
    """Replay on 4x4 with a cap of ``cap`` jobs a GPU, at most ``moves`` migrations a call; also
    return, for every decision that put a job of another size on a server held at the time,
    a line naming it, and the most jobs on one GPU set."""
    cfg = PolicyConfig(max_jobs_per_gpu=cap, gather_large=gather, max_migrations_per_round=moves, probe_slices=False)
    policy = get_policy("gandiva", cfg)
    decide = policy.decide
    intruders: list[str] = []
    watch = GroupWatch()
    asked = {j.id: j.num_gpus for j in jobs}

    def checked(snapshot):  # type: ignore[no-untyped-def]
        held = policy.state.gather
        out = decide(snapshot)
        held = held or policy.state.gather  # one held before the call, or one it began
        if held is not None:
            size, names = held.size, held.servers
            for d in out:
                gpus = d.gpus if isinstance(d, Place) else d.to_gpus if isinstance(d, Migrate) else ()
                if any(g.server in names for g in gpus) and asked[d.job_id] != size:
                    intruders.append(f"{type(d).__name__} {d.job_id} onto {names}")
        return out

    policy.decide = checked  # type: ignore[method-assign]
    result = Simulator(jobs, make_cluster("4x4"), policy, MechanismModel.default(), observer=watch).run()
    return result, intruders, watch.most


def _first(result: SimResult, prefix: str) -> list[float]:
    return sorted(j.first_n_at - j.spec.submit_time for j in result.jobs if j.spec.id.startswith(prefix))


def test_a_large_job_gets_whole_servers_within_minutes() -> None:
    """Five 8-GPU jobs (0.62 a GPU of a set of theirs) behind four 4-GPU jobs (0.5 a GPU once
    two servers are gone): without the rule the first waits until a 4-GPU job leaves (about
    20 hours); with it, two servers are emptied (their jobs join the other two's groups)
    and the first 8-GPU job starts there within minutes; the rest join its group. Every
    job finishes; no GPU set holds more than the cap."""
    jobs = _workload(5)
    off, _, most_off = _run(jobs, gather=False)
    on, intruders, most_on = _run(jobs, gather=True)
    for result in (off, on):
        assert not result.unfinished
        assert sorted(j.spec.id for j in result.jobs) == sorted(j.id for j in jobs)
    assert most_off <= CAP and most_on <= CAP
    assert _first(off, "L")[0] > 10 * HOUR
    assert _first(on, "L")[0] < 0.5 * HOUR
    assert max(_first(on, "L")) < max(_first(off, "L"))
    assert on.counts["migrations"] > off.counts["migrations"]
    assert intruders == []


def test_no_gathering_that_would_leave_the_small_jobs_worse_off() -> None:
    """Four 8-GPU jobs are no more crowded (0.5 jobs a GPU of a set) than the 4-GPU jobs would
    be on the two servers left them (4 on 8 GPUs): the rule leaves the servers to them, and
    the 8-GPU jobs wait for the 4-GPU jobs to leave (20 hours) as without it."""
    jobs = _workload(4)
    off, _, _ = _run(jobs, gather=False)
    on, _, _ = _run(jobs, gather=True)
    assert not on.unfinished
    assert _first(on, "L")[0] > 19 * HOUR and _first(off, "L")[0] > 19 * HOUR


def test_nothing_else_lands_on_the_held_servers() -> None:
    """Eight 4-GPU jobs, two a server, and ten 8-GPU jobs (1.25 a GPU of a set, against 1 for
    the 4-GPU jobs on two servers), a cap of 6: two servers are emptied one move a call
    while 4-GPU jobs keep coming. The newcomers do not join the held servers' groups
    (without the hold they join those, the least full) and no move of another job lands
    there; the first 8-GPU job starts once they are empty."""
    jobs = _workload(10, later=4, small=8)
    on, intruders, most = _run(jobs, gather=True, moves=1, cap=6)
    assert intruders == []
    assert not on.unfinished and most <= 6
    assert _first(on, "L")[0] < 0.5 * HOUR


def test_a_gathering_newcomers_leave_no_room_for_is_given_up_at_once() -> None:
    """As above with a cap of 4: the newcomers take the last places in the other servers'
    groups before the held servers are empty. The rule gives the servers back at once (not
    after an hour of half-idle GPUs), and every job finishes."""
    jobs = _workload(10, later=4, small=8)
    policy = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=CAP, gather_large=True, max_migrations_per_round=1,
                                                probe_slices=False))
    decide = policy.decide
    spans: list[tuple[float, float]] = []

    def watched(snapshot):  # type: ignore[no-untyped-def]
        before = policy.state.gather
        out = decide(snapshot)
        if before is not None and policy.state.gather is None:
            spans.append((before.since, snapshot.now))
        return out

    policy.decide = watched  # type: ignore[method-assign]
    result = Simulator(jobs, make_cluster("4x4"), policy, MechanismModel.default()).run()
    assert not result.unfinished
    assert spans and all(end - start < 120 for start, end in spans), spans


def test_with_probe_slices_servers_are_lent_for_a_first_turn_and_come_back() -> None:
    """With ``probe_slices`` too, servers are only lent: each 8-GPU newcomer, one at a time,
    gets two servers emptied for its first turn (its first 100 mini-batches), is parked
    (checkpointed, queued again), and the servers go back to the 4-GPU jobs. Every 8-GPU
    job has its first mini-batches within half an hour of arrival instead of 20 hours, the
    4-GPU jobs lose minutes, not the hours a lasting 8-GPU group would take from them."""
    jobs = _workload(5)
    policy = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=CAP, gather_large=True, probe_slices=True))
    result = Simulator(jobs, make_cluster("4x4"), policy, MechanismModel.default()).run()
    assert not result.unfinished and len(result.jobs) == len(jobs)
    assert result.counts["parks"] == 5
    assert max(_first(result, "L")) < 0.5 * HOUR
    small_end = max(j.finished_at for j in result.jobs if j.spec.id.startswith("s"))
    assert small_end < 20 * HOUR + 0.5 * HOUR
    assert policy.state.lent is None and policy.state.gather is None


def test_a_lent_job_found_not_migratable_keeps_the_servers() -> None:
    """As above, but the 8-GPU jobs' runtimes report them not migratable (a ``tf.data``
    input, say) during their first turn: a park would restart them from a checkpoint they
    cannot resume from, so none is parked. The first keeps the lent servers as a group of
    its own, the loan ends, and the later 8-GPU jobs join that group; every job finishes."""
    jobs = _workload(5)
    policy = get_policy("gandiva", PolicyConfig(max_jobs_per_gpu=CAP, gather_large=True, probe_slices=True))
    decide = policy.decide

    def unmigratable(snapshot):  # type: ignore[no-untyped-def]
        views = tuple(dataclasses.replace(j, migratable=False) if j.id.startswith("L") and j.steps else j
                      for j in snapshot.jobs)
        return decide(dataclasses.replace(snapshot, jobs=views, seq=None, delta=None))  # every job read anew

    policy.decide = unmigratable  # type: ignore[method-assign]
    result = Simulator(jobs, make_cluster("4x4"), policy, MechanismModel.default()).run()
    assert not result.unfinished and len(result.jobs) == len(jobs)
    assert result.counts["parks"] == 0
    assert max(_first(result, "L")) < 0.5 * HOUR
    assert policy.state.lent is None


def test_off_by_default_and_on_with_the_flag(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """The default is off; ``gandiva sim --gather-large`` turns it on: the first workload
    above as a CSV trace replays with the two servers' jobs moved."""
    assert PolicyConfig().gather_large is False
    trace = tmp_path / "five-large.csv"
    trace.write_text("submit_time,num_gpus,duration\n" + "".join(
        f"{j.submit_time},{j.num_gpus},{j.duration_s}\n" for j in _workload(5)))
    args = ["sim", "--no-progress", "--trace", str(trace), "--cluster", "4x4", "--max-jobs-per-gpu", str(CAP)]

    def migrations() -> int:
        row = next(line for line in capsys.readouterr().out.splitlines() if "migrations" in line)
        return int(row.split("\u2502")[2])

    assert main(args) == 0
    off = migrations()
    assert main([*args, "--gather-large"]) == 0
    assert migrations() > off
