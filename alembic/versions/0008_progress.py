"""jobs know their total mini-batches (progress and ETA), when their rate was measured,
and the step of their restore point

Revision ID: 0008_progress
Revises: 0007_request_ids
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008_progress"
down_revision = "0007_request_ids"
branch_labels = None
depends_on = None

COLUMNS: tuple[tuple[str, sa.types.TypeEngine, str], ...] = (
    ("total_steps", sa.BigInteger(), "0"),
    ("total_steps_from", sa.String(16), ""),
    ("rate_at", sa.Double(), "0"),
    ("restore_step", sa.BigInteger(), "0"),
)


def upgrade() -> None:
    # ADD COLUMN in place (batch mode adds columns without copying the table on SQLite).
    with op.batch_alter_table("jobs") as batch_op:
        for name, kind, default in COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=False, server_default=default))


def downgrade() -> None:
    for name, _, _ in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":
            # DROP COLUMN in place (SQLite 3.35+), not batch mode's copy of the table (which
            # would cascade to every job's placements, profiles and history).
            op.execute(sa.text(f"ALTER TABLE jobs DROP COLUMN {name}"))
        else:
            op.drop_column("jobs", name)
