"""`gandiva sim --plot`: what the PNGs show, read back from their pixels."""

from __future__ import annotations

from pathlib import Path

import pytest

from gandiva_cli.main import main


def _rows_drawn_in(png: Path, rgb: tuple[int, int, int]) -> int:
    """How many pixel rows of ``png`` hold the colour ``rgb`` (a line's): a vertical line
    spans hundreds, a legend's sample line a few."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[:, :, :3] * 255
    near = (abs(image - rgb) < 40).all(axis=2)
    return int(near.any(axis=1).sum())


@pytest.mark.parametrize("trace_text", ["submit_time,num_gpus,duration\n0,1,60\n",
                                        "submit_time,num_gpus,duration\n0,1,60\n0,64,60\n"])
def test_a_cdf_of_one_finished_job_is_drawn(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           trace_text: str) -> None:
    """One finished job (a one-job trace, or the only job that fits): its CDFs were a line
    through one point, so the plots showed the legend and nothing else (y axis 0.96-1.04).
    Now a step from 0 to 1 at its time, on a 0-1 axis."""
    trace = tmp_path / "one.csv"
    trace.write_text(trace_text)
    assert main(["sim", "--no-progress", "--trace", str(trace), "--cluster", "1x1", "--policy", "fifo",
                 "--plot", str(tmp_path / "plots")]) == 0
    capsys.readouterr()
    for name in ("jct_cdf.png", "first_n_cdf.png"):
        rows = _rows_drawn_in(tmp_path / "plots" / name, (0x1F, 0x77, 0xB4))  # matplotlib's first line colour
        assert rows > 100, (name, rows)
