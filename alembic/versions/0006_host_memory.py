"""servers report their host memory, jobs their measured resident set

Revision ID: 0006_host_memory
Revises: 0005_i9rt
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006_host_memory"
down_revision = "0005_i9rt"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("servers") as batch_op:
        batch_op.add_column(sa.Column("host_memory_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("job_profiles") as batch_op:
        batch_op.add_column(sa.Column("host_memory_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("host_memory_at", sa.Double(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job_profiles") as batch_op:
        batch_op.drop_column("host_memory_at")
        batch_op.drop_column("host_memory_bytes")
    if op.get_bind().dialect.name == "sqlite":
        # DROP COLUMN in place (SQLite 3.35+): batch mode's copy of the servers table
        # cascaded to every server's GPUs and placements (the copy's DROP of the old table).
        op.execute(sa.text("ALTER TABLE servers DROP COLUMN host_memory_bytes"))
    else:
        op.drop_column("servers", "host_memory_bytes")
