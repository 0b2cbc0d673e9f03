"""each GPU a job holds, kept with when it was held (gpu_holds), for the per-GPU history

Revision ID: 0010_gpu_holds
Revises: 0009_cordon
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0010_gpu_holds"
down_revision = "0009_cordon"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_holds",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("server_name", sa.String(length=128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("start_at", sa.Double(), nullable=False),
        sa.Column("end_at", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_gpu_holds_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_holds")),
    )
    op.create_index("ix_gpu_holds_job_id", "gpu_holds", ["job_id"])
    op.create_index("ix_gpu_holds_end_at", "gpu_holds", ["end_at"])
    op.create_index("ix_gpu_holds_gpu", "gpu_holds", ["server_name", "gpu_index", "end_at"])
    # The GPUs held now, from when their job was last placed (from the queue, or a move's
    # arrival), so that what runs at the upgrade has a history from then on; nothing earlier
    # is known (the placements table kept only the present).
    op.execute(sa.text(
        "INSERT INTO gpu_holds (job_id, server_name, gpu_index, start_at, end_at) "
        "SELECT p.job_id, p.server_name, p.gpu_index, COALESCE((SELECT MAX(t.at) FROM transitions t "
        "WHERE t.job_id = p.job_id AND t.to_state = 'RUNNING' AND t.from_state IN ('QUEUED', 'MIGRATING')), "
        "j.state_changed_at), NULL FROM placements p JOIN jobs j ON j.id = p.job_id"))


def downgrade() -> None:
    op.drop_index("ix_gpu_holds_gpu", table_name="gpu_holds")
    op.drop_index("ix_gpu_holds_end_at", table_name="gpu_holds")
    op.drop_index("ix_gpu_holds_job_id", table_name="gpu_holds")
    op.drop_table("gpu_holds")
