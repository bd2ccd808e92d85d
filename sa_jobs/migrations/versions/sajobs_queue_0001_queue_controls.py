"""sa_jobs queue: queue controls (pause and resume).

Revision ID: sajobs_queue_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-30

The root of the ``sa_jobs_queue`` branch: one row per queue that was ever paused. The
fetch statement skips a queue whose row has ``paused_at`` set.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_queue_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_queue",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.create_table(
        "sa_job_queue",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "char_length(name) BETWEEN 1 AND 128", name=op.f("sa_job_queue_name_length_check")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("sa_job_queue_pkey")),
    )


def downgrade() -> None:
    op.drop_table("sa_job_queue")
