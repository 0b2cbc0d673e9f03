"""fencing and durable migrations: a queued job's fence, and one row per migration in progress

Revision ID: 0002_fencing_migrations
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0002_fencing_migrations"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("fenced_until", sa.Double(), nullable=False, server_default="0"))
    op.create_table(
        "migrations",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("was_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source_server", sa.String(length=128), nullable=False),
        sa.Column("source_incarnation", sa.String(length=32), nullable=False),
        sa.Column("dest_server", sa.String(length=128), nullable=False),
        sa.Column("dest_gpus", sa.JSON(), nullable=False),
        sa.Column("dest_incarnation", sa.String(length=32), nullable=False),
        sa.Column("fallback_incarnation", sa.String(length=32), nullable=False),
        sa.Column("checkpoint_path", sa.Text(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_migrations_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_migrations")),
    )


def downgrade() -> None:
    op.drop_table("migrations")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("fenced_until")
