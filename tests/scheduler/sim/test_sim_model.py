"""The mechanism model: built-in defaults from the brief, and Gavel's measured table."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.sim.model import DEFAULT_SPREAD_FACTOR, Costs, MechanismModel

TABLE = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / "gavel" / "simulation_throughputs.json"


def test_defaults_use_our_measured_costs_and_the_brief_packing_gains() -> None:
    model = MechanismModel.default()
    assert model.costs == Costs(suspend_resume_s=0.02, migrate_s=1.0, restart_s=6.0)
    assert model.packed("vae", "vae", 1) == 1.0  # +412%: both run at full speed (capped)
    assert model.packed("resnet50", "resnet50", 1) == pytest.approx(0.435)  # -13%
    assert model.packed("resnet50", "vae", 1) == pytest.approx((0.435 + 1.0) / 2)
    assert model.spread("resnet50", 8) == DEFAULT_SPREAD_FACTOR
    assert model.alone_rate("resnet50", 2) == pytest.approx(2 * 4.0 * 0.9)


def test_unknown_table_file_or_gpu_type_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the Gavel throughput table"):
        MechanismModel.from_gavel(tmp_path / "missing.json")
    bad = tmp_path / "t.json"
    bad.write_text('{"k80": {}}')
    with pytest.raises(ValueError, match="no GPU type 'v100'; it has k80"):
        MechanismModel.from_gavel(bad)


@pytest.mark.skipif(not TABLE.is_file(), reason=f"Gavel throughput table not present at {TABLE.resolve()}")
def test_gavel_table_gives_measured_rates_pairs_and_spread() -> None:
    model = MechanismModel.from_gavel(TABLE)
    r8 = model.alone_rate("ResNet-50 (batch size 64)", 8)
    assert model.alone_rate("ResNet-50 (batch size 64)", 16) == pytest.approx(2 * r8)  # extrapolated
    assert model.packed("ResNet-50 (batch size 128)", "ResNet-50 (batch size 128)", 1) == 0.0  # OOM
    assert 0 < model.packed("LM (batch size 20)", "A3C", 1) <= 1.5
    assert 0 < model.spread("ResNet-50 (batch size 64)", 4) <= 1.0
    assert model.knows("A3C") and not model.knows("resnet50")
