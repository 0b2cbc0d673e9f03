"""each server's time up with its GPU count (server_spans), for the cluster's capacity over a period

Revision ID: 0011_server_spans
Revises: 0010_gpu_holds
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0011_server_spans"
down_revision = "0010_gpu_holds"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_spans",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("server_name", sa.String(length=128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start_at", sa.Double(), nullable=False),
        sa.Column("end_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_spans")),
    )
    op.create_index("ix_server_spans_end_at", "server_spans", ["end_at"])
    # The servers up now, from their last heartbeat (about the upgrade's time): nothing of
    # their time before is known (the servers table kept only the present).
    op.execute(sa.text("INSERT INTO server_spans (server_name, gpus, start_at, end_at) "
                       "SELECT name, num_gpus, last_heartbeat, NULL FROM servers WHERE up"))


def downgrade() -> None:
    op.drop_index("ix_server_spans_end_at", table_name="server_spans")
    op.drop_table("server_spans")
