"""sa_jobs core: each worker's stuck handler threads, in its heartbeat row.

Revision ID: sajobs_core_0006
Revises: sajobs_core_0005
Create Date: 2026-11-28

A sync handler that ignores its timeout keeps its thread for good; past the worker's
``stuck_thread_limit`` such threads keep their slots too, and the worker fetches less and
less. The heartbeat now says how many threads are stuck and the limit, so that
``sa-jobs health``, the Prometheus gauges and the dashboard can name the worker to
restart (``docs/operations.md``). Both columns have defaults: a worker of an earlier
release keeps writing its heartbeat without them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_core_0006"
down_revision: str | Sequence[str] | None = "sajobs_core_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sa_job_worker",
        sa.Column("stuck_threads", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("sa_job_worker", sa.Column("stuck_thread_limit", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("sa_job_worker", "stuck_thread_limit")
    op.drop_column("sa_job_worker", "stuck_threads")
