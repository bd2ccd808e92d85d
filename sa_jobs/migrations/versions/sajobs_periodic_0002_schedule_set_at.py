"""sa_jobs periodic: when a row's schedule was set, so the newest process decides it.

Revision ID: sajobs_periodic_0002
Revises: sajobs_periodic_0001
Create Date: 2026-11-25

``schedule_set_at`` is the start instant of the process whose code set the row's
schedule. A process may replace the schedule only at its own start and only if the row's
schedule was set before that start: during a rolling deploy the most recently started
process's schedule wins once, instead of old and new versions resetting each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_periodic_0002"
down_revision: str | Sequence[str] | None = "sajobs_periodic_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sa_job_periodic",
        sa.Column(
            "schedule_set_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("sa_job_periodic", "schedule_set_at")
