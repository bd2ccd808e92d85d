"""sa_jobs unique: an index of the unique keys held under a TTL, by expiry.

Revision ID: sajobs_unique_0002
Revises: sajobs_unique_0001
Create Date: 2026-11-23

Every unique insert first releases the keys it is about to take whose TTL has passed.
With this index it first asks whether any TTL lock has expired at all, one index lookup,
and skips the step when none has: the common case, since an expired lock is released by
the next insert of its key. A database without this revision works the same, only
slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_unique_0002"
down_revision: str | Sequence[str] | None = "sajobs_unique_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        op.f("sa_job_unique_ttl_idx"),
        "sa_job",
        ["unique_expires_at"],
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND unique_states IS NOT NULL "
            "AND sa_job_state_in_bitmask(unique_states, state) "
            "AND unique_expires_at IS NOT NULL"
        ),
    )


def downgrade() -> None:
    op.drop_index(op.f("sa_job_unique_ttl_idx"), table_name="sa_job")
