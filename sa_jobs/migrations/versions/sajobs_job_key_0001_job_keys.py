"""sa_jobs job_key: Graphile Worker's job keys.

Revision ID: sajobs_job_key_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-22

The root of the ``sa_jobs_job_key`` branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_job_key_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_job_key",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.add_column("sa_job", sa.Column("job_key", sa.Text(), nullable=True))
    op.create_index(
        op.f("sa_job_job_key_idx"),
        "sa_job",
        ["job_key"],
        unique=True,
        postgresql_where=sa.text("job_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(op.f("sa_job_job_key_idx"), table_name="sa_job")
    op.drop_column("sa_job", "job_key")
