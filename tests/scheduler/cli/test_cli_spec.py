"""The submission inputs: spec files, sweeps, arrays and the environment allow-list."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli import spec as specs
from scheduler.cli.spec import SpecError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("0-3", [0, 1, 2, 3]),
        ("0-31:8", [0, 8, 16, 24]),
        ("1,3,5", [1, 3, 5]),
        ("0-2,10", [0, 1, 2, 10]),
        ("7", [7]),
    ],
)
def test_array_ranges(text: str, indices: list[int]) -> None:
    assert [m.index for m in specs.parse_array(text)] == indices


@pytest.mark.parametrize("text", ["", "a-b", "3-1", "0-4:0", "1,1", "-1", "0-3:"])
def test_malformed_array_names_the_flag(text: str) -> None:
    with pytest.raises(SpecError, match="--array"):
        specs.parse_array(text)


def test_grid_sweep_is_the_cartesian_product(tmp_path: Path) -> None:
    path = write(tmp_path, "sweep.yaml", "name: hp\ngrid:\n  lr: [0.1, 0.01]\n  bs: [32, 64, 128]\n")
    name, members = specs.load_sweep(path)
    assert name == "hp"
    assert len(members) == 6
    assert [m.index for m in members] == list(range(6))
    assert members[0].params == {"lr": "0.1", "bs": "32"}
    assert {(m.params["lr"], m.params["bs"]) for m in members} == {
        (lr, bs) for lr in ("0.1", "0.01") for bs in ("32", "64", "128")
    }


def test_list_sweep_keeps_each_parameter_set(tmp_path: Path) -> None:
    path = write(tmp_path, "sweep.yaml", "list:\n  - {lr: 0.1, opt: adam}\n  - {lr: 1e-3, warm: true}\n")
    _, members = specs.load_sweep(path)
    assert [m.params for m in members] == [{"lr": "0.1", "opt": "adam"}, {"lr": "1e-3", "warm": "true"}]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("grid:\n  lr: []\n", "grid.lr is an empty list"),
        ("grid: 3\n", "'grid' must map"),
        ("list: []\n", "'list' must be a non-empty list"),
        ("list:\n  - 3\n", "list[0]"),
        ("grid:\n  lr: [1]\nlist:\n  - {a: 1}\n", "exactly one of"),
        ("grids:\n  lr: [1]\n", "unknown field 'grids'"),
        ("grid:\n  'bad-name': [1]\n", "'bad-name'"),
        ("grid:\n  lr: [{a: 1}]\n", "grid.lr"),
        ("- 1\n- 2\n", "mapping"),
        ("grid: [1, 2\n", "not valid YAML"),
    ],
)
def test_malformed_sweep_is_one_clear_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, "sweep.yaml", text)
    with pytest.raises(SpecError) as err:
        specs.load_sweep(path)
    assert fragment in str(err.value)
    assert "sweep.yaml" in str(err.value)


def test_spec_file_unknown_field_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: x\ngpu: 2\n")
    with pytest.raises(SpecError, match="unknown field 'gpu'"):
        specs.load_spec_file(path)


def test_spec_file_wrong_type_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "gpus: true\n")
    with pytest.raises(SpecError, match="'gpus' has the wrong type"):
        specs.load_spec_file(path)


@pytest.mark.parametrize(("text", "said"), [
    # Before: only "field 'gpus' has the wrong type (str)", and for a YAML error no line at all
    # ("not valid YAML (while scanning for the next token)").
    ('gpus: "two"\n', "field 'gpus' has the wrong type (str): 'two'; give a whole number, e.g. gpus: 2"),
    ("steps: 1e9\n", ("field 'steps' has the wrong type (str): '1e9'; give a whole number of mini-batches, "
                     "e.g. steps: 20000 (YAML reads 1e9 as text: write the number out in digits)")),
    ("grow_shrink: yes please\n", "field 'grow_shrink' has the wrong type (str): 'yes please'; give true or false"),
    ("env_pass: WANDB_API_KEY\n", "give a list of variable names, e.g. env_pass: [WANDB_API_KEY]"),
    ("gpus: true\n", "field 'gpus' has the wrong type (bool): true; give a whole number"),
    ("gpus: .nan\n", "field 'gpus' has the wrong type (float): nan; give a whole number"),  # (_WrittenFloat)
    # (LibYAML's words since session 50; the pure-Python parser's were "found character '\t'
    # that cannot start any token" and "mapping values are not allowed here".)
    ("command: python t.py\n\tgpus: 1\n", ("not valid YAML at line 2, column 1: found a tab character that "
                                           "violates indentation (YAML indents with spaces, never tabs)")),
    ("name: a: b\n", "not valid YAML at line 1, column 8: mapping values are not allowed in this context"),
    ("sweep:\n  list:\n" + "    - {lr: 1}\n" * 5000 + "  \tgrid: {}\n",
     ("not valid YAML at line 5003, column 3: found character '\\t' that cannot start any token (YAML indents "
      "with spaces, never tabs)")),
    # A tag that builds an object: never built (a SafeLoader), but the error said only that
    # the parser "could not determine a constructor", not what to write instead.
    ("name: !!python/object/apply:os.system [touch /tmp/x]\n",
     ("not valid YAML at line 1, column 7: the tag '!!python/object/apply:os.system' asks to build an object, "
      "which a spec never does; write the plain value")),
    ("env: {A: !secret a}\n", "not valid YAML at line 1, column 10: the tag '!secret' asks to build an object"),
    # A key given twice: the last was taken, without a word (a second env: dropped the first's).
    ("command: python t.py\ngpus: 1\nenv: {A: 1}\ngpus: 8\n",
     "not valid YAML at line 4, column 1: 'gpus' is given twice in one mapping (lines 2 and 4); keep one"),
    ("env:\n  A: 1\n  B: 2\n  A: 3\n", "at line 4, column 3: 'A' is given twice in one mapping (lines 2 and 4)"),
])
def test_spec_file_errors_say_what_to_write_and_where(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, "job.yaml", text)
    with pytest.raises(SpecError) as err:
        specs.load_spec_file(path)
    assert said in str(err.value), str(err.value)


def test_a_merged_key_may_be_given_again(tmp_path: Path) -> None:
    """YAML's merge (`<<: *base`) is not a key given twice: the mapping's own value wins."""
    path = write(tmp_path, "job.yaml", "command: python t.py\nenv: {<<: {A: 1, B: 2}, A: 3}\n")
    assert specs.load_spec_file(path)["env"] == {"A": "3", "B": "2"}


def test_spec_file_command_string_is_split_like_a_shell(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "command: python train.py --msg 'a b'\ngpus: 2\n")
    assert specs.load_spec_file(path) == {"command": ["python", "train.py", "--msg", "a b"], "gpus": 2}


def test_missing_spec_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        specs.load_spec_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize("load", [specs.load_spec_file, specs.load_sweep])
def test_an_endless_or_huge_spec_file_is_refused_at_once(tmp_path: Path, load) -> None:  # type: ignore[no-untyped-def]
    """`-f /dev/zero` read until memory ran out."""
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 120_000)
    for path in (Path("/dev/zero"), huge):
        if path.exists():
            with pytest.raises(SpecError, match=f"^{path}: larger than 1 MiB; a job spec or sweep is a YAML file"):
                load(path)


@pytest.mark.parametrize("gpus", [0, 3, 6, -2])
def test_gpus_must_be_a_power_of_two(gpus: int) -> None:
    with pytest.raises(SpecError, match="--gpus must be a power of two"):
        specs.check_gpus(gpus)


def test_negative_priority_is_rejected() -> None:
    with pytest.raises(SpecError, match="--priority must be 0 or more"):
        specs.check_priority(-1)


def test_environment_is_allow_listed() -> None:
    caller = {
        "PATH": "/bin", "TF_USE_LEGACY_KERAS": "1", "SECRET_TOKEN": "x", "WANDB_KEY": "k",
        "CUDA_VISIBLE_DEVICES": "0", "GANDIVA_SCHEDULER": "h:1", "HOME": "/home/u",
        "TF_VAR_db_password": "p",
    }
    env = specs.build_env(caller, ["WANDB_*"], {"SEED": "3"})
    assert env == {"PATH": "/bin", "TF_USE_LEGACY_KERAS": "1", "WANDB_KEY": "k",
                   "HOME": "/home/u", "SEED": "3"}
    assert specs.build_env(caller, ["SECRET_TOKEN"], {}, use_defaults=False) == {"SECRET_TOKEN": "x"}
    # Terraform's TF_VAR_* matches TF_* but is never passed unless asked for by name.
    assert specs.build_env(caller, ["TF_VAR_*"], {}, use_defaults=False) == {"TF_VAR_db_password": "p"}


def test_env_assignment_needs_a_valid_name() -> None:
    assert specs.parse_env_assignment("A_1=x=y") == ("A_1", "x=y")
    for bad in ("novalue", "1A=x", "=x"):
        with pytest.raises(SpecError, match="--env"):
            specs.parse_env_assignment(bad)
    with pytest.raises(SpecError, match="GANDIVA_"):
        specs.build_env({}, [], {"GANDIVA_ARRAY_INDEX": "1"})


def test_member_env_and_command_placeholders() -> None:
    member = specs.Member(index=4, params={"lr": "0.1", "bs": "32"})
    assert specs.member_env(member) == {
        "GANDIVA_ARRAY_INDEX": "4", "GANDIVA_PARAM_LR": "0.1", "GANDIVA_PARAM_BS": "32",
    }
    command = ["python", "t.py", "--lr={lr}", "--out", "run{index}", '{"keep": 1}', "{other}"]
    assert specs.member_command(command, member) == [
        "python", "t.py", "--lr=0.1", "--out", "run4", '{"keep": 1}', "{other}",
    ]


def test_spec_file_env_must_be_plain_values(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "env:\n  A: [1, 2]\n")
    with pytest.raises(SpecError, match="'env' must hold plain values"):
        specs.load_spec_file(path)


def test_spec_file_command_with_an_unclosed_quote_is_named(tmp_path: Path) -> None:
    """shlex's ValueError ("No closing quotation") came out as a traceback."""
    path = write(tmp_path, "job.yaml", 'command: "python \\"unterminated"\n')
    with pytest.raises(SpecError, match=r"job.yaml: command: cannot split .* \(no closing quotation\); "
                                        "close the quote, or give the command as a list"):
        specs.load_spec_file(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("env: {A: null}\n", "env.A: no value (null)"),
        ("env: {A: ~}\n", "env.A: no value (null)"),
        ("env: {B: true}\n", "env.B: true is a boolean"),
        ("env: {B: no}\n", "env.B: false is a boolean"),
        ("command: [python, 1, null]\n", "command[2]: no value (null)"),
        ("command: [python, on]\n", "command[1]: true is a boolean"),
        ("command: [python, [a]]\n", "command[1]: must be a plain value"),
        ("env_pass: [null]\n", "env_pass[0]: no value (null)"),
        ("env: {1A: x}\n", "env: '1A' is not a valid variable name"),
    ],
)
def test_spec_file_null_and_boolean_values_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    """`env: {A: null, B: true}` gave the job A=None and B=True; a command list
    [python, 1, null] an argument "None"."""
    path = write(tmp_path, "job.yaml", text)
    with pytest.raises(SpecError) as err:
        specs.load_spec_file(path)
    assert str(err.value).startswith(f"{path}: {fragment}")
    if "boolean" in fragment:
        assert "in quotes" in str(err.value)


def test_spec_file_numbers_become_their_text(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "command: [python, 1, 2.5]\nenv: {SEED: 7, RATE: 0.5, S: 'true'}\n")
    assert specs.load_spec_file(path) == {"command": ["python", "1", "2.5"],
                                          "env": {"SEED": "7", "RATE": "0.5", "S": "true"}}


def test_numbers_reach_the_job_as_the_file_writes_them(tmp_path: Path) -> None:
    """YAML 1.1 reads 0755 as octal (493), 12:30 as base 60 (750), 0x1F as 31, 1_000 as 1000
    and 1.10 as 1.1: the job got UMASK=493, a sweep over [0100, 0200] ran steps 64 and 128,
    VERSION=1.1, without a word. Numbers the spec takes as numbers stay numbers. A time is
    text as written too; !!binary and !!set are not text."""
    path = write(tmp_path, "job.yaml", "command: python t.py --v 1\ngpus: 0x2\npriority: 010\n"
                 "env: {UMASK: 0755, AT: '12:30', T: 12:30, H: 0x1F, N: 1_000, VERSION: 1.10, E: 1.0e+3, I: 7}\n")
    spec = specs.load_spec_file(path)
    assert spec["env"] == {"UMASK": "0755", "AT": "12:30", "T": "12:30", "H": "0x1F", "N": "1_000",
                           "VERSION": "1.10", "E": "1.0e+3", "I": "7"}
    assert (spec["gpus"], spec["priority"]) == (2, 8) and type(spec["gpus"]) is int
    path = write(tmp_path, "sweep.yaml", "grid:\n  step: [0100, 0200]\n  v: [1.10, 2]\n")
    assert [m.params for m in specs.load_sweep(path)[1]] == [
        {"step": s, "v": v} for s in ("0100", "0200") for v in ("1.10", "2")]
    path = write(tmp_path, "list.yaml", "command: [python, t.py, 0755]\n")
    assert specs.load_spec_file(path)["command"] == ["python", "t.py", "0755"]
    path = write(tmp_path, "at.yaml", "command: python t.py\nenv: {AT: 2024-01-01T10:00:00Z}\n")  # was +00:00
    assert specs.load_spec_file(path)["env"] == {"AT": "2024-01-01T10:00:00Z"}
    path = write(tmp_path, "bin.yaml", "command: python t.py\nenv: {B: !!binary aGVsbG8=}\n")  # was b'hello'
    with pytest.raises(SpecError, match="env.B: must be a plain value, not a bytes"):
        specs.load_spec_file(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("grid:\n  lr: [0.1]\n  LR: [1]\n",
         "grid: parameters 'lr' and 'LR' differ only in case; both would be GANDIVA_PARAM_LR"),
        ("list:\n  - {lr: 0.1}\n  - {Lr: 1}\n", "list: parameters 'lr' and 'Lr' differ only in case"),
        ("grid:\n  index: [1, 2]\n", "grid: a parameter cannot be called 'index'"),
        ("list:\n  - {index: 1}\n", "list: a parameter cannot be called 'index'"),
    ],
)
def test_sweep_parameters_that_would_be_lost_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    """Names differing only in case became one GANDIVA_PARAM_<NAME> (one value dropped);
    a parameter called index was hidden by {index}, the member's index."""
    path = write(tmp_path, "sweep.yaml", text)
    with pytest.raises(SpecError) as err:
        specs.load_sweep(path)
    assert str(err.value).startswith(f"{path}: {fragment}")


def test_an_empty_array_says_so() -> None:
    with pytest.raises(SpecError, match="^--array: empty; give a range such as 0-31"):
        specs.parse_array(" ")


@pytest.mark.parametrize("load", [specs.load_spec_file, specs.load_sweep])
def test_a_deeply_nested_spec_file_is_one_clear_error(tmp_path: Path, load) -> None:  # type: ignore[no-untyped-def]
    """A file of nested brackets well under 1 MiB was a RecursionError traceback from the YAML parser."""
    path = write(tmp_path, "deep.yaml", "name: " + "{a: " * 3_000 + "1" + "}" * 3_000 + "\n")
    with pytest.raises(SpecError, match=f"^{path}: nested too deeply"):
        load(path)


_DIGITS = st.text("0123456789", min_size=1, max_size=6)
# Scalars YAML 1.1 reads as numbers, in the spellings people write: octal, hex, binary,
# base 60, underscores, signs, trailing zeros, leading dots, exponents.
_NUMBER_TEXT = st.one_of(
    _DIGITS, st.builds("0{}".format, _DIGITS), st.builds("0x{}".format, st.text("0123456789abcdefABCDEF", min_size=1,
                                                                                 max_size=6)),
    st.builds("0b{}".format, st.text("01", min_size=1, max_size=8)),
    st.builds("{}:{}".format, st.integers(1, 99), st.integers(0, 59).map("{:02d}".format)),
    st.builds("{}_{}".format, _DIGITS, _DIGITS), st.builds("{}{}".format, st.sampled_from("+-"), _DIGITS),
    st.builds("{}.{}".format, _DIGITS, _DIGITS), st.builds(".{}".format, _DIGITS),
    st.builds("{}.{}e{}{}".format, _DIGITS, _DIGITS, st.sampled_from(["+", "-"]), st.integers(0, 30)),
    st.sampled_from([".inf", "-.inf", ".NaN", "1.10", "0.0010", "190:20:30"]))


@pytest.mark.full  # further cases of -k as_the_file, which checks the mechanism
@settings(max_examples=300, derandomize=True, deadline=None)
@given(text=_NUMBER_TEXT)
def test_any_number_reaches_the_job_as_written(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = write(tmp_path_factory.mktemp("n"), "job.yaml", f"command: [python, t.py, {text}]\nenv: {{X: {text}}}\n")
    spec = specs.load_spec_file(path)
    assert (spec["env"], spec["command"][2]) == ({"X": text}, text)
    path = write(tmp_path_factory.mktemp("s"), "sweep.yaml", f"grid:\n  v: [{text}]\n")
    assert [m.params for m in specs.load_sweep(path)[1]] == [{"v": text}]


def test_a_sweep_of_more_members_than_allowed_is_refused_before_its_values_are_built(tmp_path: Path) -> None:
    """Every value was built (in Python) before the members were counted: a sweep file near
    the 1 MiB cap with 60,000 `list:` entries took 8-22 s to be refused. Now the count is taken
    as parsed, so a value that could not be built (here a tag) after 10,001 entries is never
    reached."""
    entry = "{lr: 1}\n"
    last = "{lr: !!python/object/apply:os.system [x]}\n"
    sweep = write(tmp_path, "sweep.yaml", "list:\n" + ("  - " + entry) * 10_001 + "  - " + last)
    with pytest.raises(SpecError, match=f"^{sweep}: 10002 members is more than 10000$"):
        specs.load_sweep(sweep)
    spec = write(tmp_path, "job.yaml", "command: [python, t.py]\nsweep:\n  list:\n" + ("    - " + entry) * 10_001
                 + "    - " + last)
    with pytest.raises(SpecError, match=f"^{spec}: sweep: 10002 members is more than 10000$"):
        specs.load_spec_file(spec)
