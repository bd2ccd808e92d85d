"""sa_jobs periodic: the durable schedule of each periodic job.

Revision ID: sajobs_periodic_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-23

The root of the ``sa_jobs_periodic`` branch: one row per periodic job name, holding
its next fire instant (moved forward by compare-and-set in the transaction that
inserts the instant's job), its last fire, a pending ``run_now`` request, and when a
worker last had it in its code (for retirement).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_periodic_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_periodic",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.create_table(
        "sa_job_periodic",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("schedule", sa.Text(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("last_enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_now_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("sa_job_periodic_pkey")),
    )


def downgrade() -> None:
    op.drop_table("sa_job_periodic")
