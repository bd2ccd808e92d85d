"""sa_jobs workflow: an index of the steps waiting for their dependencies, by queue.

Revision ID: sajobs_workflow_0002
Revises: sajobs_workflow_0001
Create Date: 2026-11-28

``sa_jobs.stats()`` and the Prometheus gauges count the pending workflow steps of each
queue: through this partial index, a capped count never reads a step that is not
pending, so the figure costs the same beside a million finished steps. Plain jobs are
not in it, nor are pending jobs of a sequence (``sa_job_sequence_pending_idx`` has
those). A database without this revision counts no pending steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_workflow_0002"
down_revision: str | Sequence[str] | None = "sajobs_workflow_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        op.f("sa_job_workflow_pending_idx"),
        "sa_job",
        ["queue"],
        postgresql_where=sa.text("state = 'pending' AND workflow_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(op.f("sa_job_workflow_pending_idx"), table_name="sa_job")
