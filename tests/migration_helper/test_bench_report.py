"""The migration benchmark's summaries and outputs, and its input checks (the
benchmark itself runs real TensorFlow and is run by hand: gandiva bench migration)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from migration_helper.bench import PHASES, BenchConfig, Measurement
from migration_helper.bench_report import speedups, summarize, table_rows, write_chart, write_csv


def m(path: str, replicas: int, total: float, repeat: int = 0) -> Measurement:
    phases = {p: 0.0 for p in PHASES}
    phases["restore"] = total / 2
    return Measurement("resnet50", replicas, path, repeat, total, phases, 5.0 if path == "fast" else 0.0, 100)


RESULTS = [m("fast", 1, t, i) for i, t in enumerate((0.6, 0.8, 2.0))] + \
          [m("naive", 1, t, i) for i, t in enumerate((6.0, 7.0, 9.0))] + [m("fast", 8, 0.9), m("naive", 8, 30.0)]


def test_summaries_are_medians_with_their_spread_and_speedups() -> None:
    s = {(x.replicas, x.path): x for x in summarize(RESULTS)}
    assert (s[(1, "fast")].median_s, s[(1, "fast")].min_s, s[(1, "fast")].max_s) == (0.8, 0.6, 2.0)
    assert s[(1, "fast")].phases["restore"] == 0.4 and s[(1, "fast")].n == 3
    ups = speedups(list(s.values()))
    assert ups[("resnet50", 1)] == pytest.approx(7.0 / 0.8) and ups[("resnet50", 8)] == pytest.approx(30 / 0.9)
    fast_row = next(r for r in table_rows(list(s.values())) if r[1] == "1" and r[2] == "fast")
    assert fast_row[3] == "0.80" and fast_row[4] == "0.60-2.00" and fast_row[-1] == "8.8x"


def test_csv_has_one_row_per_migration_and_the_chart_is_written(tmp_path: Path) -> None:
    write_csv(RESULTS, tmp_path / "m.csv")
    rows = list(csv.DictReader((tmp_path / "m.csv").read_text().splitlines()))
    assert len(rows) == len(RESULTS) and set(PHASES) <= set(rows[0]) and rows[0]["total_s"] == "0.6000"
    write_chart(summarize(RESULTS), tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("kw", "message"), [
    ({"models": ("alexnet",)}, "--models: unknown alexnet"),
    ({"replicas": (3,)}, "--replicas"),
    ({"repeats": 0}, "--repeats"),
    ({"models": ()}, "--models: none given; choose from mlp"),  # `--models ""` was blamed on --replicas
])
def test_bad_settings_name_the_flag(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(**kw)  # type: ignore[arg-type]


def test_cli_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gandiva_cli.main", "bench", "migration", "--replicas", "1,x",
                          "--out", str(tmp_path / "o")], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--replicas '1,x': expected comma-separated integers" in out.stderr
