"""submissions remember the client's request id, so that a retried one creates nothing

Revision ID: 0007_request_ids
Revises: 0006_host_memory
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007_request_ids"
down_revision = "0006_host_memory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A unique index, not a constraint: on SQLite a constraint would rebuild the table, and
    # dropping the old `jobs` would cascade to every job's placements, profiles and history.
    for table in ("jobs", "multi_jobs"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(sa.Column("request_key", sa.String(300), nullable=True))
        op.create_index(f"ix_{table}_request_key", table, ["request_key"], unique=True)


def downgrade() -> None:
    for table in ("multi_jobs", "jobs"):
        op.drop_index(f"ix_{table}_request_key", table_name=table)
        if op.get_bind().dialect.name == "sqlite":
            # DROP COLUMN in place (SQLite 3.35+), not batch mode's copy of the table (above).
            op.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN request_key"))
        else:
            op.drop_column(table, "request_key")
