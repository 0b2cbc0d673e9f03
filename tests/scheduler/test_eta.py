"""Progress and ETA as people read them (scheduler/eta.py): never a made-up ETA."""

from __future__ import annotations

import pytest

from scheduler.eta import Sharer, estimate, eta_text, progress_text, short
from scheduler.state.models import Job


def _job(state: str = "RUNNING", steps: int = 340, total: int = 1000, rate: float = 2.0,
         rate_at: float = 100.0, priority: int = 1, held: bool = False, gpus: int = 1) -> Job:
    job = Job(id="j-a", state="QUEUED", gpus=gpus, steps=steps, total_steps=total, total_steps_from="spec",
              rate=rate, rate_at=rate_at, priority=priority, held=held)
    job.__dict__["state"] = state  # (every state change goes through repo.transition)
    return job


def test_the_eta_says_what_it_assumes_when_the_job_time_slices() -> None:
    running, note = estimate(_job(), "node-b/3", [Sharer("j-a", "RUNNING", 1)])
    assert running == pytest.approx(330) and note == "660 mini-batches left at 2.0/s"
    assert eta_text(running, note) == "~6 min (660 mini-batches left at 2.0/s)"
    assert progress_text(340, 1000) == "step 340 / 1,000 (34%)"
    # Taking turns with two others of its priority: about 1/3 of the time.
    others = [Sharer("j-b", "SUSPENDED", 1), Sharer("j-c", "SUSPENDED", 1)]
    wall, note = estimate(_job(), "node-b/3", others)
    assert wall == pytest.approx(990)
    assert note == ("~6 min of running, 660 mini-batches left at 2.0/s; it runs about 1/3 of the time "
                    "while it time-slices GPU node-b/3 with 2 other job(s)")
    assert short(wall, 340, 1000) == "34%/16m"
    # Waiting for its turn: the rate it ran at there still holds.
    assert estimate(_job("SUSPENDED"), "node-b/3", others + [Sharer("j-d", "RUNNING", 1)])[0] == pytest.approx(1320)
    # Packed beside another: its measured rate already is its packed rate.
    assert estimate(_job(), "node-b/3", [Sharer("j-b", "RUNNING", 1)])[1].endswith(
        "its rate packed beside 1 other job(s) on GPU node-b/3")


@pytest.mark.parametrize(("job", "said"), [
    (_job("QUEUED"), "unknown while it waits in the queue"),
    (_job("MIGRATING"), "unknown while it moves: its rate on the new GPUs is not measured yet"),
    (_job("SUSPENDED", held=True), "unknown while an operator holds it suspended"),
    (_job(rate=0.0, rate_at=0.0), "unknown until its rate is measured (no mini-batch timed yet)"),
    # Relaunched (a restart, a move, a grow to 2 GPUs): the old rate is not its rate now.
    (_job(rate_at=0.0, gpus=2), ("unknown until its rate on its current 2 GPU(s) is measured (it ran 2.0 "
                                 "mini-batches/s before it was started again or moved)")),
    (_job("SUSPENDED"), "unknown while it is suspended (~6 min of running once it runs again)"),
])
def test_no_made_up_eta(job: Job, said: str) -> None:
    eta_s, note = estimate(job, "node-a/0", [])
    assert (eta_s, note) == (-1.0, said)
    assert short(eta_s, job.steps, job.total_steps) == "34%/?"


def test_a_grown_job_is_named_by_the_gpus_it_holds() -> None:
    """A grow-shrink job asked for 1 GPU and grown onto 2: its new launch's rate is on 2."""
    assert estimate(_job(rate_at=0.0), "node-a/0", [], placed=2)[1].startswith(
        "unknown until its rate on its current 2 GPU(s) is measured")


def test_without_a_total_or_once_done() -> None:
    assert estimate(_job(total=0), "node-a/0", []) == (-1.0, "")
    assert short(-1.0, 340, 0) == "-" and progress_text(340, 0) == ""
    # An ended job has no ETA to come: `get jobs` showed a killed job as "1%/?".
    assert short(-1.0, 12, 1000, ended=True) == "1%" and short(-1.0, 0, 1000, ended=True) == "0%"
    assert estimate(_job("SUCCEEDED"), "", []) == (-1.0, "")
    assert estimate(_job(steps=1000), "node-a/0", []) == (0.0, "at its last mini-batch")
    # A total given at submission is a guess: a job past it says so, not "at its last mini-batch".
    assert estimate(_job(steps=1250), "node-a/0", []) == (
        -1.0, "unknown: it ran past the 1,000 mini-batches given at submission (--steps)")
    assert progress_text(1250, 1000) == "step 1,250 / 1,000 (125%)" and short(-1.0, 1250, 1000) == "125%/?"
    assert [short(s, 1, 2) for s in (5, 720, 7500, 200000)] == ["50%/5s", "50%/12m", "50%/2h05", "50%/2d07h"]


def test_top_and_a_waiting_submit_show_progress_and_eta() -> None:
    """`gandiva top` and `gandiva-submit`'s wait line carry the same progress and ETA."""
    import io

    from protos.gandiva.v1 import common_pb2
    from scheduler.cli import top
    from scheduler.cli.output import Console
    from scheduler.cli.wait import Follower

    job = common_pb2.Job(id="j-a", spec=common_pb2.JobSpec(name="net"), state=common_pb2.JOB_STATE_RUNNING,
                         steps=340, total_steps=1000, eta_s=330.0, rate=2.0)
    line = Follower.progress(None, [job])  # type: ignore[arg-type]
    assert "step 340 / 1,000 (34%)  ETA ~6 min  rate 2.00/s" in line, line
    job.eta_s = -1
    assert "ETA unknown" in Follower.progress(None, [job])  # type: ignore[arg-type]
    state = {"servers": [], "height": 0, "overloaded": False, "decisions": [], "jobs": [
        {"id": "j-a", "name": "net", "state": "RUNNING", "gpus": 1, "placement": ["n/0"], "steps": 340, "rate": 2.0,
         "last_decision": None, "message": "", "total_steps": 1000, "progress": "step 340 / 1,000 (34%)", "eta_s": 330.0},
        {"id": "j-b", "name": "old", "state": "QUEUED", "gpus": 1, "placement": [], "steps": 0, "rate": 0.0,
         "last_decision": None, "message": ""},  # a scheduler from before: no progress fields
        # Started, no mini-batch timed yet: no rate, as `get jobs` says (it read 0.0 here).
        {"id": "j-c", "name": "new", "state": "RUNNING", "gpus": 1, "placement": ["n/1"], "steps": 0, "rate": 0.0,
         "last_decision": None, "message": ""}]}
    console = Console(file=io.StringIO(), width=200, color_system=None)
    with console.capture() as shown:
        console.print(top.render(state))
    assert "340 / 1,000 (34%)" in shown.get() and "34%/6m" in shown.get(), shown.get()
    row = next(line for line in shown.get().splitlines() if "j-c" in line)
    assert "0.0" not in row and " - " in row, row
