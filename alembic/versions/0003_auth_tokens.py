"""per-user, operator and helper tokens (only their hashes)

Revision ID: 0003_auth_tokens
Revises: 0002_fencing_migrations
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003_auth_tokens"
down_revision = "0002_fencing_migrations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "auth_tokens",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_auth_tokens")),
    )


def downgrade() -> None:
    op.drop_table("auth_tokens")
