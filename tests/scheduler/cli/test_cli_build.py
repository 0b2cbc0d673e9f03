"""gandiva-submit's flags, spec file and command turned into JobSpecs (no scheduler)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler.cli.spec import SpecError
from scheduler.cli.submit import build_parser, build_submission, main, split_command

CALLER_ENV = {"PATH": "/usr/bin", "PYTHONPATH": "/src", "SECRET": "s", "TF_CPP_MIN_LOG_LEVEL": "2"}


def build(argv: list[str], cwd: str = "/home/u/proj"):
    options, command = split_command(argv)
    return build_submission(build_parser().parse_args(options), command, CALLER_ENV, cwd)


def test_single_job_from_flags() -> None:
    sub = build(["--gpus", "2", "--name", "resnet", "--priority", "3", "--grow-shrink",
                 "--env", "SEED=1", "--workdir", "runs", "--", "python", "train.py", "--lr", "0.1"])
    assert not sub.multi
    (spec,) = sub.jobs
    assert list(spec.command) == ["python", "train.py", "--lr", "0.1"]
    assert (spec.name, spec.gpus, spec.priority, spec.grow_shrink) == ("resnet", 2, 3, True)
    assert spec.workdir == "/home/u/proj/runs"
    assert dict(spec.env) == {"PATH": "/usr/bin", "PYTHONPATH": "/src", "TF_CPP_MIN_LOG_LEVEL": "2",
                              "SEED": "1"}


def test_defaults_are_one_gpu_priority_one_and_the_cwd() -> None:
    (spec,) = build(["--", "python", "t.py"], cwd="/data").jobs
    assert (spec.gpus, spec.priority, spec.workdir, spec.grow_shrink) == (1, 1, "/data", False)


def test_flags_override_the_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: fromfile\ngpus: 4\npriority: 2\ncommand: [python, a.py]\n"
                    "env: {A: 1}\nenv_pass: [SECRET]\ngrow_shrink: true\n")
    (spec,) = build(["-f", str(path), "--gpus", "8", "--no-grow-shrink"]).jobs
    assert (spec.name, spec.gpus, spec.priority, spec.grow_shrink) == ("fromfile", 8, 2, False)
    assert list(spec.command) == ["python", "a.py"]
    assert spec.env["A"] == "1" and spec.env["SECRET"] == "s"
    (spec,) = build(["-f", str(path), "--", "python", "b.py"]).jobs
    assert list(spec.command) == ["python", "b.py"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--gpus", "3", "--", "python"], "--gpus must be a power of two"),
        (["--gpus", "0", "--", "python"], "--gpus must be a power of two"),
        (["--priority", "-1", "--", "python"], "--priority must be 0 or more"),
        (["--gpus", "1"], "command: nothing to run"),
        (["--", ""], "command: nothing to run"),
        (["--array", "5-1", "--", "python"], "--array"),
        (["--env", "oops", "--", "python"], "--env"),
    ],
)
def test_invalid_input_names_the_field(argv: list[str], fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        build(argv)


def test_spec_file_gpus_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("gpus: 3\ncommand: [python]\n")
    with pytest.raises(SpecError, match="job.yaml: gpus must be a power of two"):
        build(["-f", str(path)])


def test_array_members_know_their_index() -> None:
    sub = build(["--array", "0-6:3", "--name", "hp", "--", "python", "t.py", "--seed", "{index}"])
    assert sub.multi and sub.name == "hp"
    assert [j.index for j in sub.jobs] == [0, 3, 6]
    assert [j.name for j in sub.jobs] == ["hp-0", "hp-3", "hp-6"]
    assert [j.env["GANDIVA_ARRAY_INDEX"] for j in sub.jobs] == ["0", "3", "6"]
    assert [list(j.command)[-1] for j in sub.jobs] == ["0", "3", "6"]


def test_sweep_members_get_params_in_env_spec_and_command(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: lrsearch\ngrid:\n  lr: [0.1, 0.01]\n")
    sub = build(["--sweep", str(sweep), "--gpus", "2", "--", "python", "t.py", "--lr", "{lr}"])
    assert sub.name == "lrsearch"
    assert [dict(j.params) for j in sub.jobs] == [{"lr": "0.1"}, {"lr": "0.01"}]
    assert [j.env["GANDIVA_PARAM_LR"] for j in sub.jobs] == ["0.1", "0.01"]
    assert [list(j.command)[-1] for j in sub.jobs] == ["0.1", "0.01"]
    assert all(j.gpus == 2 for j in sub.jobs)


def test_sweep_block_inside_the_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("command: [python, t.py]\nsweep:\n  list:\n    - {opt: sgd}\n    - {opt: adam}\n")
    sub = build(["-f", str(path)])
    assert [j.params["opt"] for j in sub.jobs] == ["sgd", "adam"]
    assert [j.name for j in sub.jobs] == ["t-0", "t-1"]  # named after the script


def test_sweep_and_array_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--sweep", "s.yaml", "--array", "0-1"])


def test_command_without_the_separator_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpus", "2", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: python train.py" in err and "goes after --" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--array", ""], "--array: empty"),
    (["--sweep", ""], "--sweep: no file given"),
])
def test_an_empty_array_or_sweep_is_refused(argv: list[str], message: str) -> None:
    """`--array ""` submitted one ordinary job (the test was `if args.array:`)."""
    with pytest.raises(SpecError, match=message):
        build([*argv, "--", "python", "t.py"])


def test_a_multi_job_name_too_long_for_its_suffix_names_the_room_left(tmp_path: Path) -> None:
    """The scheduler blamed jobs[0].name, longer than 256 bytes (257), for a --name of 255:
    the member suffix -0 was not the user's."""
    with pytest.raises(SpecError) as err:
        build(["--array", "0-2", "--name", "n" * 255, "--", "python", "t.py"])
    assert str(err.value) == ("--name: too long for a multi-job: each member is named NAME-INDEX, at "
                              "most 256 bytes, and the longest suffix here is '-2', which leaves 254 "
                              "bytes for NAME; it has 255")
    sub = build(["--array", "0-2", "--name", "n" * 254, "--", "python", "t.py"])
    assert max(len(j.name) for j in sub.jobs) == 256
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"name: {'s' * 255}\ngrid: {{lr: [1]}}\n")
    with pytest.raises(SpecError, match=f"^{sweep}: name: too long for a multi-job"):
        build(["--sweep", str(sweep), "--", "python", "t.py"])
    # A name derived from the script is shortened to fit instead.
    sub = build(["--array", "0-10", "--", "python", "x" * 300 + ".py"])
    assert sub.name == "x" * 253 and sub.jobs[-1].name == "x" * 253 + "-10"


def test_total_steps_from_the_flag_or_the_spec_file_and_bad_ones_named(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--steps N` / `steps:` give the job's total mini-batches (its progress and ETA)."""
    (spec,) = build(["--steps", "1,000", "--", "python", "t.py"]).jobs
    assert spec.steps == 1000
    path = tmp_path / "job.yaml"
    path.write_text("command: [python, a.py]\nsteps: 5000\n")
    assert build(["-f", str(path)]).jobs[0].steps == 5000
    assert build(["-f", str(path), "--steps", "7"]).jobs[0].steps == 7
    assert build(["--", "python", "t.py"]).jobs[0].steps == 0  # not given: unknown
    assert build(["--steps", "20_000", "--", "python", "t.py"]).jobs[0].steps == 20000
    for bad in ("0", "-5", "1e6", "ten", "\u0665", ",5", "1,0", "1,0000", "5_", " 5"):
        with pytest.raises(SystemExit) as exit_:
            build(["--steps", bad, "--", "python", "t.py"])
        assert exit_.value.code == 2
        assert f"--steps: expected a whole number of mini-batches, 1 or more, got {bad!r}" in capsys.readouterr().err
    for text, said in (("steps: -3", f"{path}: steps must be a whole number of mini-batches from 1"),
                       ("steps: 0", f"{path}: steps must be a whole number of mini-batches from 1"),
                       ("steps: 1500.0", "field 'steps' has the wrong type (float)"),
                       ("steps: true", "field 'steps' has the wrong type (bool)")):
        path.write_text(f"command: [python, a.py]\n{text}\n")
        with pytest.raises(SpecError, match=re.escape(said)):
            build(["-f", str(path)])


def test_env_pass_of_a_gandiva_name_is_refused_and_an_unset_name_is_warned_of(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--env-pass GANDIVA_HOME` was dropped without a word (`--env GANDIVA_X=1` is refused), and
    # `--env-pass WANDB_API_KY` (a typo) gave a job without the key, silently.
    for name in ("GANDIVA_HOME", "CUDA_VISIBLE_DEVICES"):
        with pytest.raises(SpecError, match=re.escape(f"--env-pass {name}: set for each job by Gandiva")):
            build(["--env-pass", name, "--", "python", "t.py"])
    sub = build(["--env-pass", "SECRET", "--env-pass", "WANDB_API_KY", "--env-pass", "NOPE_*", "--", "python", "t.py"])
    assert sub.jobs[0].env["SECRET"] == "s" and "WANDB_API_KY" not in sub.jobs[0].env
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == [("gandiva-submit: warning: --env-pass WANDB_API_KY: not set in your environment, so the job "
                      "does not get it")]
    path = tmp_path / "job.yaml"
    path.write_text("command: [python, t.py]\nenv_pass: [MISSING]\n")
    build(["-f", str(path)])
    assert f"{path}: env_pass MISSING: not set in your environment" in capsys.readouterr().err


def test_a_placeholder_naming_no_parameter_of_the_sweep_is_warned_of(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--h {hiden}` (for {hidden}) reached every member as the text "{hiden}", without a word.
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid: {lr: [0.1, 0.2], hidden: [32]}\n")
    sub = build(["--sweep", str(sweep), "--", "python", "t.py", "--lr", "{lr}", "--h", "{hiden}",
                 "--out", "${HOME}/{index}", '{"json": 1}'])
    assert sub.jobs[0].command[3:6] == ["0.1", "--h", "{hiden}"]
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == [("gandiva-submit: warning: {hiden} in the command names no parameter (it has {lr}, {hidden}, "
                      "{index}), so it is passed as it is")]
    build(["--array", "0-1", "--", "python", "t.py", "--seed", "{index}", "${HOME}"])
    assert "warning" not in capsys.readouterr().err
