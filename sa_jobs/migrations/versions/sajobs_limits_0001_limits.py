"""sa_jobs limits: start counts per time window.

Revision ID: sajobs_limits_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-25

The root of the ``sa_jobs_limits`` branch (``sa_jobs.ConcurrencyLimit``,
``sa_jobs.RateLimit``). A rate limit sums the rows of ``sa_job_rate_window`` whose window
ends inside its period; a concurrency limit counts running jobs through the core's
``sa_job_running_idx`` (no index of this branch's own: it would cost every started job an
entry, limits or not). Read and written only by fetches of limited queues, under the
scope's advisory lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_limits_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_limits",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.create_table(
        "sa_job_rate_window",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("keep_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("starts", sa.Integer(), nullable=False),
        sa.CheckConstraint("starts >= 0", name=op.f("sa_job_rate_window_starts_check")),
        sa.PrimaryKeyConstraint("scope", "window_start", name=op.f("sa_job_rate_window_pkey")),
    )


def downgrade() -> None:
    op.drop_table("sa_job_rate_window")
