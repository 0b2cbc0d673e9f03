"""Property tests for what users hand in as files: job spec files, sweep files and
trace files with infinities, NaN, negative and huge numbers, deep nesting and
non-UTF-8 bytes. Each is either accepted as something valid or refused with the
module's own error naming the file or field, never another exception."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cli import spec as specs
from scheduler.cli.submit import build_parser, build_submission
from scheduler.sim.trace import TraceError, read_trace
from scheduler.validation import MAX_GPUS, validate_spec

FILES = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

numbers = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2, 4, -1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=20),
                    st.sampled_from(["0-1000000000", "1,1", "0-3:0", "\x00", "{index}", ".inf"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
spec_docs = st.dictionaries(
    st.sampled_from([*specs.SPEC_FIELDS, "bogus"]), values, max_size=6)
sweep_docs = st.one_of(
    st.fixed_dictionaries({"grid": st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True),
                                                   st.one_of(values, st.lists(scalars, max_size=30)), max_size=4)}),
    st.fixed_dictionaries({"list": st.lists(st.dictionaries(st.text(max_size=5), scalars, max_size=3), max_size=5)}),
    st.dictionaries(st.sampled_from(["name", "grid", "list", "x"]), values, max_size=3),
)
raw = st.one_of(st.binary(max_size=200), st.sampled_from([b"\xff\xfe\x00gpus: 1", b"gpus: \xc3\x28", b"{{{{", b"!!python/object:os.system ls"]))


def _write(tmp: Path, name: str, content: Any) -> Path:
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(yaml.safe_dump(content, allow_unicode=True))
    return path


@FILES
@given(doc=st.one_of(spec_docs, raw))
def test_spec_files(tmp_path: Path, doc: Any) -> None:
    path = _write(tmp_path, "job.yaml", doc)
    args = build_parser().parse_args(["-f", str(path)])
    try:
        sub = build_submission(args, ["python", "t.py"], {"PATH": "/bin"}, "/tmp")
    except specs.SpecError as exc:
        assert str(exc)
        return
    assert 1 <= len(sub.jobs) <= specs.MAX_MEMBERS
    for job in sub.jobs:
        assert 1 <= job.gpus <= MAX_GPUS and job.priority >= 0


@FILES
@given(doc=st.one_of(sweep_docs, raw))
def test_sweep_files(tmp_path: Path, doc: Any) -> None:
    path = _write(tmp_path, "sweep.yaml", doc)
    try:
        _, members = specs.load_sweep(path)
    except specs.SpecError as exc:
        assert str(exc).startswith(str(path))
        return
    assert 1 <= len(members) <= specs.MAX_MEMBERS
    assert all(isinstance(v, str) for m in members for v in m.params.values())


@FILES
@given(array=st.one_of(st.text(max_size=30), st.from_regex(r"\d{1,12}(-\d{1,12}(:\d{1,6})?)?(,\d{1,4})*", fullmatch=True)))
def test_array_ranges(array: str) -> None:
    try:
        members = specs.parse_array(array)
    except specs.SpecError as exc:
        assert str(exc).startswith("--array")
        return
    assert 1 <= len(members) <= specs.MAX_MEMBERS


cells = st.one_of(numbers.map(str), st.sampled_from(["inf", "-inf", "nan", "NaN", "1e400", "-0", "", "x"]),
                  st.text(max_size=6).filter(lambda t: "\n" not in t and "\r" not in t))


@FILES
@given(rows=st.lists(st.lists(cells, min_size=1, max_size=10), max_size=6), tab=st.booleans(),
       junk=st.one_of(st.just(b""), raw))
def test_trace_files(tmp_path: Path, rows: list[list[str]], tab: bool, junk: bytes) -> None:
    sep = "\t" if tab else ","
    path = tmp_path / "trace.txt"
    path.write_bytes("\n".join(sep.join(r) for r in rows).encode("utf-8", "surrogatepass") + junk)
    try:
        jobs = read_trace(path)
    except TraceError as exc:
        assert str(exc).startswith(str(path))
        return
    for job in jobs:
        assert 1 <= job.num_gpus <= MAX_GPUS
        for x in (job.submit_time, job.total_steps, job.duration_s):
            assert x is None or (x >= 0 and math.isfinite(x))


def test_a_spec_built_from_a_file_passes_the_schedulers_checks(tmp_path: Path) -> None:
    path = _write(tmp_path, "job.yaml", {"gpus": 2, "priority": 3, "env": {"A": "1"}, "array": "0-3"})
    sub = build_submission(build_parser().parse_args(["-f", str(path)]), ["python", "t.py"],
                           dict(os.environ), "/tmp")
    for job in sub.jobs:
        validate_spec(job)
    assert len(sub.jobs) == 4


def test_a_file_of_yaml_aliases_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    """A 1 MiB spec of one 500 KiB text and 160,000 `*s` is 80 GB of command: gandiva-submit
    built it until it died by SIGSEGV (3 GB under a 3 GB limit, 20 s). Now a file standing
    for more than MAX_EXPANDED_BYTES is refused at once, naming the aliases; a few aliases are fine."""
    big = "x" * (100 << 10)
    bombs = {
        "command.yaml": f"gpus: 1\ncommand: [&s {big}, " + ", ".join(["*s"] * 2000) + "]\n",
        "env.yaml": f"command: [python, t.py]\nenv:\n  A: &s {big}\n" + "".join(f"  B{i}: *s\n" for i in range(2000)),
        "cycle.yaml": "gpus: 1\ncommand: &a [python, *a]\n",
    }
    for name, text in bombs.items():
        path = tmp_path / name
        path.write_text(text)
        args = build_parser().parse_args(["-f", str(path)])
        try:
            build_submission(args, [], {"PATH": "/bin"}, "/tmp")
            raise AssertionError(f"{name} was accepted")
        except specs.SpecError as exc:
            assert str(exc).startswith(f"{path}: stands for more than 16 MiB once its YAML aliases"), exc
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"grid:\n  a: &v [{big}, {big}]\n" + "".join(f"  b{i}: *v\n" for i in range(200)))
    try:
        specs.load_sweep(sweep)
        raise AssertionError("the sweep was accepted")
    except specs.SpecError as exc:
        assert "once its YAML aliases" in str(exc)
    fine = tmp_path / "fine.yaml"
    fine.write_text("gpus: 1\ncommand: [&p python, t.py]\nenv: {A: &v x, B: *v}\n")
    sub = build_submission(build_parser().parse_args(["-f", str(fine)]), [], {"PATH": "/bin"}, "/tmp")
    assert list(sub.jobs[0].command) == ["python", "t.py"] and sub.jobs[0].env["B"] == "x"
