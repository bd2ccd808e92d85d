"""sa_jobs job_key: a keyed job counts its replacements (Graphile's ``revision``).

Revision ID: sajobs_job_key_0002
Revises: sajobs_job_key_0001
Create Date: 2026-11-24

0 when the job is created, one more each time an add with its key updates it in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_job_key_0002"
down_revision: str | Sequence[str] | None = "sajobs_job_key_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sa_job",
        sa.Column("revision", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("sa_job", "revision")
