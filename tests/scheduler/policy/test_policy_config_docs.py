"""docs/policy.md's Configuration section names every PolicyConfig field with its default:
the live scheduler's --policy-option help sends users there for the knobs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from scheduler.policy import PolicyConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "policy.md"


def test_every_policy_config_field_is_in_the_configuration_section() -> None:
    text = DOC.read_text()
    section = text[text.index("## Configuration (`PolicyConfig`)"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    section = section.replace("`enable_packing/migration/grow_shrink`",
                              "`enable_packing` `enable_migration` `enable_grow_shrink`")
    missing = [f.name for f in dataclasses.fields(PolicyConfig) if f"`{f.name}`" not in section]
    assert not missing, f"docs/policy.md's Configuration (`PolicyConfig`) does not name {missing}"
