"""sa_jobs unique: unique key columns, the state bitmask function, the unique index.

Revision ID: sajobs_unique_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-22

The root of the ``sa_jobs_unique`` branch.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "sajobs_unique_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_unique",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"

# Bit i of unique_states stands for the i-th state of sa_job_state, in declaration order.
STATE_IN_BITMASK_FUNCTION = """
CREATE OR REPLACE FUNCTION sa_job_state_in_bitmask(bitmask bit(8), state sa_job_state)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT get_bit(bitmask, CASE state
        WHEN 'available' THEN 0 WHEN 'scheduled' THEN 1 WHEN 'pending' THEN 2
        WHEN 'running' THEN 3 WHEN 'retryable' THEN 4 WHEN 'completed' THEN 5
        WHEN 'cancelled' THEN 6 WHEN 'discarded' THEN 7 END) = 1
$$
"""


def upgrade() -> None:
    op.add_column("sa_job", sa.Column("unique_key", sa.LargeBinary(), nullable=True))
    op.add_column("sa_job", sa.Column("unique_states", postgresql.BIT(8), nullable=True))
    op.add_column(
        "sa_job", sa.Column("unique_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "sa_job",
        sa.Column(
            "unique_until_start", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )
    op.execute(STATE_IN_BITMASK_FUNCTION)
    op.create_index(
        op.f("sa_job_unique_idx"),
        "sa_job",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND unique_states IS NOT NULL "
            "AND sa_job_state_in_bitmask(unique_states, state)"
        ),
    )


def downgrade() -> None:
    op.drop_index(op.f("sa_job_unique_idx"), table_name="sa_job")
    op.execute("DROP FUNCTION sa_job_state_in_bitmask(bit(8), sa_job_state)")
    op.drop_column("sa_job", "unique_until_start")
    op.drop_column("sa_job", "unique_expires_at")
    op.drop_column("sa_job", "unique_states")
    op.drop_column("sa_job", "unique_key")
