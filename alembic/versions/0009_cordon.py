"""servers can be cordoned and drained by an operator (gandiva cordon / drain)

Revision ID: 0009_cordon
Revises: 0008_progress
Create Date: 2026-12-06
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from alembic import op

revision = "0009_cordon"
down_revision = "0008_progress"
branch_labels = None
depends_on = None

COLUMNS: tuple[tuple[str, sa.types.TypeEngine, Any], ...] = (
    ("cordoned", sa.Boolean(), sa.false()),
    ("cordoned_at", sa.Double(), "0"),
    ("cordon_reason", sa.Text(), ""),
    ("draining", sa.Boolean(), sa.false()),
)


def upgrade() -> None:
    # Plain ADD COLUMN on both dialects: batch mode copied the servers table on SQLite here
    # (a Boolean column), and the copy's DROP cascaded to every server's GPUs and placements.
    for name, kind, default in COLUMNS:
        op.add_column("servers", sa.Column(name, kind, nullable=False, server_default=default))


def downgrade() -> None:
    for name, _, _ in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":
            # DROP COLUMN in place (SQLite 3.35+), not batch mode's copy of the servers table
            # (which would cascade to every server's GPUs and placements).
            op.execute(sa.text(f"ALTER TABLE servers DROP COLUMN {name}"))
        else:
            op.drop_column("servers", name)
