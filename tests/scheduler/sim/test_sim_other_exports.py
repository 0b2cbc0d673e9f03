"""Other clusters' CSV exports, generated: any column order, extra columns, header names and
units, times as seconds, milliseconds, minutes, epoch seconds or ISO dates, quoted fields,
blank, comment and empty rows, a BOM, CRLF, tabs, gzip, rows out of order; and one bad row
(a GPU count of 0, -2, 1.5 or none, a duration of 0 or -5, a repeated id, a short row) named
at its line, or left out alone by --skip-invalid. Every job read is the job written."""

from __future__ import annotations

import gzip
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.sim.trace import TraceError, read_trace, read_trace_as

BASE = 1614592800  # 2021-03-01 10:00:00 UTC
SUBMIT = {"s": "submit_time", "ms": "submit_time_ms", "min": "Submit Time (min)", "epoch": "submitted",
          "iso": "arrival_time", "isoT": "submitTime", "zone": "submit_time", "utc": "submitted", "slash": "submit"}
DURATION = {"s": "run_time", "sec": "Duration (sec)", "min": "duration_min", "ms": "duration_ms",
            "clock": "elapsed", "h": "duration_hours"}
PER = {"min": 60, "h": 3600}


def _submit(kind: str, at: int) -> str:
    if kind in ("s", "ms", "min", "epoch"):
        return str({"s": at, "ms": at * 1000, "min": at // 60, "epoch": BASE + at}[kind])
    when = datetime.fromtimestamp(BASE + at, timezone.utc)
    form = {"iso": "%Y-%m-%d %H:%M:%S", "isoT": "%Y-%m-%dT%H:%M:%S", "zone": "%Y-%m-%dT%H:%M:%S+00:00",
            "utc": "%Y-%m-%d %H:%M:%S UTC", "slash": "%Y/%m/%d %H:%M:%S"}[kind]
    return when.strftime(form)


def _duration(kind: str, d: int) -> str:
    if kind == "clock":
        clock = f"{d % 86400 // 3600:02d}:{d % 3600 // 60:02d}:{d % 60:02d}"
        return f"{d // 86400}-{clock}" if d >= 86400 else clock
    return str(d * 1000 if kind == "ms" else d // PER.get(kind, 1))


@st.composite
def exports(draw: st.DrawFn) -> tuple[bytes, list[tuple[float, int, float, str]], int | None]:
    """(the file's bytes, the jobs it holds as (submit s, GPUs, duration s, model), the line of
    its one bad row or None)."""
    tkind, dkind = draw(st.sampled_from(sorted(SUBMIT))), draw(st.sampled_from(sorted(DURATION)))
    jobs = [(a * (60 if tkind == "min" else 1), g, (d % 8000 + 1) * PER.get(dkind, 1), m) for a, g, d, m in draw(
        st.lists(st.tuples(st.integers(0, 100_000), st.sampled_from([1, 2, 3, 4, 8]), st.integers(1, 200_000),
                           st.sampled_from(["resnet50", "", "vgg 16", "a,b"])), min_size=1, max_size=8))]
    sep = draw(st.sampled_from([",", "\t", ", "]))
    cols = draw(st.permutations(["id", "submit", "gpus", "dur", "model"]
                                + draw(st.lists(st.sampled_from(["queue", "state", "notes"]), unique=True))))
    names = {"id": draw(st.sampled_from(["job_id", "JobID", "id"])), "submit": SUBMIT[tkind],
             "gpus": draw(st.sampled_from(["num_gpus", "gpu_num", "GPUs", "# GPUs"])), "dur": DURATION[dkind],
             "model": "model", "queue": "queue", "state": "state", "notes": "notes"}

    def quoted(text: str) -> str:
        return f'"{text}"' if text and ("," in text or draw(st.booleans())) else text

    def row(i: int, fields: int | None = None, **bad: str) -> str:
        a, g, d, m = jobs[i]
        cell = {"id": f"J{i}", "submit": _submit(tkind, a), "gpus": str(g), "dur": _duration(dkind, d),
                "model": quoted(m), "queue": "q1", "state": "COMPLETED", "notes": quoted("x, y")} | bad
        return sep.join([cell[c] for c in cols][:fields])

    header = sep.join(quoted(names[c]) for c in cols)
    lines = [("# " if draw(st.booleans()) else "") + header] + [row(i) for i in draw(st.permutations(range(len(jobs))))]
    for _ in range(draw(st.integers(0, 3))):  # blank, comment and empty rows anywhere after the header
        lines.insert(draw(st.integers(1, len(lines))), draw(st.sampled_from(["", "  ", "# a note", sep.strip() * 3])))
    bad_line = None
    if (bad := draw(st.sampled_from(["", "gpus=0", "gpus=-2", "gpus=1.5", "gpus=", "dur=0", "dur=-5", "id=J0",
                                     "short"]))):
        role, _, value = bad.partition("=")
        # (a short row is cut by its fields: cutting its text at a separator could split a
        # quoted "a,b" and leave a quote open, which swallows the lines after it)
        text = row(0, 2, id="BAD") if bad == "short" else row(0, **({"id": "BAD", role: value}))
        first = 1 + next(k for k, ln in enumerate(lines[1:]) if ln.strip(" \t,#") and not ln.startswith("#"))
        after = {"id": 1 + next(k for k, ln in enumerate(lines) if "J0" in [c.strip() for c in ln.split(sep)]),
                 "short": first + 1}  # (a header in a comment is matched against the first row's fields)
        at = draw(st.integers(after.get(role, 1), len(lines)))
        lines.insert(at, text)
        bad_line = at + 1
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    data = (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + (eol.join(lines) + eol).encode()
    offset = -BASE if tkind == "epoch" else min(a for a, *_ in jobs) if tkind not in ("s", "ms", "min") else 0
    expected = sorted((float(a - offset), g, float(d), m) for a, g, d, m in jobs)
    return gzip.compress(data, mtime=0) if draw(st.booleans()) else data, expected, bad_line


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(exports())
def test_other_clusters_exports_read_every_job_as_written(tmp_path_factory: pytest.TempPathFactory,
                                                          case: tuple[bytes, list, int | None]) -> None:
    """Session 51 found (a longer run of this, 1,500 examples): a header written as a comment
    (`# GPUs,submit_time,...` or numpy's `# submit_time,...`) was taken for a note when a row
    held a quoted comma, when a note followed it, when a spreadsheet's empty row `,,,` came
    first, or when its rows were tab-separated with a comma in a field: the rows then read in
    the default column order (refused, or replayed wrong)."""
    data, expected, bad_line = case
    path = tmp_path_factory.mktemp("export") / "t.csv"
    path.write_bytes(data)
    if bad_line is None:
        jobs = read_trace(path)
        assert sorted((j.submit_time, j.num_gpus, j.duration_s, j.model) for j in jobs) == expected
        assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
        return
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert raised.value.line == bad_line, str(raised.value)
    skipped: list[TraceError] = []
    jobs, _ = read_trace_as(path, skipped=skipped)
    assert [e.line for e in skipped] == [bad_line]
    assert sorted((j.submit_time, j.num_gpus, j.duration_s, j.model) for j in jobs) == expected


@pytest.mark.parametrize("text", [
    '# GPUs,submit_time,job_id,duration,model\n1,0,J0,60,"a,b"\n',  # a quoted comma in the row
    "# submit_time,duration,num_gpus\n# exported by a notebook\n0,60,1\n",  # a note after it
    "# submit_time,duration,num_gpus\n,,,,,\n0,60,1\n",  # a wider sheet's empty row first
    '# submit_time\tduration\tnum_gpus\tmodel\n0\t60\t1\t"a,b"\n',  # tabs, a comma in a field
])
def test_a_header_in_a_comment_is_found_past_quotes_notes_and_empty_rows(tmp_path: Path, text: str) -> None:
    """Each of these was refused (or read in the default column order) before session 51."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert [(j.submit_time, j.num_gpus, j.duration_s) for j in read_trace(path)] == [(0.0, 1, 60.0)]
