"""sa_jobs core: run_count, the counter that fences completions.

Revision ID: sajobs_core_0004
Revises: sajobs_core_0003
Create Date: 2026-11-24

A run of a job used to be identified by ``(id, attempt)``, which forced ``attempt`` to
only ever go up — so a snooze raised ``max_attempts`` instead of giving the attempt back
as River does. ``run_count`` counts the times a worker started the job and never goes
down; completions are fenced on it, and ``attempt`` means what River's means. Jobs
running during the upgrade get ``run_count = attempt``, matching what their workers
hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_core_0004"
down_revision: str | Sequence[str] | None = "sajobs_core_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sa_job",
        sa.Column("run_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.execute("UPDATE sa_job SET run_count = attempt WHERE state = 'running'")


def downgrade() -> None:
    op.drop_column("sa_job", "run_count")
