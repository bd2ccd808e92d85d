"""sa_jobs core: scheduled_at and created_at stay within what Python can read back.

Revision ID: sajobs_core_0003
Revises: sajobs_core_0002
Create Date: 2026-11-24

PostgreSQL stores instants from 4713 BC to 294276 AD; Python's datetime reads years 1 to
9999. A job whose ``scheduled_at`` or ``created_at`` lay outside the narrower range could
be inserted (by raw SQL, or by an older sa_jobs) but not fetched: loading it failed every
fetch of its queue. The insert paths refuse such values now, and these CHECKs make every
other path refuse them too (the fetch sets ``attempted_at`` itself, and a job that can be
fetched has no ``finalized_at``). Rows already out of range (which no worker could have
run) are brought to the nearest end of the range first; each constraint is added
``NOT VALID`` and validated in a second step, which does not block writes while it scans
the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "sajobs_core_0003"
down_revision: str | Sequence[str] | None = "sajobs_core_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EARLIEST = "'0001-01-02 00:00:00+00'"
LATEST = "'9999-12-30 00:00:00+00'"


COLUMNS = ("scheduled_at", "created_at")


def upgrade() -> None:
    for column in COLUMNS:
        op.execute(
            f"UPDATE sa_job SET {column} = greatest(least({column}, {LATEST}), {EARLIEST}) "
            f"WHERE {column} < {EARLIEST} OR {column} > {LATEST}"
        )
        op.execute(
            f"ALTER TABLE sa_job ADD CONSTRAINT sa_job_{column}_range_check "
            f"CHECK ({column} BETWEEN {EARLIEST} AND {LATEST}) NOT VALID"
        )
        op.execute(f"ALTER TABLE sa_job VALIDATE CONSTRAINT sa_job_{column}_range_check")


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_constraint(op.f(f"sa_job_{column}_range_check"), "sa_job", type_="check")
