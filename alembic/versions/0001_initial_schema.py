"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("server", sa.String(length=128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "multi_jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_multi_jobs")),
    )
    op.create_table(
        "servers",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("address", sa.String(length=256), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("ramdisk", sa.Text(), nullable=False),
        sa.Column("shared_root", sa.Text(), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("registered_at", sa.Double(), nullable=False),
        sa.Column("last_heartbeat", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_servers")),
    )
    op.create_table(
        "gpus",
        sa.Column("server_name", sa.String(length=128), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("memory_total", sa.BigInteger(), nullable=False),
        sa.Column("memory_used", sa.BigInteger(), nullable=False),
        sa.Column("utilization", sa.Double(), nullable=False),
        sa.Column("sampled_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["server_name"],
            ["servers.name"],
            name=op.f("fk_gpus_server_name_servers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("server_name", "index", name=op.f("pk_gpus")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("grow_shrink", sa.Boolean(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("multi_job_id", sa.String(length=32), nullable=True),
        sa.Column("array_index", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("incarnation", sa.String(length=32), nullable=False),
        sa.Column("steps", sa.BigInteger(), nullable=False),
        sa.Column("rate", sa.Double(), nullable=False),
        sa.Column("last_step_s", sa.Double(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("migratable", sa.Boolean(), nullable=False),
        sa.Column("held", sa.Boolean(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("state_changed_at", sa.Double(), nullable=False),
        sa.Column("finished_at", sa.Double(), nullable=False),
        sa.Column("attained_service_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["multi_job_id"],
            ["multi_jobs.id"],
            name=op.f("fk_jobs_multi_job_id_multi_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_multi_job_id"), ["multi_job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)

    op.create_table(
        "job_profiles",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("memory_max", sa.BigInteger(), nullable=False),
        sa.Column("memory_min", sa.BigInteger(), nullable=False),
        sa.Column("utilization", sa.Double(), nullable=False),
        sa.Column("step_time_s", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_profiles_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_profiles")),
    )
    op.create_table(
        "placements",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("server_name", sa.String(length=128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_placements_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["server_name"],
            ["servers.name"],
            name=op.f("fk_placements_server_name_servers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "server_name", "gpu_index", name=op.f("pk_placements")),
    )
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.create_index("ix_placements_server", ["server_name", "gpu_index"], unique=False)

    op.create_table(
        "transitions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=False),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_transitions_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
    )
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_transitions_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_transitions_job_id"))

    op.drop_table("transitions")
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.drop_index("ix_placements_server")

    op.drop_table("placements")
    op.drop_table("job_profiles")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_state"))
        batch_op.drop_index(batch_op.f("ix_jobs_multi_job_id"))

    op.drop_table("jobs")
    op.drop_table("gpus")
    op.drop_table("servers")
    op.drop_table("multi_jobs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_job_id"))

    op.drop_table("events")
