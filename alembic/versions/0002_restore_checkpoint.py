"""jobs remember a checkpoint to restore at their next launch

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("restore_checkpoint", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("restore_server", sa.String(length=128), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("restore_server")
        batch_op.drop_column("restore_checkpoint")
