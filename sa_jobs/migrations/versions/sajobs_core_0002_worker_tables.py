"""sa_jobs core: worker heartbeats and maintenance leadership.

Revision ID: sajobs_core_0002
Revises: sajobs_core_0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "sajobs_core_0002"
down_revision: str | Sequence[str] | None = "sajobs_core_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sa_job_worker",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.BigInteger(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "heartbeat_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("sa_job_worker_pkey")),
    )
    op.create_table(
        "sa_job_leader",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("leader_id", sa.Text(), nullable=False),
        sa.Column("elected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("sa_job_leader_pkey")),
    )


def downgrade() -> None:
    op.drop_table("sa_job_leader")
    op.drop_table("sa_job_worker")
