"""Bad input to `gandiva sim`: one line naming what is wrong (exit 2)."""

from __future__ import annotations

import pytest

from scheduler.sim.engine import make_cluster


@pytest.mark.parametrize("spec", [" 2x3", "+2x3", "2_0x4", "\u0662x4", "2x3x4", "2x", "x4", "2*4"])
def test_a_cluster_is_ascii_digits_x_ascii_digits(spec: str) -> None:
    """int() took ' 2', '+2', '2_0' (20) and other scripts' digits."""
    with pytest.raises(ValueError, match="is not SERVERSxGPUS, e.g. 25x4"):
        make_cluster(spec)


def test_servers_of_any_gpu_count_are_a_cluster() -> None:
    """2x3 is valid: a server has the GPUs its helper reports (live too); only a job's
    request must be a power of two."""
    assert [s.num_gpus for s in make_cluster("2x3")] == [3, 3] and len(make_cluster("3X8")) == 3
