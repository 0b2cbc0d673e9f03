"""gandiva-submit against a real scheduler: what gets submitted, what is refused,
and the exit code of a waiting submit mirroring the job's outcome."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from protos.gandiva.v1 import common_pb2, scheduler_pb2


def test_no_wait_submits_and_prints_the_follow_commands(submit, stub, list_jobs, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.setenv("SECRET_TOKEN", "do-not-pass")
    r = submit("--gpus", "2", "--name", "resnet", "--priority", "3", "--env", "SEED=7",
               "--no-wait", "--", "python", "train.py", "--lr", "0.1")
    assert r.code == 0, r.err
    (job,) = list_jobs(stub)
    assert f"submitted job {job.id}" in r.out
    assert f"gandiva describe job {job.id}" in r.out and f"gandiva kill {job.id}" in r.out
    assert f"gandiva wait {job.id}" in r.out  # to block on it later (session 49)
    assert list(job.spec.command) == ["python", "train.py", "--lr", "0.1"]
    assert (job.spec.name, job.spec.gpus, job.spec.priority) == ("resnet", 2, 3)
    assert job.spec.workdir == str(tmp_path)
    assert job.spec.env["SEED"] == "7" and job.spec.env["TF_USE_LEGACY_KERAS"] == "1"
    assert "SECRET_TOKEN" not in job.spec.env
    assert job.state == common_pb2.JOB_STATE_QUEUED


def test_parsable_array_is_one_multi_job(sched, stub, list_jobs, script) -> None:
    r = script("gandiva-submit", "--parsable", "--array", "0-6:2", "--name", "seeds",
               "--", "python", "t.py", "--seed", "{index}")
    assert r.code == 0, r.err
    ids = r.out.split()
    assert len(ids) == 4 and r.out == "".join(f"{i}\n" for i in ids)  # ids only
    jobs = {j.id: j for j in list_jobs(stub)}
    assert set(jobs) == set(ids)
    assert len({j.spec.multi_job_id for j in jobs.values()}) == 1  # one SubmitMultiJob
    members = sorted(jobs.values(), key=lambda j: j.spec.index)
    assert [j.spec.index for j in members] == [0, 2, 4, 6]
    assert [j.spec.env["GANDIVA_ARRAY_INDEX"] for j in members] == ["0", "2", "4", "6"]
    assert [j.spec.command[-1] for j in members] == ["0", "2", "4", "6"]
    assert [j.spec.name for j in members] == ["seeds-0", "seeds-2", "seeds-4", "seeds-6"]


def test_output_into_a_closed_pipe_is_a_quiet_success(sched, stub, list_jobs,
                                                      script_into_closed_pipe) -> None:
    """`gandiva-submit --no-wait --array 0-299 ... | head -2` submitted the jobs, then
    ended in a BrokenPipeError traceback and exit 1, which a script reads as a failed
    submission."""
    r = script_into_closed_pipe("gandiva-submit", "--no-wait", "--array", "0-2", "--", "sleep", "1")
    assert (r.code, r.err) == (0, "")
    assert len(list_jobs(stub)) == 3
    # Waiting, it stops waiting as on Ctrl-C (the job keeps running): no outcome is claimed.
    r = script_into_closed_pipe("gandiva-submit", "--", "sleep", "1")
    assert (r.code, r.err) == (130, "")
    assert len(list_jobs(stub)) == 4


def test_sweep_members_are_told_their_parameters(submit, stub, list_jobs, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid:\n  lr: [0.1, 0.01]\n  bs: [32, 64]\n")
    r = submit("--sweep", str(sweep), "--no-wait", "--", "python", "train.py", "--lr", "{lr}")
    assert r.code == 0, r.err
    jobs = list_jobs(stub)
    assert len(jobs) == 4 and "submitted multi-job" in r.out
    assert {(j.spec.params["lr"], j.spec.params["bs"]) for j in jobs} == {
        ("0.1", "32"), ("0.1", "64"), ("0.01", "32"), ("0.01", "64")}
    for job in jobs:
        assert job.spec.env["GANDIVA_PARAM_LR"] == job.spec.params["lr"] == job.spec.command[-1]
        assert job.spec.env["GANDIVA_PARAM_BS"] == job.spec.params["bs"]
    multi_id = jobs[0].spec.multi_job_id
    assert f"gandiva get jobs --multi-job {multi_id}" in r.out


def test_dry_run_validates_through_the_server_and_writes_nothing(submit, stub, list_jobs, tmp_path: Path) -> None:
    r = submit("--dry-run", "--gpus", "4", "--", "python", "train.py")
    assert r.code == 0, r.err
    assert "nothing was submitted" in r.err
    assert "gpus: 4" in r.out and "- train.py" in r.out and "name: train" in r.out
    assert list_jobs(stub) == []
    # Its YAML is a spec file: `--dry-run > job.yaml` then `-f job.yaml` (it was "unknown field
    # 'user'"); the same job comes out again.
    saved = tmp_path / "job.yaml"
    saved.write_text(r.out)
    again = submit("-f", str(saved), "--dry-run")
    assert again.code == 0 and again.out == r.out, again
    assert "# user: " in r.out and "\nuser:" not in r.out
    # A dry run of something the server refuses fails like the real thing.
    r = submit("--dry-run", "--name", "x" * 300, "--", "python", "train.py")
    assert r.code == 2 and "spec.name" in r.err


@pytest.mark.parametrize(
    ("argv", "spec_text", "fragment"),
    [
        (["--gpus", "3", "--", "python", "t.py"], None, "--gpus must be a power of two"),
        (["--gpus", "0", "--", "python", "t.py"], None, "--gpus must be a power of two"),
        (["--priority", "-1", "--", "python", "t.py"], None, "--priority must be 0 or more"),
        (["--gpus", "1"], None, "command: nothing to run"),
        (["-f", "SPEC"], "command: [python, t.py]\ngpu: 2\n", "unknown field 'gpu'"),
        (["--sweep", "SPEC", "--", "python"], "grid:\n  lr: []\n", "grid.lr is an empty list"),
        (["--array", "9-1", "--", "python"], None, "--array"),
        (["--array", "", "--", "python"], None, "--array: empty"),
        (["-f", "SPEC"], 'command: "python \\"unterminated"\n', "command: cannot split"),
        (["-f", "SPEC"], "command: [python]\nenv: {B: true}\n", "env.B: true is a boolean"),
        (["--array", "0-2", "--name", "n" * 255, "--", "python"], None,
         "--name: too long for a multi-job"),
        # Passes the CLI's own checks; the scheduler's INVALID_ARGUMENT names the field.
        (["--name", "n" * 300, "--", "python", "t.py"], None, "spec.name"),
    ],
)
def test_invalid_input_exits_2_with_one_line_and_writes_nothing(
    submit, stub, list_jobs, tmp_path: Path, argv: list[str], spec_text: str | None, fragment: str
) -> None:
    if spec_text is not None:
        path = tmp_path / "input.yaml"
        path.write_text(spec_text)
        argv = [str(path) if a == "SPEC" else a for a in argv]
    r = submit("--no-wait", *argv)
    assert r.code == 2
    assert fragment in r.err
    assert r.err.count("\n") == 1 and r.err.startswith("gandiva-submit: error: ")
    assert r.out == ""
    assert list_jobs(stub) == []


def test_unreachable_scheduler_says_where_and_what_to_do(submit) -> None:
    r = submit("--scheduler", "127.0.0.1:1", "--no-wait", "--", "python", "t.py")
    assert r.code == 2
    assert r.err.count("\n") == 1
    assert "cannot reach the scheduler at 127.0.0.1:1" in r.err and "gandiva scheduler" in r.err


def in_background(work) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_waiting_submit_follows_the_run_and_exits_with_its_outcome(
        submit, stub, helper, list_jobs, wait_for) -> None:
    def run_and_finish(code: int) -> None:
        running = wait_for(lambda: [j for j in list_jobs(stub)
                                    if j.state == common_pb2.JOB_STATE_RUNNING])
        job = running[0]  # type: ignore[index]
        helper.progress(job.id, steps=120, rate=8.5)
        helper.logs[job.id] = (b"=== gandiva: job started\nTraceback (most recent call last):\n"
                               b"ValueError: --lr must be positive\n")
        helper.exit(job.id, code)

    runner = in_background(lambda: run_and_finish(0))
    ok = submit("--name", "ok", "--", "python", "train.py")
    runner.join()
    assert ok.code == 0, ok.out + ok.err
    assert "RUNNING" in ok.out and "on n1" in ok.out
    assert ok.out.splitlines()[-1].endswith("SUCCEEDED after 120 mini-batches")

    runner = in_background(lambda: run_and_finish(7))
    bad = submit("--name", "bad", "--", "python", "train.py")
    runner.join()
    assert bad.code == 1, bad.out + bad.err
    assert "FAILED after 120 mini-batches" in bad.out and "7" in bad.out.splitlines()[-1]
    # What the program said, not only its exit code (before: nothing pointed to it).
    assert "its last output (all of it: gandiva logs j-" in bad.out
    assert "  ValueError: --lr must be positive" in bad.out and "=== gandiva" not in bad.out
    assert "last output" not in ok.out


def test_waiting_multi_job_exits_with_its_worst_outcome(submit, stub, helper, list_jobs,
                                                         wait_for) -> None:
    def running() -> list:
        return [j for j in list_jobs(stub) if j.state == common_pb2.JOB_STATE_RUNNING]

    def finish_members() -> None:
        wait_for(lambda: len(running()) == 2)
        first, second = sorted(running(), key=lambda j: j.spec.index)
        stub.SetPriority(scheduler_pb2.SetPriorityRequest(id=second.id, priority=9))
        helper.exit(first.id, 0)
        helper.exit(second.id, 1)

    runner = in_background(finish_members)
    r = submit("--array", "0-1", "--name", "pair", "--", "python", "train.py")
    runner.join()
    assert r.code == 1, r.out + r.err
    assert "pair-0) SUCCEEDED" in r.out and "pair-1) FAILED" in r.out
    assert "last output" not in r.out  # it printed nothing: no empty block before its line
    assert "job.priority: 1 -> 9" in r.out  # shown even when it came just before the end


def test_waiting_submit_of_a_killed_job_exits_3(submit, stub, list_jobs, wait_for) -> None:
    def kill_when_submitted() -> None:
        job = wait_for(lambda: list_jobs(stub))[0]  # type: ignore[index]
        stub.SetPriority(scheduler_pb2.SetPriorityRequest(id=job.id, priority=5))
        stub.KillJob(scheduler_pb2.JobActionRequest(id=job.id, reason="bad learning rate"))

    killer = in_background(kill_when_submitted)
    r = submit("--name", "doomed", "--", "python", "t.py")
    killer.join()
    assert r.code == 3, r.out + r.err
    assert "job.priority: 1 -> 5" in r.out  # an event that is not a state change
    assert "KILLED" in r.out.splitlines()[-1] and "bad learning rate" in r.out
