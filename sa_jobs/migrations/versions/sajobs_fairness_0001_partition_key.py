"""sa_jobs fairness: the job's partition key and the index a keyed fetch walks.

Revision ID: sajobs_fairness_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-28

The root of the ``sa_jobs_fairness`` branch (limits by key, fair queues). A job whose
kind declares ``job_args(partition_by=[...])`` gets the text of those args fields in
``partition_key`` when it is inserted; every other job leaves it NULL. The index holds
only available jobs that have a key, so inserts of kinds without one add no entry, and
it is what a keyed fetch walks: the distinct keys of a queue one probe each, then each
key's jobs in fetch order.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_fairness_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_fairness",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    # Collation "C": keys in code point order, the order a worker's cursor compares in.
    op.add_column("sa_job", sa.Column("partition_key", sa.Text(collation="C"), nullable=True))
    op.create_index(
        op.f("sa_job_partition_idx"),
        "sa_job",
        ["queue", "partition_key", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text("state = 'available' AND partition_key IS NOT NULL"),
    )
    op.create_table(
        "sa_job_key_rate_window",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("partition_key", sa.Text(collation="C"), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("keep_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("starts", sa.Integer(), nullable=False),
        sa.CheckConstraint("starts >= 0", name=op.f("sa_job_key_rate_window_starts_check")),
        sa.PrimaryKeyConstraint(
            "scope", "window_start", "partition_key", name=op.f("sa_job_key_rate_window_pkey")
        ),
    )


def downgrade() -> None:
    op.drop_table("sa_job_key_rate_window")
    op.drop_index(op.f("sa_job_partition_idx"), table_name="sa_job")
    op.drop_column("sa_job", "partition_key")
