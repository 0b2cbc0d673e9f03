"""jobs remember whether their processes are under the runtime (suspendable) and why not

Revision ID: 0004_runtime
Revises: 0003_auth_tokens
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004_runtime"
down_revision = "0003_auth_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("suspendable", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("control_note", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("control_note")
        batch_op.drop_column("suspendable")
