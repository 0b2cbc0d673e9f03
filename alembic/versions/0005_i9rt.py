"""jobs remember why grow-shrink was turned off for them (one tower per device)

Revision ID: 0005_i9rt
Revises: 0004_runtime
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005_i9rt"
down_revision = "0004_runtime"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("grow_shrink_note", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("grow_shrink_note")
